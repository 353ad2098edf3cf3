/* gemm family, portable C: the fallback of every GEMM kernel (plain weights only), fp32 sums.
 *
 * One output row per iteration, split over the threads; each element a dot product with 8
 * partial sums (vectorizable without reassociation flags) for a (N, K) weight, a strided one for
 * matmul's (K, N). The epilogue uses the scalar libm formulas of elementwise_portable.c.
 * Non-finite sums are recomputed in float64 (rc_gemm_fix.h).
 */
#include "gemm.h"
#include "rc_common.h"
#include "rc_gemm_fix.h"

enum { P = 8, NONE = 0 }; /* act codes: gemm.h */

/* x row . column c of w: w (N, K) when ldw_k == 1 (row c), w (K, N) when ldw_k == N. */
static inline float dot(const void *x, const void *w, int64_t c, int64_t k, int64_t n, int kn,
                        int bf16)
{
    float s[P] = {0};
    int64_t j = 0;
    if (!kn) {
        const int64_t o = c * k;
        for (; j + P <= k; j += P)
            for (int q = 0; q < P; q++)
                s[q] += rc_ld(x, j + q, bf16) * rc_ld(w, o + j + q, bf16);
        for (; j < k; j++)
            s[0] += rc_ld(x, j, bf16) * rc_ld(w, o + j, bf16);
    } else {
        for (; j < k; j++)
            s[j % P] += rc_ld(x, j, bf16) * rc_ld(w, j * n + c, bf16);
    }
    float t = 0.0f;
    for (int q = 0; q < P; q++)
        t += s[q];
    return t;
}

static void gemm(const void *x, const void *w, const void *b, const void *res, void *y,
                 int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n, int64_t k, int kn,
                 int act, int nt, int bf16)
{
    const int64_t es = bf16 ? 2 : 4;
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(n * k * es))
    for (int64_t row = 0; row < batch * m; row++) {
        const int64_t bi = row / m, r = row % m;
        const char *xr = (const char *)x + (bi * xs + r * k) * es;
        const char *wi = (const char *)w + bi * ws * es;
        for (int64_t c = 0; c < n; c++) {
            float d = dot(xr, wi, c, k, n, kn, bf16);
            d = isfinite(d) ? d + (b ? rc_ld(b, c, bf16) : 0.0f)
                            : rc_dot_f64(xr, 0, wi, kn ? 2 : 0, bf16, n, k, c, b); /* fix.h */
            rc_st(y, row * n + c, rc_epi1(d, act, res, row * n + c, bf16), bf16);
        }
    }
}

int rc_gemm_f32_portable(const void *x, const void *w, const void *b, const void *res, void *y,
                         int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    (void)packed; /* no packed layout at this level (gemm.py never passes one) */
    gemm(x, w, b, res, y, 1, 0, 0, m, n, k, 0, act, nt, 0);
    return 0;
}

int rc_gemm_bf16_portable(const void *x, const void *w, const void *b, const void *res, void *y,
                          int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    (void)packed;
    gemm(x, w, b, res, y, 1, 0, 0, m, n, k, 0, act, nt, 1);
    return 0;
}

int rc_matmul_f32_portable(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                           int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 1, NONE, nt, 0);
    return 0;
}

int rc_matmul_bf16_portable(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                            int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 1, NONE, nt, 1);
    return 0;
}
