/* attention family, AMX (bfloat16): flash-attention forward with Q K^T and P V on BF16 tiles.
 *
 * Packed per head (bf16 bit patterns, zero padded): keys as VNNI B tiles for Q K^T,
 * [S/16][E/32][16 feature pairs][16 keys][2], values as VNNI B tiles for P V,
 * [S/32][Ev/16][16 key pairs][16 columns][2]. A task takes BQ queries (bf16, rows E_pad apart)
 * and, per key block of 64 keys:
 *   scores  per tile of 16 query rows, tmm0-3 (16 x 64 fp32) = sum over 32-feature steps of
 *           the query tile (tmm4) times key tiles, stored for the vector units;
 *   softmax per row tile in AVX-512 (softmax16: scale folded into the exp's FMA, lazy max);
 *   P V     tmm0-3 (16 x 64 fp32 per group of 4 column tiles) += P_hi x V + P_lo x V into the
 *           fp32 output rows, for 4 column tiles run in stages between the rows of the next
 *           row tile's softmax (pv_stage), so tile and vector units overlap.
 * P = P_hi + P_lo with both bf16 (P_hi = P truncated, P_lo = bf16(P - P_hi)): two tile
 * products keep P to ~16 significant bits, so the output matches the reference's single
 * rounding (measured worst error 0.47 of the spec tolerance over 400 spec samples and the
 * benchmark shapes); P as one bf16 (as torch does) measured 8.5x the tolerance.
 * The output accumulates in fp32 (rows rescaled when the online softmax's max moves) and is
 * rounded once. Tiles: 8 tiles of 16 rows x 64 bytes, configured per thread
 * (rc_attn_impl.enter), released after the thread's last task.
 */
#ifndef RC_LEVEL
#define RC_LEVEL amx
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_attn_avx512.h"
#include "rc_attn_decode.h"
#include "rc_attn_exact.h"
#include "rc_transpose.h"

#define BQ 64 /* queries per task: four row tiles */
#define TILE 512 /* bf16 elements per 16 x 64-byte tile */
/* Query rows up to which a call takes the decode path (rc_attn_decode.h). One thread, B1 H16
 * S512 D64 bf16, us per call, decode path: L1 79, L2 123 (~44 per row); tiles: L3 193, L4 192. */
#define DECODE_L 3

typedef struct {
    int64_t s_pad, e_pad, ldv, nks, ndv; /* keys, features (x32), value columns (x16) */
} dims;

static dims dims_of(const rc_attn *a)
{
    dims d = {rc_round_up(a->S, RC_ATTN_BS), rc_round_up(a->E, 32), rc_round_up(a->Ev, 16), 0, 0};
    d.nks = d.e_pad / 32;
    d.ndv = d.ldv / 16;
    return d;
}

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes. A constant in memory: gcc's _tile_loadconfig
 * tells the compiler it reads only a pointer's worth of its operand, so a config built on the
 * stack can lose its stores (ldtilecfg then faults on garbage). */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) TILE_CONFIG = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static void tiles_on(void)
{
    _tile_loadconfig(&TILE_CONFIG);
}

static void tiles_off(void)
{
    _tile_release();
}

/* Keys of batch b as VNNI B tiles: in the tile of keys [16 kt, +16) and features [32 t, +32),
 * dword (p, n) holds features 2p, 2p + 1 of key n: a 16 x 16 dword transpose of the key rows
 * (rc_transpose16; it replaced a scatter per key row, ~6% of a B1 H12 L512 call). */
static void pack_k(const rc_attn *a, int64_t b, const dims *dm, uint16_t *kb)
{
    const uint16_t *k = a->k;
    const int64_t ok = a->offs[a->nb + b], ks = a->st[2], kf = a->st[3];
    for (int64_t j0 = 0; j0 < dm->s_pad; j0 += 16) {
        for (int64_t t = 0; t < dm->nks; t++) {
            uint16_t *tile = kb + ((j0 / 16) * dm->nks + t) * TILE;
            const int64_t d0 = 32 * t;
            if (kf == 1) {
                rc_transpose16((const char *)(k + ok + j0 * ks + d0), ks * 2,
                               rc_min64(16, a->S - j0), rc_tail32(a->E - d0), (char *)tile, 64,
                               16);
                continue;
            }
            for (int64_t j = j0; j < j0 + 16; j++)
                for (int64_t d = d0; d < d0 + 32; d++)
                    tile[((d % 32) / 2) * 32 + (j % 16) * 2 + d % 2] =
                        j < a->S && d < a->E ? k[ok + j * ks + d * kf] : 0;
        }
    }
}

