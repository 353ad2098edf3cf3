/* quant family, AVX2 + FMA: woq_linear and woq_int4_linear for small M (decode), fp32 and bf16
 * inputs (woq_int4_linear: see its section at the end).
 *
 * Decode is bandwidth-bound: the int8 weight is a quarter of the fp32 bytes, so it is streamed
 * once and widened in registers (8 int8 -> 8 int32 -> 8 fp32: vpmovsxbd + vcvtdq2ps), never
 * written out as floats. Threads take blocks of NB = 4 weight rows; each block is walked in K
 * chunks of KC, 2 x rows x 4 w rows of 8-lane fp32 sums in registers (as linalg_avx2.c). With
 * more than 2 x rows, a chunk of the block is widened once into an L1 buffer and every pair of
 * rows reads it from there (the widening would otherwise be repeated per pair). A bf16 x is
 * widened once per call into an fp32 copy (M x K, small). y = scale * sum + bias; an output
 * that comes out inf or NaN is recomputed in float64 (the reference's sum: a finite result whose
 * fp32 partial sums overflowed is then right, and inf * 0 stays NaN).
 */
#include <stdlib.h>

#include "quant.h"
#include "rc_woq.h"
#include "rc_avx2.h"

enum { NB = 4, MB = 2, KC = 512 };

