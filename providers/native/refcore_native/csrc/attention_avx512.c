/* attention family, AVX-512: flash-attention forward with fp32 compute (float32 and bfloat16).
 *
 * Per head, keys are packed once (transposed, fp32, [S/64][E][64], zero padded) and values
 * ([S][Ev rounded up to 16], fp32); tasks run blocks of BQ queries (see rc_attn_drive for how
 * heads and blocks are split over the threads). A task keeps its queries (pre-scaled by
 * scale * log2 e, fp32) and its output accumulators in per-thread buffers; for each key block,
 * per group of 4 query rows: scores 4 x 64 by broadcast-FMA in 16 registers, mask, online
 * softmax, then P V by broadcast-FMA into 4 x 64 output registers. Causal tasks stop at their
 * last row's diagonal (key blocks above it are never computed: torch computes and masks them).
 * Compiled at avx512_bf16 (attention_avx512_bf16.c), the bf16 kernel forms the scores with
 * vdpbf16ps instead: keys packed as bf16 feature pairs, [S/64][E/2][64][2] (a 16-key row of
 * pairs is one vdpbf16ps operand), query rows kept as bf16 pairs and the fp32 score times
 * scale * log2 e afterwards (products exact, fp32 sums: rc_attn_scores_fit bounds both the
 * score and what reading subnormals as 0 may change, as for the AMX tiles). Half the score
 * instructions; P V stays fp32 (P rounded to bf16 would leave the spec's tolerance).
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_attn_avx512.h"
#include "rc_attn_decode.h"
#include "rc_attn_exact.h"

#define BQ 64 /* queries per task */
#include "rc_transpose.h"

#if defined(RC_BF16_ONLY) && defined(__AVX512BF16__)
#define QK_DPBF16 1
#else
#define QK_DPBF16 0
#endif
/* Query rows up to which a call takes the decode path (rc_attn_decode.h). One thread, B1 H16
 * S512 D64 fp32, us per call, decode path: L1 176, L2 231 (~55 per row); flash: L3 445, L4 403,
 * L6 536. */
#define DECODE_L 4

typedef struct {
    float *q, *o, *s, *m, *l; /* (BQ, E), (BQ, ldv), (4, 64), (BQ,), (BQ, 16) */
} scratch;

#if !QK_DPBF16 /* the fp32 score path's packing (pack_k16 / load_q16 replace it) */
/* keys of batch b transposed into [S_pad / 64][E][64] fp32, zero padded: fp32 keys with dense
 * rows by 16 x 16 transposes, others a row at a time (a scatter of 16 features) */
static void pack_k(const rc_attn *a, int64_t b, float *kt, int64_t s_pad)
{
    const int64_t ok = a->offs[a->nb + b], ks = a->st[2], kf = a->st[3], E = a->E;
    if (!a->bf16 && kf == 1) {
        for (int64_t j0 = 0; j0 < s_pad; j0 += 16) {
            const int64_t rows = rc_min64(16, a->S - j0);
            float *blk = kt + (j0 / RC_ATTN_BS) * E * RC_ATTN_BS + j0 % RC_ATTN_BS;
            for (int64_t d0 = 0; d0 < E; d0 += 16)
                rc_transpose16((const char *)((const float *)a->k + ok + (rows > 0 ? j0 * ks : 0) + d0),
                               ks * 4, rows, rc_tail32(2 * (E - d0)),
                               (char *)(blk + d0 * RC_ATTN_BS), RC_ATTN_BS * 4,
                               rc_min64(16, E - d0));
        }
        return;
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32(RC_ATTN_BS));
    for (int64_t j = 0; j < s_pad; j++) {
        float *dst = kt + (j / RC_ATTN_BS) * E * RC_ATTN_BS + j % RC_ATTN_BS;
        if (kf == 1 && j < a->S) { /* a contiguous key row: 16 features per load and scatter */
            for (int64_t d = 0; d < E; d += 16) {
                const __mmask16 mk = rc_tail16(E - d);
                _mm512_mask_i32scatter_ps(dst + d * RC_ATTN_BS, mk, idx,
                                          rc_load_m(a->k, ok + j * ks + d, mk, a->bf16), 4);
            }
            continue;
        }
        for (int64_t d = 0; d < E; d++)
            dst[d * RC_ATTN_BS] = j < a->S ? rc_ld(a->k, ok + j * ks + d * kf, a->bf16) : 0.0f;
    }
}

