/* Shared by the weight-only linears of every level (quant_avx2.c, quant_avx512.c): the
 * reference's float64 formulas for one output, which recompute an output that came out inf or
 * NaN in fp32 (a finite result whose fp32 partial sums overflowed is then right, and inf * 0
 * stays NaN), and a bf16 input widened once per call into an fp32 copy (M x K, small).
 */
#ifndef RC_WOQ_H
#define RC_WOQ_H

#include <stdlib.h>

#include "rc_common.h"

/* woq_linear's output (r, c): x (M, K), w int8 (N, K), s fp32 (N, g), b (N,) or NULL */
static inline float rc_woq_exact8(const void *x, const int8_t *w, const float *s, const void *b,
                                  int64_t r, int64_t c, int64_t k, int64_t g, int bf16)
{
    double t = 0.0;
    for (int64_t j = 0; j < k; j++)
        t += (double)rc_ld(x, r * k + j, bf16) *
             ((double)w[c * k + j] * (double)s[c * g + j / (k / g)]);
    return (float)(t + (b ? (double)rc_ld(b, c, bf16) : 0.0));
}

/* woq_int4_linear's output (r, c): w uint8 (N, K / 2), the low nibble the even k; s, mn (N, g) */
static inline float rc_woq_exact4(const void *x, const uint8_t *w, const float *s,
                                  const float *mn, const void *b, int64_t r, int64_t c, int64_t k,
                                  int64_t g, int bf16)
{
    double t = 0.0;
    const int64_t gs = k / g;
    for (int64_t j = 0; j < k; j++) {
        const uint8_t byte = w[c * (k / 2) + j / 2];
        const double q = (j % 2) ? (byte >> 4) : (byte & 0x0F);
        t += (double)rc_ld(x, r * k + j, bf16) *
             (q * (double)s[c * g + j / gs] + (double)mn[c * g + j / gs]);
    }
    return (float)(t + (b ? (double)rc_ld(b, c, bf16) : 0.0));
}

#define RC_WOQ_STACK 4096

/* The n values of x as fp32: x itself (fp32), else widened into stack (RC_WOQ_STACK floats) when
 * they fit, else into a malloc'd copy; NULL when that fails. Release with rc_woq_f32_free. */
static inline float *rc_woq_f32(const void *x, int64_t n, int bf16, float *stack)
{
    if (!bf16)
        return (float *)x;
    float *xf = n <= RC_WOQ_STACK ? stack : malloc((size_t)n * sizeof(float));
    if (xf)
        for (int64_t i = 0; i < n; i++)
            xf[i] = rc_ld(x, i, 1);
    return xf;
}

static inline void rc_woq_f32_free(float *xf, const void *x, const float *stack)
{
    if (xf != x && xf != stack)
        free(xf);
}

/* The woq_linear driver of a level, as a function ``qual void name(x, w, s, b, y, m, n, k, g, nt,
 * bf16)``: x widened to fp32 once, then the output in blocks of ``nb`` columns by the level's
 * ``block(xf, x, w, s, b, y, m, n, k, g, n0, bf16)``; where no fp32 copy of x can be made, the
 * float64 formula per output. A macro, not a function taking the block: through a function
 * pointer the parallel loop no longer inlined the block and measured 15-38% slower (fp32). */
#define RC_WOQ_LINEAR(qual, name, block, nb)                                                     \
    qual void name(const void *x, const void *w, const void *s, const void *b, void *y,         \
                   int64_t m, int64_t n, int64_t k, int64_t g, int nt, int bf16)                 \
    {                                                                                            \
        float stack[RC_WOQ_STACK], *xf = rc_woq_f32(x, m * k, bf16, stack);                      \
        if (!xf) { /* out of memory: the float64 formula needs no copy */                        \
            for (int64_t r = 0; r < m; r++)                                                      \
                for (int64_t c = 0; c < n; c++)                                                  \
                    rc_st(y, r * n + c, rc_woq_exact8(x, w, s, b, r, c, k, g, 1), 1);            \
            return;                                                                              \
        }                                                                                        \
        RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * (nb)))                                         \
        for (int64_t i = 0; i < (n + (nb) - 1) / (nb); i++)                                      \
            block(xf, x, (const int8_t *)w, (const float *)s, b, y, m, n, k, g, i * (nb), bf16); \
        rc_woq_f32_free(xf, x, stack);                                                           \
    }

#endif
