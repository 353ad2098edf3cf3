/* linalg family, AVX2 + FMA: linear for small M (decode), fp32 and bf16 (widened, fp32 sums).
 *
 * y (M, N) = x (M, K) @ w (N, K).T + b with M <= 16. w is streamed once: threads take blocks of
 * NB = 4 of its rows (dynamically); for M = 1 each row is read front to back (dot_row), else
 * each block is walked in K chunks of KC elements (16 KB of
 * fp32 rows: the chunk stays in L1 while every pair of x rows passes over it), 2 x rows x 4 w
 * rows of 8-lane sums in registers (8 accumulators, 4 weight and 2 x vectors of the 16 ymm).
 * A bf16 x is widened once per call into an fp32 copy (M x K, small), a bf16 w per load.
 * Sums that come out inf or NaN are recomputed in float64 (rc_gemm_fix.h says why).
 * rc_gemv.h's driver (4 x 8 blocks) needs the 32 AVX-512 registers, hence this one.
 */
#include <stdlib.h>
#include <string.h>

#include "linalg.h"
#include "rc_gemm_avx2.h"
#include "rc_gemm_fix.h"

enum { NB = 4, MB = 2, KC = 1024 };

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* 8 weight values at element i (fp32, or bf16 widened); n < 8 reads lanes [0, n) only. */
static inline __attribute__((always_inline)) __m256 wload(const void *w, int64_t i, int64_t n,
                                                          int bf16)
{
    return rc2_load_n(w, i, n, bf16);
}

/* out[r * NB + c] += x[r] . w[c] over K range [k0, k1), r < MR, c < NR (constants). x fp32 rows
 * of ld k, w rows of ld k in the kernel's dtype. Named accumulators (see gemm_avx2.c). */
#define RC_ACC(r, c)                                                                               \
    if (MR > r && NR > c)                                                                          \
        a##r##c = _mm256_fmadd_ps(x##r, w##c, a##r##c);
#define RC_W(c)                                                                                    \
    if (NR > c)                                                                                    \
        w##c = wload(w, (c) * k + j, left, bf16);