/* rows [i0, i0 + nq) of the query, times scale2, into q (rows E apart), zero rows up to n */
static void load_q(const rc_attn *a, int64_t b, int64_t i0, int64_t nq, int64_t n, float *q)
{
    const int64_t oq = a->offs[b], qs = a->st[0], qf = a->st[1], E = a->E;
    const __m512 sc = _mm512_set1_ps(a->scale2);
    for (int64_t r = 0; r < n; r++) {
        float *dst = q + r * E;
        if (r >= nq) {
            memset(dst, 0, (size_t)E * sizeof(float));
        } else if (qf == 1) {
            for (int64_t d = 0; d < E; d += 16) {
                const __mmask16 mk = rc_tail16(E - d);
                __m512 v = rc_load_m(a->q, oq + (i0 + r) * qs + d, mk, a->bf16);
                _mm512_mask_storeu_ps(dst + d, mk, _mm512_mul_ps(v, sc));
            }
        } else {
            for (int64_t d = 0; d < E; d++)
                dst[d] = rc_ld(a->q, oq + (i0 + r) * qs + d * qf, a->bf16) * a->scale2;
        }
    }
}

#endif

/* The scores acc (4 rows x 64 keys, log2 domain) masked when needed (through p), then the online
 * softmax step: p (4 x 64) holds the probabilities, m, lv, alpha as in rc_attn_softmax4. */
static inline __attribute__((always_inline)) void mask_softmax_4x64(
    const rc_attn *a, int64_t b, int64_t i, int64_t j0, int masked, __m512 acc[4][4], float *p,
    float *m, float *lv, float *alpha)
{
    if (masked) {
        for (int r = 0; r < 4; r++) {
            for (int c = 0; c < 4; c++)
                _mm512_storeu_ps(p + r * RC_ATTN_BS + 16 * c, acc[r][c]);
            rc_attn_mask_row(a, b, i + r, j0, p + r * RC_ATTN_BS);
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_loadu_ps(p + r * RC_ATTN_BS + 16 * c);
        }
    }
    rc_attn_softmax4(acc, p, m, lv, alpha);
}

#if !QK_DPBF16
/* Scores of 4 query rows (q: 4 x E, pre-scaled) against 64 keys (kt: E x 64) by broadcast-FMA
 * in 16 registers; masked when needed (through p), then the online softmax step: p (4 x 64)
 * holds the probabilities, m, lv, alpha as in rc_attn_softmax4. */
static inline void qk_softmax_4x64(const rc_attn *a, int64_t b, int64_t i, int64_t j0,
                                   int masked, const float *q, const float *kt, float *p,
                                   float *m, float *lv, float *alpha)
{
    const int64_t E = a->E;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < E; d++) {
        __m512 kv[4];
        for (int c = 0; c < 4; c++)
            kv[c] = _mm512_loadu_ps(kt + d * RC_ATTN_BS + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512 qv = _mm512_set1_ps(q[r * E + d]);
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    mask_softmax_4x64(a, b, i, j0, masked, acc, p, m, lv, alpha);
}

#endif

#if QK_DPBF16
/* keys of batch b as bf16 feature pairs [S_pad / 64][E2][64 keys][2], E2 = ceil(E / 2), zero
 * padded (an odd E's last pair has a zero partner): 16 x 16 transposes of 32-bit pairs */
static void pack_k16(const rc_attn *a, int64_t b, uint16_t *kt, int64_t s_pad)
{
    const int64_t ok = a->offs[a->nb + b], ks = a->st[2], kf = a->st[3], E = a->E;
    const int64_t E2 = (E + 1) / 2;
    const uint16_t *k = a->k;
    for (int64_t j0 = 0; j0 < s_pad; j0 += 16) {
        uint16_t *blk = kt + (j0 / RC_ATTN_BS) * E2 * 2 * RC_ATTN_BS + (j0 % RC_ATTN_BS) * 2;
        if (kf == 1) {
            const int64_t rows = rc_min64(16, a->S - j0);
            for (int64_t d0 = 0; d0 < E; d0 += 32)
                rc_transpose16((const char *)(k + ok + (rows > 0 ? j0 * ks : 0) + d0), ks * 2,
                               rows, rc_tail32(E - d0), (char *)(blk + d0 * RC_ATTN_BS),
                               2 * RC_ATTN_BS * 2, rc_min64(16, E2 - d0 / 2));
            continue;
        }
        for (int64_t j = j0; j < j0 + 16; j++)
            for (int64_t d = 0; d < 2 * E2; d++)
                blk[(d / 2) * 2 * RC_ATTN_BS + (j - j0) * 2 + d % 2] =
                    j < a->S && d < E ? k[ok + j * ks + d * kf] : 0;
    }
}

/* rows [i0, i0 + nq) of the query as bf16 pairs into q (rows 2 * E2 apart), zero rows up to n */
static void load_q16(const rc_attn *a, int64_t b, int64_t i0, int64_t nq, int64_t n, uint16_t *q)
{
    const int64_t oq = a->offs[b], qs = a->st[0], qf = a->st[1], E = a->E, ld = 2 * ((E + 1) / 2);
    const uint16_t *src = a->q;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < ld; d++)
            q[r * ld + d] = r < nq && d < E ? src[oq + (i0 + r) * qs + d * qf] : 0;
}

