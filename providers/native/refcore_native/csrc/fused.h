/* fused family (specs/fused.yaml): add_relu, add_gelu (erf, tanh), add_silu, add_layer_norm.
 *
 * y (rows, d) C-contiguous; row i of the operands starts at element i * a_rs of a and i * b_rs
 * of b, where a_rs and b_rs are d (a full operand) or 0 (a row broadcast over every row).
 * add_<act>: y = act(a + b). add_layer_norm: y = layer_norm(a + b) over each row of d, with w,
 * bias (d,) or NULL (ones / zeros); eps >= 0 or NaN. The sum is rounded to the dtype before the
 * activation or the norm, as the unfused ops do. nt: threads (1 = serial, 0 = OpenMP default).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_FUSED_H
#define RC_FUSED_H
#include <stdint.h>

void rc_add_relu_f32_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                              int64_t a_rs, int64_t b_rs, int nt);
void rc_add_relu_bf16_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                               int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_f32_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                              int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_bf16_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                               int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_f32_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                   int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_bf16_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                    int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_f32_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                              int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_bf16_portable(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                               int64_t a_rs, int64_t b_rs, int nt);
void rc_add_layer_norm_f32_portable(const void *a, const void *b, const void *w,
                                    const void *bias, void *y, int64_t rows, int64_t d,
                                    int64_t a_rs, int64_t b_rs, double eps, int nt);
void rc_add_layer_norm_bf16_portable(const void *a, const void *b, const void *w,
                                     const void *bias, void *y, int64_t rows, int64_t d,
                                     int64_t a_rs, int64_t b_rs, double eps, int nt);

void rc_add_relu_f32_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                          int64_t a_rs, int64_t b_rs, int nt);
void rc_add_relu_bf16_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                           int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_f32_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                          int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_bf16_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                           int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_f32_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                               int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_bf16_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_f32_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                          int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_bf16_avx2(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                           int64_t a_rs, int64_t b_rs, int nt);
void rc_add_layer_norm_f32_avx2(const void *a, const void *b, const void *w,
                                const void *bias, void *y, int64_t rows, int64_t d,
                                int64_t a_rs, int64_t b_rs, double eps, int nt);
void rc_add_layer_norm_bf16_avx2(const void *a, const void *b, const void *w,
                                 const void *bias, void *y, int64_t rows, int64_t d,
                                 int64_t a_rs, int64_t b_rs, double eps, int nt);

void rc_add_relu_f32_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                            int64_t a_rs, int64_t b_rs, int nt);
void rc_add_relu_bf16_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                             int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_f32_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                            int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_bf16_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                             int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_f32_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                 int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_bf16_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                  int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_f32_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                            int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_bf16_avx512(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                             int64_t a_rs, int64_t b_rs, int nt);
void rc_add_layer_norm_f32_avx512(const void *a, const void *b, const void *w,
                                  const void *bias, void *y, int64_t rows, int64_t d,
                                  int64_t a_rs, int64_t b_rs, double eps, int nt);
void rc_add_layer_norm_bf16_avx512(const void *a, const void *b, const void *w,
                                   const void *bias, void *y, int64_t rows, int64_t d,
                                   int64_t a_rs, int64_t b_rs, double eps, int nt);

void rc_add_relu_bf16_avx512_bf16(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                  int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_bf16_avx512_bf16(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                  int64_t a_rs, int64_t b_rs, int nt);
void rc_add_gelu_tanh_bf16_avx512_bf16(const void *a, const void *b, void *y, int64_t rows,
                                       int64_t d, int64_t a_rs, int64_t b_rs, int nt);
void rc_add_silu_bf16_avx512_bf16(const void *a, const void *b, void *y, int64_t rows, int64_t d,
                                  int64_t a_rs, int64_t b_rs, int nt);
void rc_add_layer_norm_bf16_avx512_bf16(const void *a, const void *b, const void *w,
                                        const void *bias, void *y, int64_t rows, int64_t d,
                                        int64_t a_rs, int64_t b_rs, double eps, int nt);

#endif