/* 8 int8 weights at w[i..) widened to fp32; n < 8 reads lanes [0, n) only (the rest 0). */
RC_INLINE __m256 i8load(const int8_t *w, int64_t i, int64_t n)
{
    __m128i v;
    if (n >= 8) {
        v = _mm_loadl_epi64((const __m128i *)(w + i));
    } else {
        int8_t t[16] = {0};
        memcpy(t, w + i, (size_t)n);
        v = _mm_loadu_si128((const __m128i *)t);
    }
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* 8 fp32 at p[i..); n < 8 reads lanes [0, n) only */
RC_INLINE __m256 fload(const float *p, int64_t i, int64_t n)
{
    return n >= 8 ? _mm256_loadu_ps(p + i) : rc8_load_n(p, i, n, 0);
}

/* 8 weights at element j of row c: int8 from wi (I8; times its group's scale when sg, the row's
 * scales at sg + c * g, group size gs), or fp32 from the widened (and scaled) chunk wf. */
#define RC_W(c)                                                                                    \
    if (NR > c) {                                                                                  \
        w##c = I8 ? i8load(wi + (c) * ldw, j, left) : fload(wf + (c) * ldw, j, left);              \
        if (I8 && sg)                                                                              \
            w##c = _mm256_mul_ps(w##c, _mm256_set1_ps(sg[(c) * g + (xoff + j) / gs]));             \
    }
#define RC_ACC(r, c)                                                                               \
    if (MR > r && NR > c)                                                                          \
        a##r##c = _mm256_fmadd_ps(x##r, w##c, a##r##c);
#define RC_SUM(r, c)                                                                               \
    if (MR > r && NR > c)                                                                          \
        out[(r) * NB + (c)] += rc8_hsum(a##r##c);
/* out[r * NB + c] += x[r] . w[c] for j in [j0, j1): x[r] at x + r * k + xoff + j, w[c] at
 * (wi or wf) + c * ldw + j; MR x NR (constants) of the 2 x 4 accumulators. Per-group scales
 * (sg non-NULL) need xoff + j to step within a group: gs a multiple of 8. */
RC_INLINE void dot_block(const float *x, int64_t k, const int8_t *wi, const float *wf,
                         int64_t ldw, int64_t j0, int64_t j1, int64_t xoff, float *out,
                         const float *sg, int64_t g, int64_t gs, const int MR, const int NR,
                         const int I8)
{
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 w0 = a00, w1 = a00, w2 = a00, w3 = a00, x0 = a00, x1 = a00;
    int64_t j = j0, left = 8;
    for (; j + 8 <= j1; j += 8) {
        RC_W(0) RC_W(1) RC_W(2) RC_W(3)
        x0 = _mm256_loadu_ps(x + xoff + j);
        if (MR > 1)
            x1 = _mm256_loadu_ps(x + k + xoff + j);
        RC_ACC(0, 0) RC_ACC(0, 1) RC_ACC(0, 2) RC_ACC(0, 3)
        RC_ACC(1, 0) RC_ACC(1, 1) RC_ACC(1, 2) RC_ACC(1, 3)
    }
    if (j < j1) {
        left = j1 - j;
        RC_W(0) RC_W(1) RC_W(2) RC_W(3)
        x0 = rc8_load_n(x, xoff + j, left, 0);
        if (MR > 1)
            x1 = rc8_load_n(x, k + xoff + j, left, 0);
        RC_ACC(0, 0) RC_ACC(0, 1) RC_ACC(0, 2) RC_ACC(0, 3)
        RC_ACC(1, 0) RC_ACC(1, 1) RC_ACC(1, 2) RC_ACC(1, 3)
    }
    RC_SUM(0, 0) RC_SUM(0, 1) RC_SUM(0, 2) RC_SUM(0, 3)
    RC_SUM(1, 0) RC_SUM(1, 1) RC_SUM(1, 2) RC_SUM(1, 3)
}
#undef RC_W
#undef RC_ACC
#undef RC_SUM

/* Output columns [n0, n0 + NB) (fewer at the end of N) for every row of x. */
RC_INLINE void woq_block(const float *xf, const void *x, const int8_t *w, const float *s,
                         const void *b, void *y, int64_t m, int64_t n, int64_t k, int64_t g,
                         int64_t n0, int bf16)
{
    const int64_t nr = rc_min64(NB, n - n0), gs = k / g;
    const int8_t *wb = w + n0 * k;
    const float *sg = g > 1 ? s + n0 * g : NULL; /* per group: scaled as widened */
    float out[16 * NB] = {0};
    float wf[NB * KC] __attribute__((aligned(32)));
    for (int64_t k0 = 0; k0 < k; k0 += KC) {
        const int64_t k1 = rc_min64(k, k0 + KC), kc = k1 - k0;
        const int widen = m > MB;
        if (widen) /* the chunk as fp32 once, for every pair of rows */
            for (int64_t c = 0; c < nr; c++)
                for (int64_t j = 0; j < kc; j++)
                    wf[c * KC + j] = sg ? (float)wb[c * k + k0 + j] * sg[c * g + (k0 + j) / gs]
                                        : (float)wb[c * k + k0 + j];
        for (int64_t m0 = 0; m0 < m; m0 += MB) {
            const float *xr = xf + m0 * k;
            float *o = out + m0 * NB;
            const int two = m0 + 1 < m;
            if (widen) {
                if (nr == NB)
                    two ? dot_block(xr, k, NULL, wf, KC, 0, kc, k0, o, NULL, g, gs, 2, NB, 0)
                        : dot_block(xr, k, NULL, wf, KC, 0, kc, k0, o, NULL, g, gs, 1, NB, 0);
                else
                    for (int64_t c = 0; c < nr; c++)
                        two ? dot_block(xr, k, NULL, wf + c * KC, KC, 0, kc, k0, o + c, NULL, g, gs, 2, 1, 0)
                            : dot_block(xr, k, NULL, wf + c * KC, KC, 0, kc, k0, o + c, NULL, g, gs, 1, 1, 0);
            } else {
                const int8_t *wk = wb + k0;
                if (nr == NB)
                    two ? dot_block(xr, k, wk, NULL, k, 0, kc, k0, o, sg, g, gs, 2, NB, 1)
                        : dot_block(xr, k, wk, NULL, k, 0, kc, k0, o, sg, g, gs, 1, NB, 1);
                else
                    for (int64_t c = 0; c < nr; c++)
                        two ? dot_block(xr, k, wk + c * k, NULL, k, 0, kc, k0, o + c, sg ? sg + c * g : NULL, g, gs, 2, 1, 1)
                            : dot_block(xr, k, wk + c * k, NULL, k, 0, kc, k0, o + c, sg ? sg + c * g : NULL, g, gs, 1, 1, 1);
            }
        }
    }
    for (int64_t c = 0; c < nr; c++) {
        const float sc = sg ? 1.0f : s[n0 + c], bias = b ? rc_ld(b, n0 + c, bf16) : 0.0f;
        for (int64_t r = 0; r < m; r++) {
            float v = out[r * NB + c] * sc + bias;
            if (!isfinite(v))
                v = rc_woq_exact8(x, w, s, b, r, n0 + c, k, g, bf16);
            rc_st(y, r * n + n0 + c, v, bf16);
        }
    }
}

RC_WOQ_LINEAR(RC_INLINE, woq_linear, woq_block, NB)

void rc_woq_linear_f32_avx2(const void *x, const void *w, const void *s, const void *b, void *y,
                            int64_t m, int64_t n, int64_t k, int64_t g, int nt)
{
    woq_linear(x, w, s, b, y, m, n, k, g, nt, 0);
}

void rc_woq_linear_bf16_avx2(const void *x, const void *w, const void *s, const void *b, void *y,
                             int64_t m, int64_t n, int64_t k, int64_t g, int nt)
{
    woq_linear(x, w, s, b, y, m, n, k, g, nt, 1);
}

/* ---------------------------------------------------------------------------------------------
 * woq_int4_linear. The weight is 4 bits a value (an eighth of fp32's bytes), streamed once per
 * row of x and widened in registers: 8 bytes -> 8 int32 (vpmovzxbd) -> their low nibbles (the
 * even k) and high nibbles (the odd k) as two 8-lane fp32 vectors. x is copied once per call
 * into fp32 rows de-interleaved per 16 values (the 8 even then the 8 odd ones), so the two
 * vectors meet x in order. A group's partial sum of x * q is scaled once by its scale; the
 * mins enter as sum_g mn[g] * (sum of x over group g), those group sums taken once per call in
 * float64. Threads take blocks of NB weight rows; each x row walks the block's groups with NB
 * accumulators. */

/* xd row r: x row r (fp32) with each 16 values ordered as x[0], x[2], .., x[14], x[1], .., x[15];
 * xs[r * g + i]: the sum of group i of x row r. */
static void int4_prepare(const void *x, float *xd, float *xs, int64_t m, int64_t k, int64_t g,
                         int bf16)
{
    const int64_t gs = k / g;
    for (int64_t r = 0; r < m; r++) {
        for (int64_t j = 0; j < k; j += 16)
            for (int64_t i = 0; i < 8; i++) {
                xd[r * k + j + i] = rc_ld(x, r * k + j + 2 * i, bf16);
                xd[r * k + j + 8 + i] = rc_ld(x, r * k + j + 2 * i + 1, bf16);
            }
        for (int64_t i = 0; i < g; i++) {
            double t = 0.0;
            for (int64_t j = 0; j < gs; j++)
                t += rc_ld(x, r * k + i * gs + j, bf16);
            xs[r * g + i] = (float)t;
        }
    }
}

/* 16 codes of weight row wr from byte i: the even k (low nibbles) and the odd k (high). */
RC_INLINE void nibbles(const uint8_t *wr, int64_t i, __m256 *lo, __m256 *hi)
{
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wr + i)));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x0F)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
}