/* Scores of 4 query rows (bf16 pairs, rows ld apart) against 64 keys (pack_k16's block) by
 * vdpbf16ps, times scale * log2 e; then as qk_softmax_4x64 */
static inline void qk16_softmax_4x64(const rc_attn *a, int64_t b, int64_t i, int64_t j0,
                                     int masked, const uint16_t *q, int64_t ld,
                                     const uint16_t *kt, float *p, float *m, float *lv,
                                     float *alpha)
{
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t d2 = 0; d2 < ld / 2; d2++) {
        __m512i kv[4];
        for (int c = 0; c < 4; c++)
            kv[c] = _mm512_loadu_si512(kt + d2 * 2 * RC_ATTN_BS + 32 * c);
        for (int r = 0; r < 4; r++) {
            int32_t pair;
            memcpy(&pair, q + r * ld + 2 * d2, 4);
            const __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qv, (__m512bh)kv[c]);
        }
    }
    const __m512 sc = _mm512_set1_ps(a->scale2);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_mul_ps(acc[r][c], sc);
    mask_softmax_4x64(a, b, i, j0, masked, acc, p, m, lv, alpha);
}
#endif

/* o (4, 16 * NV) = o * alpha + p (4, jn) . v (jn, 16 * NV), v rows ldv apart */
static inline __attribute__((always_inline)) void pv_4xn(const float *p, int64_t jn,
                                                         const float *v, int64_t ldv, float *o,
                                                         int64_t ldo, const float *alpha,
                                                         const int NV)
{
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + 16 * c),
                                      _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < jn; j++) {
        __m512 vv[4];
        for (int c = 0; c < NV; c++)
            vv[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512 pv = _mm512_set1_ps(p[r * RC_ATTN_BS + j]);
            for (int c = 0; c < NV; c++)
                acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            _mm512_storeu_ps(o + r * ldo + 16 * c, acc[r][c]);
}

static void pv_4(const float *p, int64_t jn, const float *v, int64_t ldv, float *o,
                 const float *alpha)
{
    for (int64_t c0 = 0; c0 < ldv; c0 += 64) {
        switch ((ldv - c0) >= 64 ? 4 : (ldv - c0) / 16) {
        case 4: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 4); break;
        case 3: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 3); break;
        case 2: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 2); break;
        default: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 1); break;
        }
    }
}

