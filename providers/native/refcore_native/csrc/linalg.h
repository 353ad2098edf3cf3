/* linalg family (specs/linalg.yaml): linear for small M (the LLM decode case).
 *
 * x: (M, K), w: (N, K), b: (N,) or NULL, y: (M, N), all C-contiguous, M <= 16 (the Python side
 * declines larger M). bf16 kernels take bf16 x, w, b and write bf16 y; accumulation is fp32.
 * nt: threads (1 = serial, 0 = OpenMP default); work is split over N.
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_LINALG_H
#define RC_LINALG_H
#include <stdint.h>

void rc_linear_f32_portable(const void *x, const void *w, const void *b, void *y, int64_t m,
                            int64_t n, int64_t k, int nt);
void rc_linear_bf16_portable(const void *x, const void *w, const void *b, void *y, int64_t m,
                             int64_t n, int64_t k, int nt);

void rc_linear_f32_avx2(const void *x, const void *w, const void *b, void *y, int64_t m,
                        int64_t n, int64_t k, int nt);
void rc_linear_bf16_avx2(const void *x, const void *w, const void *b, void *y, int64_t m,
                         int64_t n, int64_t k, int nt);

void rc_linear_f32_avx512(const void *x, const void *w, const void *b, void *y, int64_t m,
                          int64_t n, int64_t k, int nt);
void rc_linear_bf16_avx512(const void *x, const void *w, const void *b, void *y, int64_t m,
                           int64_t n, int64_t k, int nt);

/* 1 when the n bf16 values at t (dense) hold no subnormal, Inf or NaN and max|t| <= 2^102 / k:
 * then products with them in dot products of length k that read the other operand's
 * subnormals as 0 (vdpbf16ps, AMX tiles) lose at most 2^-24 in all (refcore_native/_runtime.py,
 * bf16_dots_exact). nt as above. */
int rc_bf16_dot_clean_avx2(const void *t, int64_t n, int64_t k, int nt);

void rc_linear_bf16_avx512_bf16(const void *x, const void *w, const void *b, void *y, int64_t m,
                                int64_t n, int64_t k, int nt);

#endif
