/* norm family (specs/norm.yaml): one prototype per kernel and ISA level.
 *
 * x, y: (rows, d) C-contiguous; w, b: (d,) or NULL (ones / zeros). bf16 kernels take bf16
 * weight and bias. eps >= 0 or NaN (every output NaN). nt: threads (1 = serial, 0 = OpenMP
 * default).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_NORM_H
#define RC_NORM_H
#include <stdint.h>

void rc_layer_norm_f32_portable(const void *x, const void *w, const void *b, void *y,
                                int64_t rows, int64_t d, double eps, int nt);
void rc_layer_norm_bf16_portable(const void *x, const void *w, const void *b, void *y,
                                 int64_t rows, int64_t d, double eps, int nt);
void rc_rms_norm_f32_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                              double eps, int nt);
void rc_rms_norm_bf16_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                               double eps, int nt);

void rc_layer_norm_f32_avx2(const void *x, const void *w, const void *b, void *y, int64_t rows,
                            int64_t d, double eps, int nt);
void rc_layer_norm_bf16_avx2(const void *x, const void *w, const void *b, void *y, int64_t rows,
                             int64_t d, double eps, int nt);
void rc_rms_norm_f32_avx2(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                          double eps, int nt);
void rc_rms_norm_bf16_avx2(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                           double eps, int nt);

void rc_layer_norm_f32_avx512(const void *x, const void *w, const void *b, void *y,
                              int64_t rows, int64_t d, double eps, int nt);
void rc_layer_norm_bf16_avx512(const void *x, const void *w, const void *b, void *y,
                               int64_t rows, int64_t d, double eps, int nt);
void rc_rms_norm_f32_avx512(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                            double eps, int nt);
void rc_rms_norm_bf16_avx512(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                             double eps, int nt);

void rc_layer_norm_bf16_avx512_bf16(const void *x, const void *w, const void *b, void *y,
                                    int64_t rows, int64_t d, double eps, int nt);
void rc_rms_norm_bf16_avx512_bf16(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                                  double eps, int nt);

#endif
