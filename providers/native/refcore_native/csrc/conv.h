/* conv family: conv2d and the fused conv2d_relu / conv2d_add_relu (specs/conv.yaml, fused.yaml)
 * on channels-last (NHWC) activations, groups 1, dilation 1.
 *
 * x (n, h, w, c) dense NHWC; wt (o, kh, kw, c) dense (OHWI: torch's channels-last weight
 * memory); b (o,) or NULL; res (n, ho, wo, o) dense NHWC or NULL; y (n, ho, wo, o) dense NHWC,
 * all in the kernel's dtype (bf16 as its bits). y = act(conv(x, wt) + b + res) with fp32
 * accumulation and one rounding; act: 0 none, 1 relu (the codes of rc_gemm.h). Zero padding
 * ph (top), pw (left); bottom / right padding is whatever ho, wo imply (ho = (h + ph + pb - kh) /
 * sh + 1). Sizes fit in int32 (checked in Python). nt: threads (1 serial, 0 OpenMP default).
 * relu is max(0, v) + (v - v): the same for a finite sum v, NaN for v = -inf (an fp32 partial sum
 * overflowed where the exact sum may be finite: relu 0 where the reference gave 5, found by
 * checking conv2d_relu against the GEMMs' overflow rule), so the caller's check of the output
 * (refcore_native/conv.py) redoes the call. Returns 0, or -1 when scratch memory ran out.
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_CONV_FAMILY_H
#define RC_CONV_FAMILY_H
#include <stdint.h>

int rc_conv2d_bf16_amx(const void *x, const void *wt, const void *b, const void *res, void *y,
                       int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                       int64_t wo, int act, int nt);

int rc_conv2d_f32_avx512(const void *x, const void *wt, const void *b, const void *res, void *y,
                         int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                         int64_t wo, int act, int nt);

int rc_conv2d_f32_avx2(const void *x, const void *wt, const void *b, const void *res, void *y,
                       int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                       int64_t wo, int act, int nt);
int rc_conv2d_bf16_avx2(const void *x, const void *wt, const void *b, const void *res, void *y,
                        int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                        int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                        int64_t wo, int act, int nt);

int rc_conv2d_f32_portable(const void *x, const void *wt, const void *b, const void *res, void *y,
                           int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                           int64_t wo, int act, int nt);
int rc_conv2d_bf16_portable(const void *x, const void *wt, const void *b, const void *res,
                            void *y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t o,
                            int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                            int64_t ho, int64_t wo, int act, int nt);

#endif
