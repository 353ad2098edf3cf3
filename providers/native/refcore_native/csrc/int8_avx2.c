/* int8 family, AVX2 (+ FMA for qlinear's last step): quantize_per_tensor, dequantize_per_tensor,
 * qlinear. Every float step is the reference's (refcore/ops/int8.py), so integer outputs match it
 * bit for bit.
 *
 * quantize / dequantize are flat loops over chunks of CHUNK elements (one parallel task each),
 * 32 (quantize) or 8 (dequantize) values a step; a tail goes through a small zeroed buffer, so
 * nothing outside the arrays is read or written.
 *
 * qlinear sums exactly in int32 with vpmaddwd (int16 x int16 pairs -> int32): x - zp in
 * [-255, 255] and w in [-128, 127] are int16 values, a pair of products at most 2 * 255 * 128 in
 * magnitude. vpmaddubsw (u8 x s8 pairs into saturating int16, what oneDNN uses without VNNI) is
 * not exact there: 255 * -128 * 2 < -32768. Per 32 products that is vpmaddubsw + vpmaddwd + vpaddd
 * against our 2 x (vpmaddwd + vpaddd); both are bound by the vector pipes (measured on Zen 3:
 * ~2.7 of these a cycle, mixed), so large GEMMs run at ~0.75x oneDNN's int8 (see int8.py).
 * - M > SMALL_M (GEMM): x - zp is widened once to int16 rows; tasks are a panel of 16 output
 *   columns x a block of rows. The task's thread packs its panel (16 weight rows as (k, k + 1)
 *   pairs of int16: one 256-bit load holds 8 columns x 2 k) into its own buffer, then sweeps the
 *   rows 4 at a time: 8 int32 accumulators, each k pair one broadcast int32 (two int16 of a row
 *   of x) per row. Widening and the GEMM run in one parallel region (a region costs ~8 ms when
 *   another process holds a core).
 * - M <= SMALL_M (decode): packing the weight would cost more than using it, so weight rows are
 *   read in place and widened in registers (vpmovsxbw), 4 rows of x x 3 of w at a time, each sum
 *   reduced across its 8 lanes at the end.
 * The epilogue is y = fma(float32(acc), s, b) (the spec allows the FMA; without a bias it is the
 * reference's multiply exactly).
 */
#include "int8.h"
#include "rc_avx2.h"

enum { CHUNK = 16384 };                 /* flat loops: elements per task (a multiple of 32) */
enum { NR = 16, MR = 4, SMALL_M = 16 }; /* the GEMM tile; int8.py has SMALL_M too */
enum { X_BLOCK = 1 << 18, MIN_ROWS = 64 }; /* a GEMM task's rows: ~256 KB of int16 x (L2) */
enum { MB = 4, NB = 3 };                /* the small-M tile */

static int64_t rc_max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t round_up(int64_t a, int64_t b)
{
    return (a + b - 1) / b * b;
}

/* ---------------------------------------------------------------------------------------------
 * quantize_per_tensor */

enum { RINT = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; /* half to even, as rint */

/* rint(v * inv) clamped to [lo, hi] = [qmin - zp, qmax - zp], plus zp, as int32. vmaxps returns
 * its second operand when either is NaN: NaN -> lo -> qmin; +-inf clamp to the ends. */
RC_INLINE __m256i quant8(__m256 v, __m256 inv, __m256 lo, __m256 hi, __m256i zp)
{
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inv), RINT);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    return _mm256_add_epi32(_mm256_cvtps_epi32(r), zp);
}

/* 4 x 8 int32 (each in the output type's range) -> 32 bytes in order */
RC_INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d, int sgn)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i q = sgn ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

RC_INLINE __m256i quant32(const void *x, int64_t i, int bf16, __m256 inv, __m256 lo, __m256 hi,
                          __m256i zp, int sgn)
{
    return pack32(quant8(rc8_load(x, i, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 8, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 16, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 24, bf16), inv, lo, hi, zp), sgn);
}

