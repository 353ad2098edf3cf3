/* int8 family (specs/int8.yaml): per-tensor quantize / dequantize, qlinear (u8 activation x s8
 * per-channel weight, exact int32 sums, fp32 output), dynamic_qlinear (fp32 / bf16 rows quantized
 * per call) and qconv2d; qlinear and qconv2d also run the fused int8 ops of specs/fused.yaml
 * (qlinear_relu, qlinear_gelu, qconv2d_relu, qconv2d_add_relu) through their post argument.
 *
 * quantize_per_tensor: x (n,) fp32 or bf16 -> q (n,) bytes, q = clamp(rint(x * inv) + zp, qmin,
 * qmax) with inv = float32(1 / scale) computed by the caller, rint half to even, NaN -> qmin;
 * sgn = 1 writes int8, 0 uint8 (qmin, qmax within that type's range, zp within [qmin, qmax]).
 * dequantize_per_tensor: q (n,) uint8 (sgn = 0) or int8 (sgn = 1) -> y (n,) fp32,
 * y = float32(q - zp) * scale.
 *
 * qlinear: x uint8 (M, K), w int8 (N, K), ws fp32 (N,), b fp32 (N,) or NULL, y fp32 (M, N); all
 * C-contiguous, K <= 65536 (int32 sums exact). acc = sum_k (x - zp) * w[n] in int32,
 * y = fma(float32(acc), float32(xs * ws[n]), b[n]), then post (below; not 2). scratch:
 * rc_qlinear_scratch_f32_avx2(m, n, k, nt) bytes the kernel may overwrite (the activation widened
 * to int16 or copied to whole 4-byte quads, a packed weight panel per thread). nt: threads (1 =
 * serial, 0 = OpenMP default), the same in both calls. Returns 1 when the sums ran on the uint8
 * (vpmaddubsw) path, taken for m > 16 when every code of x is <= 127, else 0 (the int16 path; the
 * same sums either way).
 *
 * dynamic_qlinear: x fp32 or bf16 (M, K), each row quantized to uint8 with its own min-max scale
 * and zero point (the reference's float32 steps), then qlinear's sums and epilogue with the
 * row's scale in place of xs; y (M, N) in x's dtype (bf16: one rounding, to nearest even). A row
 * holding inf or NaN gives NaN. The same w, ws, b, nt and scratch (rc_qlinear_scratch) as qlinear.
 *
 * qconv2d: x uint8 NHWC (or NCHW: geo[18]), w int8 OHWI (O, kH, kW, C / G), ws fp32 (O,), b fp32
 * (O,) or NULL, y fp32 NHWC (N, Ho, Wo, O); geo: 19 int64, N H W C O G kH kW sH sW dH dW top left
 * Ho Wo Hp Wp nchw, with Hp = H + top + bottom, Wp = W + left + right, Ho = (Hp - dH (kH - 1) -
 * 1) / sH + 1 (Wo likewise), C and O multiples of G, C / G * kH * kW <= 65536. acc = the exact
 * int32 convolution of x - zp (padding: 0) with w, y = fma(float32(acc), float32(xs * ws[o]),
 * b[o]), then post. other: fp32 (N, O, Ho, Wo) of the output's shape, read only for post 2, as
 * NHWC memory (other_nchw 0) or NCHW (1); NULL otherwise. scratch:
 * rc_qconv2d_scratch_f32_avx2(geo, nt) bytes. Returns 1 when the uint8 path ran (every code of x
 * <= 127, and zp <= 127 unless there is no padding), else 0, as qlinear.
 *
 * post: the fused ops' post-op on the fp32 result, before its one store: 0 none, 1 relu (max(0, y),
 * NaN stays NaN), 2 relu(y + other) (qconv2d only), 3 gelu (erf), 4 gelu (tanh) (the vector gelu
 * of the fp32 GEMM epilogue, rc_avx2.h).
 *
 * rc_qlinear_q8 / rc_qconv2d_q8: the requantizing fused ops (qlinear_relu_quantize,
 * qlinear_gelu_quantize, qconv2d_relu_quantize): qlinear's / qconv2d's arguments (no other), y
 * of 1-byte codes in the fp32 output's shape, post 5 relu, 6 gelu (erf), 7 gelu (tanh). y =
 * float32(acc) * float32(xs * ws[o]) + b[o] (two roundings, not an fma: the reference's steps),
 * the activation, then quantize_per_tensor's steps with inv = float32(1 / output_scale), ozp,
 * qmin, qmax, sgn as rc_quantize_per_tensor's (relu keeps NaN, quantize maps it to qmin).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_INT8_H
#define RC_INT8_H
#include <stdint.h>

void rc_quantize_per_tensor_f32_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                     int qmin, int qmax, int sgn, int nt);
void rc_quantize_per_tensor_bf16_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                      int qmin, int qmax, int sgn, int nt);
void rc_dequantize_per_tensor_f32_avx2(const void *q, void *y, int64_t n, float scale, int zp,
                                       int sgn, int nt);

int64_t rc_qlinear_scratch_f32_avx2(int64_t m, int64_t n, int64_t k, int nt);
int rc_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                        void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                        int post, int nt);
int rc_qlinear_q8_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                       void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                       int post, float inv, int ozp, int qmin, int qmax, int sgn, int nt);
void rc_dynamic_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b,
                                 void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt);
void rc_dynamic_qlinear_bf16_avx2(const void *x, const void *w, const void *ws, const void *b,
                                  void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt);

int64_t rc_qconv2d_scratch_f32_avx2(const void *geo, int nt);
int rc_qconv2d_f32_avx2(const void *x, const void *w, const void *ws, const void *b,
                        const void *other, void *y, void *scratch, const void *geo, float xs,
                        int zp, int post, int other_nchw, int nt);
int rc_qconv2d_q8_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                       void *scratch, const void *geo, float xs, int zp, int post, float inv,
                       int ozp, int qmin, int qmax, int sgn, int nt);

/* the AVX-512 VNNI level (int8_avx512_bf16.c): the same contract; the sums are always exact
 * vpdpbusd on the uint8 codes, so the int-returning calls return 1 */
