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

void rc_linear_bf16_avx512_bf16(const void *x, const void *w, const void *b, void *y, int64_t m,
                                int64_t n, int64_t k, int nt);

#endif