static void quantize_span(const void *x, uint8_t *q, int64_t i0, int64_t i1, float inv, int zp,
                          int qmin, int qmax, int sgn, int bf16)
{
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(qmin - zp));
    const __m256 hi = _mm256_set1_ps((float)(qmax - zp));
    const __m256i vz = _mm256_set1_epi32(zp);
    int64_t i = i0;
    for (; i + 32 <= i1; i += 32)
        _mm256_storeu_si256((__m256i *)(q + i), quant32(x, i, bf16, vi, lo, hi, vz, sgn));
    if (i < i1) { /* the tail, widened to fp32 in a zeroed buffer */
        float t[32] = {0};
        uint8_t o[32];
        for (int64_t j = 0; j < i1 - i; j++)
            t[j] = rc_ld(x, i + j, bf16);
        _mm256_storeu_si256((__m256i *)o, quant32(t, 0, 0, vi, lo, hi, vz, sgn));
        memcpy(q + i, o, (size_t)(i1 - i));
    }
}

static void quantize(const void *x, void *q, int64_t n, float inv, int zp, int qmin, int qmax,
                     int sgn, int nt, int bf16)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        quantize_span(x, (uint8_t *)q, c * CHUNK, rc_min64(n, (c + 1) * CHUNK), inv, zp, qmin,
                      qmax, sgn, bf16);
}

void rc_quantize_per_tensor_f32_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                     int qmin, int qmax, int sgn, int nt)
{
    quantize(x, q, n, inv, zp, qmin, qmax, sgn, nt, 0);
}

void rc_quantize_per_tensor_bf16_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                      int qmin, int qmax, int sgn, int nt)
{
    quantize(x, q, n, inv, zp, qmin, qmax, sgn, nt, 1);
}

/* ---------------------------------------------------------------------------------------------
 * dequantize_per_tensor */

/* float32(q - zp) * s for the 8 bytes in the low half of b (q - zp is exact in int32 and fp32) */
RC_INLINE __m256 dequant8(__m128i b, __m256i zp, __m256 s, int sgn)
{
    __m256i v = sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, zp)), s);
}

static void dequantize_span(const uint8_t *q, float *y, int64_t i0, int64_t i1, float scale,
                            int zp, int sgn)
{
    const __m256i vz = _mm256_set1_epi32(zp);
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8)
        _mm256_storeu_ps(y + i, dequant8(_mm_loadl_epi64((const __m128i *)(q + i)), vz, vs, sgn));
    if (i < i1) {
        uint8_t t[16] = {0};
        memcpy(t, q + i, (size_t)(i1 - i));
        rc8_store_n(y, i, i1 - i, dequant8(_mm_loadu_si128((const __m128i *)t), vz, vs, sgn), 0);
    }
}

void rc_dequantize_per_tensor_f32_avx2(const void *q, void *y, int64_t n, float scale, int zp,
                                       int sgn, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        dequantize_span((const uint8_t *)q, (float *)y, c * CHUNK, rc_min64(n, (c + 1) * CHUNK),
                        scale, zp, sgn);
}

/* ---------------------------------------------------------------------------------------------
 * qlinear: scratch layout (offsets in bytes; every part a multiple of 32 bytes long)
 *   wp  GEMM path only: a panel per thread, P pairs x 32 int16 (P = ceil(K / 2); odd K: a zero k)
 *   xw  M rows x kx int16: x - zp, zeros from K to kx = K rounded up to 16
 *   sc  np fp32: float32(xs * ws[n]), zeros past N (np = N rounded up to NR)
 *   bi  np fp32: the bias, zeros past N or without one */

typedef struct {
    int16_t *wp, *xw;
    float *sc, *bi;
    int64_t kx, pairs, np;
} Scratch;

static int64_t panel_bytes(int64_t m, int64_t k, int nt)
{
    return m > SMALL_M ? rc_threads(nt) * ((k + 1) / 2) * 32 * (int64_t)sizeof(int16_t) : 0;
}

static Scratch carve(void *scratch, int64_t m, int64_t n, int64_t k, int nt)
{
    Scratch s;
    s.kx = round_up(k, 16);
    s.pairs = (k + 1) / 2;
    s.np = round_up(n, NR);
    s.wp = (int16_t *)scratch;
    s.xw = (int16_t *)((char *)scratch + panel_bytes(m, k, nt));
    s.sc = (float *)(s.xw + m * s.kx);
    s.bi = s.sc + s.np;
    return s;
}

int64_t rc_qlinear_scratch_f32_avx2(int64_t m, int64_t n, int64_t k, int nt)
{
    return panel_bytes(m, k, nt) + (int64_t)sizeof(int16_t) * m * round_up(k, 16) +
           (int64_t)sizeof(float) * 2 * round_up(n, NR);
}