#define RC_SUM(r, c)                                                                               \
    if (MR > r && NR > c)                                                                          \
        out[(r) * NB + (c)] += hsum(a##r##c);
static inline __attribute__((always_inline)) void dot_block(const float *x, const void *w,
                                                            int64_t k, int64_t k0, int64_t k1,
                                                            float *out, const int MR,
                                                            const int NR, int bf16)
{
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 w0 = a00, w1 = a00, w2 = a00, w3 = a00, x0 = a00, x1 = a00;
    int64_t j = k0, left = 8;
    for (; j + 8 <= k1; j += 8) { /* whole steps: plain loads */
        RC_W(0) RC_W(1) RC_W(2) RC_W(3)
        x0 = _mm256_loadu_ps(x + j);
        if (MR > 1)
            x1 = _mm256_loadu_ps(x + k + j);
        RC_ACC(0, 0) RC_ACC(0, 1) RC_ACC(0, 2) RC_ACC(0, 3)
        RC_ACC(1, 0) RC_ACC(1, 1) RC_ACC(1, 2) RC_ACC(1, 3)
    }
    if (j < k1) { /* the last step of K: lanes [0, left) only */
        left = k1 - j;
        RC_W(0) RC_W(1) RC_W(2) RC_W(3)
        x0 = rc2_load_n(x, j, left, 0);
        if (MR > 1)
            x1 = rc2_load_n(x, k + j, left, 0);
        RC_ACC(0, 0) RC_ACC(0, 1) RC_ACC(0, 2) RC_ACC(0, 3)
        RC_ACC(1, 0) RC_ACC(1, 1) RC_ACC(1, 2) RC_ACC(1, 3)
    }
    RC_SUM(0, 0) RC_SUM(0, 1) RC_SUM(0, 2) RC_SUM(0, 3)
    RC_SUM(1, 0) RC_SUM(1, 1) RC_SUM(1, 2) RC_SUM(1, 3)
}
#undef RC_ACC
#undef RC_W
#undef RC_SUM

/* x . w over K for one fp32 x row and one w row read front to back. For M = 1 (decode) no w
 * load is reused across x rows, and reading the block's rows one after another makes one
 * sequential stream per thread, which the hardware prefetcher follows: on the AMD EPYC Zen 3
 * project machine, bf16 1 x 1024 x 32000 (a 65 MB lm_head) went from ~9 to ~12-14 GB/s this way
 * against 4 interleaved row streams of 2 KB each (fp32, 4 KB rows: ~17 GB/s either way). */
static inline __attribute__((always_inline)) float dot_row(const float *x, const void *w,
                                                           int64_t k, int bf16)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= k; j += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), rc8_load(w, j, bf16), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 8), rc8_load(w, j + 8, bf16), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 16), rc8_load(w, j + 16, bf16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 24), rc8_load(w, j + 24, bf16), a3);
    }
    for (; j < k; j += 8) { /* lanes [0, left) only: nothing past either row is read */
        const int64_t left = rc_min64(8, k - j);
        a0 = _mm256_fmadd_ps(rc2_load_n(x, j, left, 0), rc2_load_n(w, j, left, bf16), a0);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* Output columns [n0, n0 + NB) (fewer at the end of N) for every row of x. */
static inline __attribute__((always_inline)) void linear_block(const float *xf, const void *x,
                                                               const void *w, const void *b,
                                                               void *y, int64_t m, int64_t n,
                                                               int64_t k, int64_t n0, int bf16)
{
    const int64_t es = bf16 ? 2 : 4, nr = rc_min64(NB, n - n0);
    const char *wb = (const char *)w + n0 * k * es;
    float out[16 * NB] = {0};
    if (m == 1) /* one stream per thread (dot_row) */
        for (int64_t c = 0; c < nr; c++)
            out[c] = dot_row(xf, wb + c * k * es, k, bf16);
    for (int64_t k0 = 0; m > 1 && k0 < k; k0 += KC) {
        const int64_t k1 = rc_min64(k, k0 + KC);
        for (int64_t m0 = 0; m0 < m; m0 += MB) {
            const float *xr = xf + m0 * k;
            float *o = out + m0 * NB;
            const int two = m0 + 1 < m;
            if (nr == NB)
                two ? dot_block(xr, wb, k, k0, k1, o, 2, NB, bf16)
                    : dot_block(xr, wb, k, k0, k1, o, 1, NB, bf16);
            else
                for (int64_t c = 0; c < nr; c++)
                    two ? dot_block(xr, wb + c * k * es, k, k0, k1, o + c, 2, 1, bf16)
                        : dot_block(xr, wb + c * k * es, k, k0, k1, o + c, 1, 1, bf16);
        }
    }
    for (int64_t c = 0; c < nr; c++) {
        const float bias = b ? rc_ld(b, n0 + c, bf16) : 0.0f;
        for (int64_t r = 0; r < m; r++) {
            float v = out[r * NB + c]; /* non-finite: the sum and bias in float64 (fix.h) */
            v = isfinite(v) ? v + bias : rc_dot_f64(x, r, w, 0, bf16, n, k, n0 + c, b);
            rc_st(y, r * n + n0 + c, v, bf16);
        }
    }
}

static inline __attribute__((always_inline)) void linear(const void *x, const void *w, const void *b, void *y, int64_t m, int64_t n,
                   int64_t k, int nt, int bf16)
{
    float *xf = (float *)x, stack[4096];
    if (bf16) {
        xf = m * k <= 4096 ? stack : malloc((size_t)(m * k * 4));
        if (!xf) { /* out of memory: the portable formula needs no copy */
            for (int64_t r = 0; r < m; r++)
                for (int64_t c = 0; c < n; c++)
                    rc_st(y, r * n + c, rc_dot_f64(x, r, w, 0, 1, n, k, c, b), 1);
            return;
        }
        for (int64_t i = 0; i < m * k; i++)
            xf[i] = rc_ld(x, i, 1);
    }
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * NB * 4))
    for (int64_t i = 0; i < (n + NB - 1) / NB; i++)
        linear_block(xf, x, w, b, y, m, n, k, i * NB, bf16);
    if (xf != x && xf != stack)
        free(xf);
}

void rc_linear_f32_avx2(const void *x, const void *w, const void *b, void *y, int64_t m,
                        int64_t n, int64_t k, int nt)
{
    linear(x, w, b, y, m, n, k, nt, 0);
}

void rc_linear_bf16_avx2(const void *x, const void *w, const void *b, void *y, int64_t m,
                         int64_t n, int64_t k, int nt)
{
    linear(x, w, b, y, m, n, k, nt, 1);
}

int rc_bf16_dot_clean_avx2(const void *t, int64_t n, int64_t k, int nt)
{
    const uint16_t *p = t;
    const float lim = (float)(0x1p102 / (double)(k > 1 ? k : 1));
    uint32_t bits;
    memcpy(&bits, &lim, sizeof bits);
    const uint16_t top = (uint16_t)(bits >> 16); /* truncated: a bound at most lim */
    uint16_t mx = 0, sub = 0;
    /* the mask forms (no branches) are what gcc vectorizes; subnormal: 1 <= |u| <= 0x7f */
#pragma omp parallel for num_threads(rc_threads(nt)) if (nt != 1 && n >= (1 << 18)) \
    reduction(max : mx) reduction(| : sub) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const uint16_t u = p[i] & 0x7fffu;
        mx = u > mx ? u : mx;
        sub |= (uint16_t)((uint16_t)(u - 1u) < 0x7fu);
    }
    return !sub && mx <= top;
}