/* Output columns [n0, n0 + nr) (nr <= NB, a constant NR here) of every row of x. */
RC_INLINE void int4_block(const float *xd, const float *xs, const void *x, const uint8_t *w,
                          const float *s, const float *mn, const void *b, void *y, int64_t m,
                          int64_t n, int64_t k, int64_t g, int64_t n0, int bf16, const int NR)
{
    const int64_t gs = k / g, half = k / 2;
    for (int64_t r = 0; r < m; r++) {
        const float *xr = xd + r * k;
        __m256 acc[NB];
        for (int c = 0; c < NR; c++)
            acc[c] = _mm256_setzero_ps();
        for (int64_t i = 0; i < g; i++) {
            __m256 t[NB];
            for (int c = 0; c < NR; c++)
                t[c] = _mm256_setzero_ps();
            __m256 u[NB];
            for (int c = 0; c < NR; c++)
                u[c] = _mm256_setzero_ps();
            for (int64_t j = i * gs; j < (i + 1) * gs; j += 16) {
                const __m256 xe = _mm256_loadu_ps(xr + j), xo = _mm256_loadu_ps(xr + j + 8);
                for (int c = 0; c < NR; c++) {
                    __m256 lo, hi;
                    nibbles(w + (n0 + c) * half, j / 2, &lo, &hi);
                    t[c] = _mm256_fmadd_ps(xe, lo, t[c]);
                    u[c] = _mm256_fmadd_ps(xo, hi, u[c]);
                }
            }
            for (int c = 0; c < NR; c++)
                t[c] = _mm256_add_ps(t[c], u[c]);
            for (int c = 0; c < NR; c++)
                acc[c] = _mm256_fmadd_ps(t[c], _mm256_set1_ps(s[(n0 + c) * g + i]), acc[c]);
        }
        for (int c = 0; c < NR; c++) { /* plus mn . xs over the groups, 8 at a time */
            const int64_t col = n0 + c;
            __m256 t = acc[c];
            int64_t i = 0;
            for (; i + 8 <= g; i += 8)
                t = _mm256_fmadd_ps(_mm256_loadu_ps(mn + col * g + i),
                                    _mm256_loadu_ps(xs + r * g + i), t);
            float v = rc8_hsum(t);
            for (; i < g; i++)
                v += mn[col * g + i] * xs[r * g + i];
            if (b)
                v += rc_ld(b, col, bf16);
            if (!isfinite(v))
                v = rc_woq_exact4(x, w, s, mn, b, r, col, k, g, bf16);
            rc_st(y, r * n + col, v, bf16);
        }
    }
}