/* row of x (k bytes) -> k int16 x - zp, then zeros up to kx */
static void widen_row(const uint8_t *x, int16_t *d, int64_t k, int64_t kx, int zp)
{
    const __m256i z = _mm256_set1_epi16((short)zp);
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(x + j)));
        _mm256_storeu_si256((__m256i *)(d + j), _mm256_sub_epi16(v, z));
    }
    for (; j < k; j++)
        d[j] = (int16_t)(x[j] - zp);
    for (; j < kx; j++)
        d[j] = 0;
}

/* 16 bytes of each weight row c0 + c (c < 8) from k0: zeros for rows past n and k past K */
static void load_rows8_tail(const int8_t *w, int64_t n, int64_t k, int64_t c0, int64_t k0,
                            __m128i r[8])
{
    const int64_t kk = rc_min64(16, k - k0);
    for (int64_t c = 0; c < 8; c++) {
        int8_t t[16] = {0};
        if (c0 + c < n)
            memcpy(t, w + (c0 + c) * k + k0, (size_t)kk);
        r[c] = _mm_loadu_si128((const __m128i *)t);
    }
}

/* 8 x 8 transpose of 16-bit elements: r[c] holds row c's 8 k pairs; pair j of rows 0..7, widened
 * to int16, goes to dst + 32 * j for j < nj */
RC_INLINE void transpose_store(const __m128i r[8], int16_t *dst, int64_t nj)
{
    __m128i t[8], u[8], o[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* i: rows 0-3, then 4-7 */
        u[4 * i] = _mm_unpacklo_epi32(t[4 * i], t[4 * i + 2]);     /* pairs 0, 1 */
        u[4 * i + 1] = _mm_unpackhi_epi32(t[4 * i], t[4 * i + 2]); /* pairs 2, 3 */
        u[4 * i + 2] = _mm_unpacklo_epi32(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm_unpackhi_epi32(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        o[2 * i] = _mm_unpacklo_epi64(u[i], u[i + 4]);
        o[2 * i + 1] = _mm_unpackhi_epi64(u[i], u[i + 4]);
    }
    for (int64_t j = 0; j < nj; j++)
        _mm256_storeu_si256((__m256i *)(dst + 32 * j), _mm256_cvtepi8_epi16(o[j]));
}

/* Panel of weight rows [n0, n0 + 16): dst[(j * 2 + h) * 16 + 2 * c + e] = w[n0 + 8h + c, 2j + e]
 * as int16, for j < pairs (zeros past N and K). Whole 8 x 16-byte blocks are loaded in place,
 * the rest through zeroed buffers. */
static void pack_panel(const int8_t *w, int64_t n, int64_t k, int64_t n0, int64_t pairs,
                       int16_t *dst)
{
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        const int64_t j0 = k0 / 2, nj = rc_min64(8, pairs - j0);
        for (int64_t h = 0; h < 2; h++) {
            const int64_t c0 = n0 + 8 * h;
            __m128i r[8];
            if (c0 + 8 <= n && k0 + 16 <= k) {
                for (int c = 0; c < 8; c++)
                    r[c] = _mm_loadu_si128((const __m128i *)(w + (c0 + c) * k + k0));
            } else {
                load_rows8_tail(w, n, k, c0, k0, r);
            }
            transpose_store(r, dst + j0 * 32 + h * 16, nj);
        }
    }
}

/* an int32 holding x[2j], x[2j + 1] (int16), in every lane */
RC_INLINE __m256i pair_at(const int16_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

/* lanes [0, n) of v to p (n may be <= 0 or >= 8) */
RC_INLINE void store_upto(float *p, int64_t n, __m256 v)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else if (n > 0)
        rc8_store_n(p, 0, n, v, 0);
}

RC_INLINE void store_row16(float *y, __m256i a0, __m256i a1, const float *sc, const float *bi,
                           int64_t cols)
{
    __m256 y0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_loadu_ps(sc), _mm256_loadu_ps(bi));
    __m256 y1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1), _mm256_loadu_ps(sc + 8),
                                _mm256_loadu_ps(bi + 8));
    store_upto(y, cols, y0);
    store_upto(y + 8, cols - 8, y1);
}

#define RC_ACC(r)                                                                                  \
    if (ROWS > r) {                                                                                \
        const __m256i b = pair_at(x + (r) * ldx + 2 * j);                                          \
        a##r##0 = _mm256_add_epi32(a##r##0, _mm256_madd_epi16(b, w0));                            \
        a##r##1 = _mm256_add_epi32(a##r##1, _mm256_madd_epi16(b, w1));                            \
    }
