/* linalg family, portable C: linear for small M, y = x @ w.T + b, fp32 accumulation.
 *
 * One output column n (a row of w) per iteration, split over the threads; each dot product uses
 * 8 partial sums (vectorizable without reassociation flags). bf16 is widened exactly; the fp32
 * sum plus bias is rounded once (RNE), as torch's bf16 GEMM does. Non-finite sums are
 * recomputed in float64 (rc_gemm_fix.h).
 */
#include "linalg.h"
#include "rc_common.h"
#include "rc_gemm_fix.h"

enum { P = 8 };

static inline float dot(const void *x, const void *w, int64_t k, int bf16)
{
    float s[P] = {0};
    int64_t j = 0;
    for (; j + P <= k; j += P)
        for (int q = 0; q < P; q++)
            s[q] += rc_ld(x, j + q, bf16) * rc_ld(w, j + q, bf16);
    for (; j < k; j++)
        s[0] += rc_ld(x, j, bf16) * rc_ld(w, j, bf16);
    float t = 0.0f;
    for (int q = 0; q < P; q++)
        t += s[q];
    return t;
}

static inline void column(const void *x, const void *w, const void *b, void *y, int64_t m,
                          int64_t n, int64_t k, int64_t c, int bf16)
{
    const int64_t es = bf16 ? 2 : 4;
    const char *wc = (const char *)w + c * k * es;
    float bias = b ? rc_ld(b, c, bf16) : 0.0f;
    for (int64_t r = 0; r < m; r++) {
        float d = dot((const char *)x + r * k * es, wc, k, bf16);
        /* overflowed partial sums: the sum and bias in float64 (see rc_gemm_fix.h) */
        d = isfinite(d) ? d + bias : rc_dot_f64(x, r, w, 0, bf16, n, k, c, b);
        rc_st(y, r * n + c, d, bf16);
    }
}

void rc_linear_f32_portable(const void *x, const void *w, const void *b, void *y, int64_t m,
                            int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * 4))
    for (int64_t c = 0; c < n; c++)
        column(x, w, b, y, m, n, k, c, 0);
}

void rc_linear_bf16_portable(const void *x, const void *w, const void *b, void *y, int64_t m,
                             int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * 4))
    for (int64_t c = 0; c < n; c++)
        column(x, w, b, y, m, n, k, c, 1);
}