/* Values of batch b as VNNI B tiles: in the tile of keys [32 t, +32) and columns [16 c, +16),
 * dword (p, n) holds column n of keys 2p (low half) and 2p + 1 (high half). */
static void pack_v(const rc_attn *a, int64_t b, const dims *dm, uint16_t *vb)
{
    const uint16_t *v = a->v;
    const int64_t ov = a->offs[2 * a->nb + b], vs = a->st[4], vf = a->st[5];
    for (int64_t j = 0; j < dm->s_pad; j += 2) {
        for (int64_t c = 0; c < dm->ldv; c += 16) {
            uint16_t *dst = vb + ((j / 32) * dm->ndv + c / 16) * TILE + ((j % 32) / 2) * 32;
            if (vf == 1) {
                const __mmask16 mk = rc_lanes(a->Ev - c);
                const __m256i lo = j < a->S ? _mm256_maskz_loadu_epi16(mk, v + ov + j * vs + c)
                                            : _mm256_setzero_si256();
                const __m256i hi = j + 1 < a->S
                                       ? _mm256_maskz_loadu_epi16(mk, v + ov + (j + 1) * vs + c)
                                       : _mm256_setzero_si256();
                _mm512_storeu_si512(dst, _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                                         _mm512_slli_epi32(
                                                             _mm512_cvtepu16_epi32(hi), 16)));
                continue;
            }
            for (int64_t n = 0; n < 16; n++)
                for (int64_t e = 0; e < 2; e++)
                    dst[n * 2 + e] = j + e < a->S && c + n < a->Ev
                                         ? v[ov + (j + e) * vs + (c + n) * vf]
                                         : 0;
        }
    }
}

static void pack(const rc_attn *a, int64_t b, void *packed)
{
    const dims dm = dims_of(a);
    pack_k(a, b, &dm, packed);
    pack_v(a, b, &dm, (uint16_t *)packed + dm.s_pad * dm.e_pad);
}

/* scratch of a task: per row tile t (4), its scores and its P as hi + lo */
typedef struct {
    uint16_t *q;       /* (BQ, e_pad) bf16 */
    float *o, *s;      /* (BQ, ldv) output accumulators, (BQ, 64) scores */
    uint16_t *hi, *lo; /* (BQ, 64) bf16 each */
    float *m, *l;      /* (BQ,), (BQ, 16) */
} scratch;

static scratch carve(const rc_attn *a, void *buf)
{
    const dims dm = dims_of(a);
    scratch w;
    w.o = buf;
    w.s = w.o + BQ * dm.ldv;
    w.m = w.s + BQ * RC_ATTN_BS;
    w.l = w.m + BQ;
    w.q = (uint16_t *)(w.l + 16 * BQ);
    w.hi = w.q + BQ * dm.e_pad;
    w.lo = w.hi + BQ * RC_ATTN_BS;
    return w;
}

static size_t scratch_bytes(const rc_attn *a)
{
    const dims dm = dims_of(a);
    return (size_t)(BQ * dm.ldv + BQ * RC_ATTN_BS + 17 * BQ) * sizeof(float) +
           (size_t)(BQ * dm.e_pad + 2 * BQ * RC_ATTN_BS) * sizeof(uint16_t);
}