#define RC_OUT(r)                                                                                  \
    if (ROWS > r)                                                                                  \
        store_row16(y + (r) * ldy, a##r##0, a##r##1, sc, bi, cols);
/* y rows [0, ROWS) x columns [0, cols) = the panel wp against rows x (stride ldx), all pairs.
 * 4 rows: 8 accumulators, 2 weight vectors, a broadcast and a product in registers (6 rows, as
 * in an fp32 GEMM, made gcc spill accumulators: measured 0.75x the 4-row speed on Zen 3). */
RC_INLINE void tile(const int16_t *x, int64_t ldx, const int16_t *wp, int64_t pairs,
                    const float *sc, const float *bi, float *y, int64_t ldy, int64_t cols,
                    const int ROWS)
{
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
    __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    for (int64_t j = 0; j < pairs; j++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wp + 32 * j));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wp + 32 * j + 16));
        RC_ACC(0) RC_ACC(1) RC_ACC(2) RC_ACC(3)
    }
    RC_OUT(0) RC_OUT(1) RC_OUT(2) RC_OUT(3)
}
#undef RC_ACC
#undef RC_OUT

/* Rows [i0, i1) of y, columns [p * NR, p * NR + NR) (fewer at the end of N), from the packed
 * panel */
static void gemm_panel(const Scratch *s, const int16_t *wp, float *y, int64_t n, int64_t p,
                       int64_t i0, int64_t i1)
{
    const float *sc = s->sc + p * NR, *bi = s->bi + p * NR;
    const int64_t cols = rc_min64(NR, n - p * NR);
    int64_t i = i0;
    for (; i + MR <= i1; i += MR)
        tile(s->xw + i * s->kx, s->kx, wp, s->pairs, sc, bi, y + i * n + p * NR, n, cols, MR);
    const int16_t *x = s->xw + i * s->kx;
    float *yb = y + i * n + p * NR;
    switch (i1 - i) {
    case 3: tile(x, s->kx, wp, s->pairs, sc, bi, yb, n, cols, 3); break;
    case 2: tile(x, s->kx, wp, s->pairs, sc, bi, yb, n, cols, 2); break;
    case 1: tile(x, s->kx, wp, s->pairs, sc, bi, yb, n, cols, 1); break;
    default: break;
    }
}

/* One parallel region: the rows of x widened, then a task per panel of 16 output columns and
 * block of rows. A thread packs a task's panel into its own buffer (hot in L1 / L2 as the rows
 * sweep it: packing the whole weight up front wrote it to L3 at ~4 bytes / ns, 10-20% of a call
 * at M = 128), unless its previous task had the same panel. Row blocks keep x's rows in L2. */
static void qlinear_gemm(const uint8_t *x, const int8_t *w, float *y, const Scratch *s, int64_t m,
                         int64_t n, int64_t k, int zp, int nt)
{
    const int64_t rb = rc_max64(MIN_ROWS, X_BLOCK / (2 * rc_max64(s->kx, 1)) / MR * MR);
    const int64_t nrb = (m + rb - 1) / rb;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        int16_t *wp = s->wp + omp_get_thread_num() * s->pairs * 32;
        int64_t packed = -1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; r++)
            widen_row(x + r * k, s->xw + r * s->kx, k, s->kx, zp);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < s->np / NR * nrb; t++) {
            const int64_t p = t / nrb, i0 = t % nrb * rb;
            if (p != packed)
                pack_panel(w, n, k, p * NR, s->pairs, wp);
            packed = p;
            gemm_panel(s, wp, y, n, p, i0, rc_min64(m, i0 + rb));
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * qlinear, small M: weight rows widened in registers */

RC_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 16 weights of row w from j as int16; fewer than 16 left (n): zeros past them */
RC_INLINE __m256i w16(const int8_t *w, int64_t j, int64_t n)
{
    if (n >= 16)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + j)));
    int8_t t[16] = {0};
    memcpy(t, w + j, (size_t)n);
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)t));
}

#define RC_W(c)                                                                                    \
    if (COLS > c)                                                                                  \
        w##c = w16(w + (c) * k, j, k - j);
