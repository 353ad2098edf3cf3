/* elementwise family (specs/elementwise.yaml): gelu (erf and tanh), silu, add.
 *
 * Unary: x, y hold n elements. add: a, b, y hold n elements (same shape), y = a + alpha * b.
 * add_row: full is (rows, d), row is (d,); y = full + alpha * row, or row + alpha * full when
 * row_is_input is 1. nt: threads (1 = serial, 0 = OpenMP default).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_ELEMENTWISE_H
#define RC_ELEMENTWISE_H
#include <stdint.h>

void rc_gelu_f32_portable(const void *x, void *y, int64_t n, int nt);
void rc_gelu_bf16_portable(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_f32_portable(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_bf16_portable(const void *x, void *y, int64_t n, int nt);
void rc_silu_f32_portable(const void *x, void *y, int64_t n, int nt);
void rc_silu_bf16_portable(const void *x, void *y, int64_t n, int nt);
void rc_add_f32_portable(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_bf16_portable(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_row_f32_portable(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                             float alpha, int row_is_input, int nt);
void rc_add_row_bf16_portable(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                              float alpha, int row_is_input, int nt);

void rc_gelu_f32_avx2(const void *x, void *y, int64_t n, int nt);
void rc_gelu_bf16_avx2(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_f32_avx2(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_bf16_avx2(const void *x, void *y, int64_t n, int nt);
void rc_silu_f32_avx2(const void *x, void *y, int64_t n, int nt);
void rc_silu_bf16_avx2(const void *x, void *y, int64_t n, int nt);
void rc_add_f32_avx2(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_bf16_avx2(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_row_f32_avx2(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                         float alpha, int row_is_input, int nt);
void rc_add_row_bf16_avx2(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                          float alpha, int row_is_input, int nt);

void rc_gelu_f32_avx512(const void *x, void *y, int64_t n, int nt);
void rc_gelu_bf16_avx512(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_f32_avx512(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_bf16_avx512(const void *x, void *y, int64_t n, int nt);
void rc_silu_f32_avx512(const void *x, void *y, int64_t n, int nt);
void rc_silu_bf16_avx512(const void *x, void *y, int64_t n, int nt);
void rc_add_f32_avx512(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_bf16_avx512(const void *a, const void *b, void *y, int64_t n, float alpha, int nt);
void rc_add_row_f32_avx512(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                           float alpha, int row_is_input, int nt);
void rc_add_row_bf16_avx512(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                            float alpha, int row_is_input, int nt);

void rc_gelu_bf16_avx512_bf16(const void *x, void *y, int64_t n, int nt);
void rc_gelu_tanh_bf16_avx512_bf16(const void *x, void *y, int64_t n, int nt);
void rc_silu_bf16_avx512_bf16(const void *x, void *y, int64_t n, int nt);
void rc_add_bf16_avx512_bf16(const void *a, const void *b, void *y, int64_t n, float alpha,
                             int nt);
void rc_add_row_bf16_avx512_bf16(const void *full, const void *row, void *y, int64_t rows,
                                 int64_t d, float alpha, int row_is_input, int nt);

#endif
