/* quant family (specs/quant.yaml): woq_linear, a linear whose weight is int8 with one fp32 scale
 * per output channel (value = int8 * scale).
 *
 * x: (M, K) fp32 or bf16, w: int8 (N, K), s: fp32 (N, g) (g = 1: a scale per output channel;
 * else per group of K / g values along K, a multiple of 8), b: (N,) in x's dtype or NULL,
 * y: (M, N) in x's dtype; all C-contiguous, M <= 16 (the Python side declines larger M). Sums
 * are fp32 over the int8 values (per channel: times the scale after the sum; per group: each
 * widened weight times its group's scale), plus the bias, rounded once to y's dtype.
 * nt: threads (1 = serial, 0 = OpenMP default); work is split over N.
 * The AVX-512 kernels sum x * (int8 * group scale) as well, or the per-channel fp32 sum times the
 * scale; their woq_int4_linear dequantizes each weight to fp32 (q * s + mn rounded once, as the
 * oracle does) and sums x * W, so the mins need no group sums of x (see quant_avx512.c).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_QUANT_H
#define RC_QUANT_H
#include <stdint.h>

void rc_woq_linear_f32_avx2(const void *x, const void *w, const void *s, const void *b, void *y,
                            int64_t m, int64_t n, int64_t k, int64_t g, int nt);
void rc_woq_linear_bf16_avx2(const void *x, const void *w, const void *s, const void *b, void *y,
                             int64_t m, int64_t n, int64_t k, int64_t g, int nt);

/* woq_int4_linear: w uint8 (N, K / 2), two 4-bit codes per byte (low nibble: the even k),
 * s and mn fp32 (N, g) (value = q * s + mn per group of K / g values, a multiple of 16), b and y
 * as above, M <= 16. Per group, each row's fp32 sum of x * q is scaled once; the mins join as
 * mn . (the group sums of x); plus the bias, rounded once (non-finite outputs: float64). */
void rc_woq_int4_linear_f32_avx2(const void *x, const void *w, const void *s, const void *mn,
                                 const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                 int64_t g, int nt);
void rc_woq_int4_linear_bf16_avx2(const void *x, const void *w, const void *s, const void *mn,
                                  const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                  int64_t g, int nt);

void rc_woq_linear_f32_avx512(const void *x, const void *w, const void *s, const void *b, void *y,
                              int64_t m, int64_t n, int64_t k, int64_t g, int nt);
void rc_woq_linear_bf16_avx512(const void *x, const void *w, const void *s, const void *b,
                               void *y, int64_t m, int64_t n, int64_t k, int64_t g, int nt);
void rc_woq_int4_linear_f32_avx512(const void *x, const void *w, const void *s, const void *mn,
                                   const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                   int64_t g, int nt);
void rc_woq_int4_linear_bf16_avx512(const void *x, const void *w, const void *s, const void *mn,
                                    const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                    int64_t g, int nt);

#endif
