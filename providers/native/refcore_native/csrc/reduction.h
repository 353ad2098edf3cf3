/* reduction family (specs/reduction.yaml): softmax and log_softmax over the last dim.
 *
 * x, y: (rows, d) C-contiguous, d >= 1. nt: threads (1 = serial, 0 = OpenMP default).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_REDUCTION_H
#define RC_REDUCTION_H
#include <stdint.h>

void rc_softmax_f32_portable(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_softmax_bf16_portable(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_f32_portable(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_bf16_portable(const void *x, void *y, int64_t rows, int64_t d, int nt);

void rc_softmax_f32_avx2(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_softmax_bf16_avx2(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_f32_avx2(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_bf16_avx2(const void *x, void *y, int64_t rows, int64_t d, int nt);

void rc_softmax_f32_avx512(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_softmax_bf16_avx512(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_f32_avx512(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_bf16_avx512(const void *x, void *y, int64_t rows, int64_t d, int nt);

void rc_softmax_bf16_avx512_bf16(const void *x, void *y, int64_t rows, int64_t d, int nt);
void rc_log_softmax_bf16_avx512_bf16(const void *x, void *y, int64_t rows, int64_t d, int nt);

#endif