static void task(const rc_attn *a, int64_t b, int64_t i0, const float *kt, const float *vp,
                 int64_t ldv, const scratch *w)
{
    const int64_t E = a->E, nq = rc_min64(BQ, a->L - i0), ng = (nq + 3) / 4;
#if QK_DPBF16
    const int64_t ld = 2 * ((E + 1) / 2); /* bf16 per query row and per key pair row x 64 */
    uint16_t *q16 = (uint16_t *)w->q;     /* fits: 2 ld bytes <= 4 E for E >= 1 */
    load_q16(a, b, i0, nq, 4 * ng, q16);
#else
    load_q(a, b, i0, nq, 4 * ng, w->q);
#endif
    memset(w->o, 0, (size_t)(4 * ng * ldv) * sizeof(float));
    for (int64_t r = 0; r < 4 * ng; r++)
        w->m[r] = -INFINITY;
    memset(w->l, 0, (size_t)(64 * ng) * sizeof(float));
    const int64_t kend = rc_attn_key_end(a, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += RC_ATTN_BS) {
#if QK_DPBF16
        const uint16_t *ktb = (const uint16_t *)kt + j0 * ld;
#else
        const float *ktb = kt + j0 * E;
#endif
        const float *vb = vp + j0 * ldv;
        for (int64_t g = 0; g < ng; g++) {
            const int64_t r0 = 4 * g, rows = rc_min64(4, nq - r0);
            const int64_t jn = rc_min64(RC_ATTN_BS, rc_attn_key_end(a, i0 + r0, rows) - j0);
            if (jn <= 0)
                continue; /* causal: this group's keys end before j0 */
            float alpha[4];
            /* masks needed: a mask, keys past S, or a causal diagonal (row i0 + r0 sees fewest) */
            const int masked = a->mask_kind || j0 + RC_ATTN_BS > a->S ||
                               (a->causal && i0 + r0 + 1 < j0 + RC_ATTN_BS);
#if QK_DPBF16
            qk16_softmax_4x64(a, b, i0 + r0, j0, masked, q16 + r0 * ld, ld, ktb, w->s, w->m + r0,
                              w->l + 16 * r0, alpha);
#else
            qk_softmax_4x64(a, b, i0 + r0, j0, masked, w->q + r0 * E, ktb, w->s, w->m + r0,
                            w->l + 16 * r0, alpha);
#endif
            pv_4(w->s, jn, vb, ldv, w->o + r0 * ldv, alpha);
        }
    }
    rc_attn_store(a, b, i0, nq, w->o, ldv, w->l);
}

static void pack(const rc_attn *a, int64_t b, void *packed)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 16);
#if QK_DPBF16
    pack_k16(a, b, packed, s_pad); /* s_pad * 2 ld bytes <= the fp32 keys' s_pad * 4 E */
#else
    pack_k(a, b, packed, s_pad);
#endif
    rc_attn_pack_v_f32(a, b, (float *)packed + s_pad * a->E, ldv, s_pad);
}

static void run_task(const rc_attn *a, int64_t b, int64_t i0, const void *packed, void *buf)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 16);
    scratch w;
    w.q = buf;
    w.o = w.q + BQ * a->E;
    w.s = w.o + BQ * ldv;
    w.m = w.s + 4 * RC_ATTN_BS;
    w.l = w.m + BQ;
    task(a, b, i0, packed, (const float *)packed + s_pad * a->E, ldv, &w);
}

static int sdpa(const rc_attn *a, int nt)
{
    if (a->L <= DECODE_L)
        return rc_attn_decode(a, nt);
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 16);
    const rc_attn_impl im = {
        .bq = BQ,
        .head_bytes = (size_t)(s_pad * (a->E + ldv)) * sizeof(float),
        .scratch_bytes = (size_t)(BQ * (a->E + ldv) + 4 * RC_ATTN_BS + 17 * BQ) * sizeof(float),
        .pack = pack,
        .task = run_task,
    };
    return rc_attn_drive(a, &im, nt);
}

static int run(const void *q, const void *k, const void *v, const void *mask, void *out,
               const void *offs, const void *st, int64_t nb, int64_t L, int64_t S, int64_t E,
               int64_t Ev, int mask_kind, int causal, double scale, int nt, int bf16)
{
    if (!rc_attn_scores_fit(q, k, offs, st, nb, L, S, E, scale, bf16, nt) || /* exact.h */
        !rc_attn_mask_fits(mask, offs, st, nb, L, S, mask_kind, bf16, nt) ||
        !rc_attn_values_fit(v, offs, st, nb, S, Ev, bf16, nt))
        return rc_attn_exact(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal,
                             scale, nt, bf16);
    const rc_attn a = {q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, bf16,
                       (float)(scale * 1.4426950408889634), NULL};
    if (sdpa(&a, nt) != 0)
        return -1;
    return rc_attn_fix_rows(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale,
                            bf16);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernel */
int RC_FN(rc_scaled_dot_product_attention_f32)(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 0);
}
#endif