/* s (16 x 64 fp32) = q tile rows (16 x e_pad bf16) . keys [j0, j0 + 64) */
static inline void scores(const uint16_t *q, int64_t e_pad, const uint16_t *kb, int64_t nks,
                          float *s)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t t = 0; t < nks; t++) {
        _tile_loadd(4, q + 32 * t, e_pad * 2);
        _tile_loadd(5, kb + (0 * nks + t) * TILE, 64);
        _tile_loadd(6, kb + (1 * nks + t) * TILE, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, kb + (2 * nks + t) * TILE, 64);
        _tile_loadd(6, kb + (3 * nks + t) * TILE, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, s, RC_ATTN_BS * 4);
    _tile_stored(1, s + 16, RC_ATTN_BS * 4);
    _tile_stored(2, s + 32, RC_ATTN_BS * 4);
    _tile_stored(3, s + 48, RC_ATTN_BS * 4);
}

/* o (16 x ldv fp32) += (hi + lo) (16 x 64 keys) . values [j0, j0 + 64); nj: 32-key steps used */
static inline void weighted(const uint16_t *hi, const uint16_t *lo, const uint16_t *vb,
                            int64_t ndv, int nj, float *o, int64_t ldv)
{
    int64_t c = 0;
    for (; c + 4 <= ndv; c += 4) {
        _tile_loadd(0, o + 16 * c, ldv * 4);
        _tile_loadd(1, o + 16 * (c + 1), ldv * 4);
        _tile_loadd(2, o + 16 * (c + 2), ldv * 4);
        _tile_loadd(3, o + 16 * (c + 3), ldv * 4);
        for (int t = 0; t < nj; t++) { /* 4 products between two on one accumulator */
            const uint16_t *vt = vb + ((int64_t)t * ndv + c) * TILE;
            _tile_loadd(4, hi + 32 * t, RC_ATTN_BS * 2);
            _tile_loadd(5, lo + 32 * t, RC_ATTN_BS * 2);
            _tile_loadd(6, vt, 64);
            _tile_loadd(7, vt + TILE, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(0, 5, 6);
            _tile_dpbf16ps(1, 5, 7);
            _tile_loadd(6, vt + 2 * TILE, 64);
            _tile_loadd(7, vt + 3 * TILE, 64);
            _tile_dpbf16ps(2, 4, 6);
            _tile_dpbf16ps(3, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, o + 16 * c, ldv * 4);
        _tile_stored(1, o + 16 * (c + 1), ldv * 4);
        _tile_stored(2, o + 16 * (c + 2), ldv * 4);
        _tile_stored(3, o + 16 * (c + 3), ldv * 4);
    }
    for (; c < ndv; c++) {
        _tile_loadd(0, o + 16 * c, ldv * 4);
        for (int t = 0; t < nj; t++) {
            _tile_loadd(4, hi + 32 * t, RC_ATTN_BS * 2);
            _tile_loadd(5, lo + 32 * t, RC_ATTN_BS * 2);
            _tile_loadd(6, vb + ((int64_t)t * ndv + c) * TILE, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(0, 5, 6);
        }
        _tile_stored(0, o + 16 * c, ldv * 4);
    }
}

/* A P V product of one row tile waiting to run (see task): hi/lo (16 x 64 bf16), the value
 * tiles of its key block, how many 32-key steps, its output rows (16 x 64 fp32, ldv apart). */
typedef struct {
    const uint16_t *hi, *lo, *vb;
    float *o;
    int64_t ldv;
    int nj;
} pending;

/* Stage k (0-3) of a pending P V with exactly 4 column tiles (Ev <= 64, the common head size):
 * 4 tile products per stage on tmm0-3, which hold the output between stages. The caller runs
 * the stages between rows of the next tile's softmax: no C code touches tile registers, so the
 * tile unit works through a stage while the vector units run the softmax. */
static inline void pv_stage(const pending *p, int k)
{
    const int t = k / 2;
    if (t >= p->nj) {
        return; /* one 32-key step only: stages 2 and 3 have nothing to do */
    }
    const uint16_t *vt = p->vb + (int64_t)t * 4 * TILE;
    if (k == 0) {
        _tile_loadd(0, p->o, p->ldv * 4);
        _tile_loadd(1, p->o + 16, p->ldv * 4);
        _tile_loadd(2, p->o + 32, p->ldv * 4);
        _tile_loadd(3, p->o + 48, p->ldv * 4);
    }
    if (k % 2 == 0) {
        _tile_loadd(4, p->hi + 32 * t, RC_ATTN_BS * 2);
        _tile_loadd(5, p->lo + 32 * t, RC_ATTN_BS * 2);
        _tile_loadd(6, vt, 64);
        _tile_loadd(7, vt + TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(0, 5, 6);
        _tile_dpbf16ps(1, 5, 7);
    } else {
        _tile_loadd(6, vt + 2 * TILE, 64);
        _tile_loadd(7, vt + 3 * TILE, 64);
        _tile_dpbf16ps(2, 4, 6);
        _tile_dpbf16ps(3, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
}

static inline void pv_finish(const pending *p)
{
    _tile_stored(0, p->o, p->ldv * 4);
    _tile_stored(1, p->o + 16, p->ldv * 4);
    _tile_stored(2, p->o + 32, p->ldv * 4);
    _tile_stored(3, p->o + 48, p->ldv * 4);
}

/* 2^x as rc_exp2_neg with a degree-4 polynomial (relative error 4.3e-5): ample for bf16
 * outputs (rtol 1.6e-2, and 2^-9 from the output's own rounding), three FMAs fewer. */
static inline __m512 exp2_bf16(__m512 x)
{
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-64.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_set1_ps(-64.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.618129107628477e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* exp2_bf16 for scores that cannot be -inf (unmasked blocks): no zeroing mask, the clamp alone
 * keeps results >= 2^-64 (out of denormals; < 2^-56 relative to the row's largest term, which
 * is >= 2^-8). Two instructions fewer per 16 scores. */
static inline __m512 exp2_bf16_finite(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-64.0f), x); /* NaN stays NaN (second operand) */
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(9.618129107628477e-03f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* a * b rounded (never contracted into an FMA with a later add: embedded rounding) */
static inline __m512 rounded_mul(__m512 a, __m512 b)
{
    return _mm512_mul_round_ps(a, b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Softmax of the 16 score rows s (rows [i, i + 16) of the head) into P = hi + lo: hi is P
 * truncated to bf16 (exact: the low 16 bits cleared), lo = P - hi rounded to bf16. m, lv of
 * those rows; alpha (16) per row. Unmasked blocks with a positive scale keep the raw scores
 * (scaled as they are shifted) and skip the row's horizontal max unless some lane exceeds the
 * running max by RC_ATTN_SLACK (rare after the first block). */
static inline void softmax16(const rc_attn *a, int64_t b, int64_t i, int64_t j0, int masked,
                             float *s, uint16_t *hi, uint16_t *lo, float *m, float *lv,
                             float *alpha, const pending *pv)
{
    const int raw = !masked && a->scale2 > 0.0f;
    const float k = raw ? a->scale2 : 1.0f; /* scaled score = raw score * k */
    const __m512 vk = _mm512_set1_ps(k), sc = _mm512_set1_ps(a->scale2);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    float diff[16], sums[16 * 16];
    for (int r = 0; r < 16; r++) {
        if (pv && r % 4 == 0)
            pv_stage(pv, r / 4);
        float *row = s + r * RC_ATTN_BS;
        if (!raw) {
            for (int c = 0; c < 4; c++)
                _mm512_storeu_ps(row + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(row + 16 * c), sc));
            if (masked)
                rc_attn_mask_row(a, b, i + r, j0, row);
        }
        const __m512 mx = _mm512_max_ps(
            _mm512_max_ps(_mm512_loadu_ps(row), _mm512_loadu_ps(row + 16)),
            _mm512_max_ps(_mm512_loadu_ps(row + 32), _mm512_loadu_ps(row + 48)));
        float mnew = m[r];
        /* a lane above m + slack? (m = -inf: any finite lane). Compared, and below shifted, as
         * the rounded products raw * k: with raw scores the exact fma(raw, k, -m) differs from
         * the rounded max by up to half an ulp of it, past 2^7 for scores past 2^31 (exp2
         * overflows), and comparing raw against (m + slack) / k misses a lane by as much (found
         * by refcore.fuzz: queries ~1e18 gave wrong rows on AMX) */
        if (_mm512_cmp_ps_mask(rounded_mul(mx, vk), _mm512_set1_ps(m[r] + RC_ATTN_SLACK),
                               _CMP_GT_OQ)) {
            const float bm = _mm512_cvtss_f32(rc_hmax(mx)) * k;
            mnew = bm > m[r] + RC_ATTN_SLACK ? bm : m[r];
        }
        const float shift = mnew == -INFINITY ? 0.0f : mnew;
        diff[r] = m[r] - shift; /* m = -inf: alpha = 0 */
        m[r] = mnew;
        const __m512 vs = _mm512_set1_ps(-shift);
        __m512 e[4], h[4];
        for (int c = 0; c < 4; c++) {
            const __m512 x = _mm512_add_ps(rounded_mul(_mm512_loadu_ps(row + 16 * c), vk), vs);
            e[c] = masked ? exp2_bf16(x) : exp2_bf16_finite(x);
            h[c] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(e[c]), top));
        }
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3]));
        _mm512_storeu_ps(sums + 16 * r, sum);
        const int64_t at = r * RC_ATTN_BS;
        _mm512_storeu_si512(hi + at, (__m512i)_mm512_cvtne2ps_pbh(h[1], h[0]));
        _mm512_storeu_si512(hi + at + 32, (__m512i)_mm512_cvtne2ps_pbh(h[3], h[2]));
        _mm512_storeu_si512(lo + at, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(e[1], h[1]),
                                                                  _mm512_sub_ps(e[0], h[0])));
        _mm512_storeu_si512(lo + at + 32, (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(e[3], h[3]),
                                                                       _mm512_sub_ps(e[2], h[2])));
    }
    if (pv)
        pv_finish(pv);
    _mm512_storeu_ps(alpha, rc_exp2_neg(_mm512_loadu_ps(diff)));
    for (int r = 0; r < 16; r++)
        _mm512_storeu_ps(lv + 16 * r, _mm512_fmadd_ps(_mm512_loadu_ps(lv + 16 * r),
                                                      _mm512_set1_ps(alpha[r]),
                                                      _mm512_loadu_ps(sums + 16 * r)));
}

static void load_q(const rc_attn *a, int64_t b, int64_t i0, int64_t nq, int64_t n,
                   const dims *dm, uint16_t *dst)
{
    const uint16_t *q = a->q;
    const int64_t oq = a->offs[b], qs = a->st[0], qf = a->st[1];
    for (int64_t r = 0; r < n; r++) {
        uint16_t *row = dst + r * dm->e_pad;
        if (r < nq && qf == 1) {
            for (int64_t d = 0; d < dm->e_pad; d += 32) {
                const int64_t left = a->E - d;
                const __mmask32 mk = left >= 32 ? 0xffffffffu : (1u << left) - 1u;
                _mm512_storeu_si512(row + d,
                                    _mm512_maskz_loadu_epi16(mk, q + oq + (i0 + r) * qs + d));
            }
            continue;
        }
        for (int64_t d = 0; d < dm->e_pad; d++)
            row[d] = r < nq && d < a->E ? q[oq + (i0 + r) * qs + d * qf] : 0;
    }
}

/* For each key block: the scores of every live row tile, then their softmax (rescaling output
 * rows whose alpha is not 1), then P V into the output tiles. Phases apart, so tile loads do not
 * wait on the vector stores just made (a store-to-tile-load stall measured ~15% of the time). */
static void task(const rc_attn *a, int64_t b, int64_t i0, const void *packed, void *buf)
{
    const dims dm = dims_of(a);
    const scratch w = carve(a, buf);
    const uint16_t *kb = packed, *vb = kb + dm.s_pad * dm.e_pad;
    const int64_t nq = rc_min64(BQ, a->L - i0), nrt = (nq + 15) / 16;
    load_q(a, b, i0, nq, 16 * nrt, &dm, w.q);
    memset(w.o, 0, (size_t)(16 * nrt * dm.ldv) * sizeof(float));
    memset(w.l, 0, (size_t)(16 * 16 * nrt) * sizeof(float));
    for (int64_t r = 0; r < 16 * nrt; r++)
        w.m[r] = -INFINITY;
    const int64_t kend = rc_attn_key_end(a, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += RC_ATTN_BS) {
        int64_t jn[4];
        for (int64_t t = 0; t < nrt; t++) {
            const int64_t r0 = 16 * t;
            jn[t] = rc_min64(RC_ATTN_BS,
                             rc_attn_key_end(a, i0 + r0, rc_min64(16, nq - r0)) - j0);
            if (jn[t] > 0) /* else causal: this tile's keys end before j0 */
                scores(w.q + r0 * dm.e_pad, dm.e_pad, kb + (j0 / 16) * dm.nks * TILE, dm.nks,
                       w.s + r0 * RC_ATTN_BS);
        }
        /* softmax of tile t runs (vector units) while the P V of tile t - 1 (tile unit) runs in
         * stages between its rows; that P V reads hi/lo stored a whole softmax earlier */
        for (int64_t t = 0; t <= nrt; t++) {
            const int has_pv = t > 0 && jn[t - 1] > 0;
            const int64_t r0 = 16 * t, u = has_pv ? t - 1 : 0;
            const pending pv = {w.hi + 16 * u * RC_ATTN_BS, w.lo + 16 * u * RC_ATTN_BS,
                                vb + (j0 / 32) * dm.ndv * TILE, w.o + 16 * u * dm.ldv, dm.ldv,
                                has_pv && jn[u] > 32 ? 2 : 1};
            const int staged = has_pv && dm.ndv == 4;
            if (t < nrt && jn[t] > 0) {
                const int masked = a->mask_kind || j0 + RC_ATTN_BS > a->S ||
                                   (a->causal && i0 + r0 + 1 < j0 + RC_ATTN_BS);
                float alpha[16];
                softmax16(a, b, i0 + r0, j0, masked, w.s + r0 * RC_ATTN_BS,
                          w.hi + r0 * RC_ATTN_BS, w.lo + r0 * RC_ATTN_BS, w.m + r0,
                          w.l + 16 * r0, alpha, staged ? &pv : NULL);
                for (int64_t r = 0; r < 16; r++) {
                    if (alpha[r] == 1.0f)
                        continue;
                    float *o = w.o + (r0 + r) * dm.ldv;
                    const __m512 al = _mm512_set1_ps(alpha[r]);
                    for (int64_t c = 0; c < dm.ldv; c += 16)
                        _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), al));
                }
            } else if (staged) {
                for (int k = 0; k < 4; k++)
                    pv_stage(&pv, k);
                pv_finish(&pv);
            }
            if (has_pv && !staged)
                weighted(pv.hi, pv.lo, pv.vb, dm.ndv, pv.nj, pv.o, dm.ldv);
        }
    }
    rc_attn_store(a, b, i0, nq, w.o, dm.ldv, w.l);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    if (!rc_attn_scores_fit(q, k, offs, st, nb, L, S, E, scale, 1, nt) || /* exact.h */
        !rc_attn_mask_fits(mask, offs, st, nb, L, S, mask_kind, 1, nt) ||
        !rc_attn_values_fit(v, offs, st, nb, S, Ev, 1, nt))
        return rc_attn_exact(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal,
                             scale, nt, 1);
    const rc_attn a = {q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, 1,
                       (float)(scale * 1.4426950408889634), NULL};
    if (L <= DECODE_L) /* few query rows: vector code, keys and values read in place */
        return rc_attn_decode(&a, nt) != 0 ? -1
                                           : rc_attn_fix_rows(q, k, v, mask, out, offs, st, nb, L,
                                                              S, E, Ev, mask_kind, causal, scale, 1);
    const dims dm = dims_of(&a);
    const rc_attn_impl im = {
        .bq = BQ,
        .head_bytes = (size_t)(dm.s_pad * (dm.e_pad + dm.ldv)) * sizeof(uint16_t),
        .scratch_bytes = scratch_bytes(&a),
        .pack = pack,
        .task = task,
        .enter = tiles_on,
        .leave = tiles_off,
    };
    if (rc_attn_drive(&a, &im, nt) != 0)
        return -1;
    return rc_attn_fix_rows(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale,
                            1);
}
