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

/* group_norm (and group_norm_silu: silu = 1), NCHW (cl = 0) or channels-last (cl = 1); see
 * rc_group_norm.h for the layouts and the scratch `work` (fp32, rc_group_norm_work floats). */
void rc_group_norm_f32_portable(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_bf16_portable(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_f32_avx2(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_bf16_avx2(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_f32_avx512(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_bf16_avx512(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);
void rc_group_norm_bf16_avx512_bf16(const void *x, const void *w, const void *b, void *y, int64_t n,
    int64_t c, int64_t hw, int64_t g, int cl, int silu, double eps, int64_t parts, void *work,
    int nt);

/* channel_affine (specs/fused.yaml): y = x * scale[c] + shift[c]; see rc_channel_affine.h. */
void rc_channel_affine_f32_portable(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_bf16_portable(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_f32_avx2(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_bf16_avx2(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_f32_avx512(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_bf16_avx512(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);
void rc_channel_affine_bf16_avx512_bf16(const void *x, const void *scale, const void *shift,
    void *y, int64_t n, int64_t c, int64_t hw, int cl, void *work, int nt);

#endif