void rc_quantize_per_tensor_f32_avx512_bf16(const void *x, void *q, int64_t n, float inv, int zp,
                                            int qmin, int qmax, int sgn, int nt);
void rc_quantize_per_tensor_bf16_avx512_bf16(const void *x, void *q, int64_t n, float inv, int zp,
                                             int qmin, int qmax, int sgn, int nt);
void rc_dequantize_per_tensor_f32_avx512_bf16(const void *q, void *y, int64_t n, float scale,
                                              int zp, int sgn, int nt);

int64_t rc_qlinear_scratch_f32_avx512_bf16(int64_t m, int64_t n, int64_t k, int nt);
int rc_qlinear_f32_avx512_bf16(const void *x, const void *w, const void *ws, const void *b, void *y,
                               void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                               int post, int nt);
int rc_qlinear_q8_avx512_bf16(const void *x, const void *w, const void *ws, const void *b, void *y,
                              void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                              int post, float inv, int ozp, int qmin, int qmax, int sgn, int nt);
void rc_dynamic_qlinear_f32_avx512_bf16(const void *x, const void *w, const void *ws, const void *b,
                                        void *y, void *scratch, int64_t m, int64_t n, int64_t k,
                                        int nt);
void rc_dynamic_qlinear_bf16_avx512_bf16(const void *x, const void *w, const void *ws,
                                         const void *b, void *y, void *scratch, int64_t m,
                                         int64_t n, int64_t k, int nt);

int64_t rc_qconv2d_scratch_f32_avx512_bf16(const void *geo, int nt);
int rc_qconv2d_f32_avx512_bf16(const void *x, const void *w, const void *ws, const void *b,
                               const void *other, void *y, void *scratch, const void *geo, float xs,
                               int zp, int post, int other_nchw, int nt);
int rc_qconv2d_q8_avx512_bf16(const void *x, const void *w, const void *ws, const void *b, void *y,
                              void *scratch, const void *geo, float xs, int zp, int post, float inv,
                              int ozp, int qmin, int qmax, int sgn, int nt);

/* the AMX level (int8_amx.c: the VNNI file compiled with AMX; qlinear's GEMM on tdpbusd tiles from
 * M = 32): the same contract and return values */
void rc_quantize_per_tensor_f32_amx(const void *x, void *q, int64_t n, float inv, int zp, int qmin,
                                    int qmax, int sgn, int nt);
void rc_quantize_per_tensor_bf16_amx(const void *x, void *q, int64_t n, float inv, int zp, int qmin,
                                     int qmax, int sgn, int nt);
void rc_dequantize_per_tensor_f32_amx(const void *q, void *y, int64_t n, float scale, int zp,
                                      int sgn, int nt);

int64_t rc_qlinear_scratch_f32_amx(int64_t m, int64_t n, int64_t k, int nt);
int rc_qlinear_f32_amx(const void *x, const void *w, const void *ws, const void *b, void *y,
                       void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp, int post,
                       int nt);
int rc_qlinear_q8_amx(const void *x, const void *w, const void *ws, const void *b, void *y,
                      void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp, int post,
                      float inv, int ozp, int qmin, int qmax, int sgn, int nt);
void rc_dynamic_qlinear_f32_amx(const void *x, const void *w, const void *ws, const void *b,
                                void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt);
void rc_dynamic_qlinear_bf16_amx(const void *x, const void *w, const void *ws, const void *b,
                                 void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt);

int64_t rc_qconv2d_scratch_f32_amx(const void *geo, int nt);
int rc_qconv2d_f32_amx(const void *x, const void *w, const void *ws, const void *b,
                       const void *other, void *y, void *scratch, const void *geo, float xs, int zp,
                       int post, int other_nchw, int nt);
int rc_qconv2d_q8_amx(const void *x, const void *w, const void *ws, const void *b, void *y,
                      void *scratch, const void *geo, float xs, int zp, int post, float inv,
                      int ozp, int qmin, int qmax, int sgn, int nt);

#endif