#define RC_DOT(r, c)                                                                               \
    if (ROWS > r && COLS > c)                                                                      \
        a##r##c = _mm256_add_epi32(                                                                \
            a##r##c,                                                                               \
            _mm256_madd_epi16(w##c, _mm256_loadu_si256((const __m256i *)(x + (r) * ldx + j))));
#define RC_STEP                                                                                    \
    RC_W(0) RC_W(1) RC_W(2)                                                                        \
    RC_DOT(0, 0) RC_DOT(0, 1) RC_DOT(0, 2) RC_DOT(1, 0) RC_DOT(1, 1) RC_DOT(1, 2)                  \
    RC_DOT(2, 0) RC_DOT(2, 1) RC_DOT(2, 2) RC_DOT(3, 0) RC_DOT(3, 1) RC_DOT(3, 2)
#define RC_SUM(r, c)                                                                               \
    if (ROWS > r && COLS > c)                                                                      \
        out[(r) * NB + (c)] = hsum_i32(a##r##c);
/* out[r * NB + c] = sum_k x[r, k] * w[c, k] for r < ROWS, c < COLS (x rows: stride ldx, zeros
 * from k up to a multiple of 16; w rows: k bytes each, read in place) */
RC_INLINE void dot_tile(const int16_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *out,
                        const int ROWS, const int COLS)
{
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256i a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    __m256i w0 = a00, w1 = a00, w2 = a00;
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        RC_STEP
    }
    if (j < k) {
        RC_STEP
    }
    RC_SUM(0, 0) RC_SUM(0, 1) RC_SUM(0, 2) RC_SUM(1, 0) RC_SUM(1, 1) RC_SUM(1, 2)
    RC_SUM(2, 0) RC_SUM(2, 1) RC_SUM(2, 2) RC_SUM(3, 0) RC_SUM(3, 1) RC_SUM(3, 2)
}
#undef RC_W
#undef RC_DOT
#undef RC_STEP
#undef RC_SUM

static void dot_any(const int16_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *out,
                    int64_t rows, int64_t cols)
{
#define RC_ROWS(c)                                                                                 \
    switch (rows) {                                                                                \
    case 4: dot_tile(x, ldx, w, k, out, 4, c); break;                                             \
    case 3: dot_tile(x, ldx, w, k, out, 3, c); break;                                             \
    case 2: dot_tile(x, ldx, w, k, out, 2, c); break;                                             \
    default: dot_tile(x, ldx, w, k, out, 1, c); break;                                            \
    }
    if (cols == NB) {
        RC_ROWS(3)
    } else {
        for (int64_t c = 0; c < cols; c++, w += k, out++)
            RC_ROWS(1)
    }
#undef RC_ROWS
}

/* output columns [c0, c0 + NB) (fewer at the end of N) for every row */
static void small_block(const Scratch *s, const int8_t *w, const float *ws, const float *b,
                        float *y, int64_t m, int64_t n, int64_t k, float xs, int64_t c0)
{
    const int64_t cols = rc_min64(NB, n - c0);
    for (int64_t r0 = 0; r0 < m; r0 += MB) {
        const int64_t rows = rc_min64(MB, m - r0);
        int32_t acc[MB * NB];
        dot_any(s->xw + r0 * s->kx, s->kx, w + c0 * k, k, acc, rows, cols);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                y[(r0 + r) * n + c0 + c] = fmaf((float)acc[r * NB + c], xs * ws[c0 + c],
                                                b ? b[c0 + c] : 0.0f);
    }
}

static void qlinear_small(const uint8_t *x, const int8_t *w, const float *ws, const float *b,
                          float *y, const Scratch *s, int64_t m, int64_t n, int64_t k, float xs,
                          int zp, int nt)
{
    for (int64_t r = 0; r < m; r++) /* M x K: small */
        widen_row(x + r * k, s->xw + r * s->kx, k, s->kx, zp);
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(NB * k))
    for (int64_t i = 0; i < (n + NB - 1) / NB; i++)
        small_block(s, w, ws, b, y, m, n, k, xs, i * NB);
}

void rc_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                         void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp, int nt)
{
    Scratch s = carve(scratch, m, n, k, nt);
    if (m <= SMALL_M) {
        qlinear_small(x, w, ws, b, y, &s, m, n, k, xs, zp, nt);
        return;
    }
    for (int64_t c = 0; c < s.np; c++) {
        s.sc[c] = c < n ? xs * ((const float *)ws)[c] : 0.0f;
        s.bi[c] = c < n && b ? ((const float *)b)[c] : 0.0f;
    }
    qlinear_gemm(x, w, y, &s, m, n, k, zp, nt);
}