RC_INLINE void woq_int4_linear(const void *x, const void *w, const void *s, const void *mn,
                               const void *b, void *y, int64_t m, int64_t n, int64_t k,
                               int64_t g, int nt, int bf16)
{
    float *xd = malloc((size_t)(m * k + m * g + 1) * sizeof(float));
    if (!xd) { /* out of memory: the float64 formula needs no copy */
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < n; c++)
                rc_st(y, r * n + c, rc_woq_exact4(x, w, s, mn, b, r, c, k, g, bf16), bf16);
        return;
    }
    float *xs = xd + m * k;
    int4_prepare(x, xd, xs, m, k, g, bf16);
    const uint8_t *wq = (const uint8_t *)w;
    const float *sc = (const float *)s, *mins = (const float *)mn;
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k / 2 * NB))
    for (int64_t i = 0; i < (n + NB - 1) / NB; i++) {
        const int64_t n0 = i * NB;
        switch (rc_min64(NB, n - n0)) {
        case 4: int4_block(xd, xs, x, wq, sc, mins, b, y, m, n, k, g, n0, bf16, 4); break;
        case 3: int4_block(xd, xs, x, wq, sc, mins, b, y, m, n, k, g, n0, bf16, 3); break;
        case 2: int4_block(xd, xs, x, wq, sc, mins, b, y, m, n, k, g, n0, bf16, 2); break;
        default: int4_block(xd, xs, x, wq, sc, mins, b, y, m, n, k, g, n0, bf16, 1); break;
        }
    }
    free(xd);
}

void rc_woq_int4_linear_f32_avx2(const void *x, const void *w, const void *s, const void *mn,
                                 const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                 int64_t g, int nt)
{
    woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 0);
}

void rc_woq_int4_linear_bf16_avx2(const void *x, const void *w, const void *s, const void *mn,
                                  const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                  int64_t g, int nt)
{
    woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 1);
}
