/* int8 family (specs/int8.yaml): per-tensor quantize / dequantize and qlinear (u8 activation x
 * s8 per-channel weight, exact int32 sums, fp32 output).
 *
 * quantize_per_tensor: x (n,) fp32 or bf16 -> q (n,) bytes, q = clamp(rint(x * inv) + zp, qmin,
 * qmax) with inv = float32(1 / scale) computed by the caller, rint half to even, NaN -> qmin;
 * sgn = 1 writes int8, 0 uint8 (qmin, qmax within that type's range, zp within [qmin, qmax]).
 * dequantize_per_tensor: q (n,) uint8 (sgn = 0) or int8 (sgn = 1) -> y (n,) fp32,
 * y = float32(q - zp) * scale.
 *
 * qlinear: x uint8 (M, K), w int8 (N, K), ws fp32 (N,), b fp32 (N,) or NULL, y fp32 (M, N); all
 * C-contiguous, K <= 65536 (int32 sums exact). acc = sum_k (x - zp) * w[n] in int32,
 * y = fma(float32(acc), float32(xs * ws[n]), b[n]). scratch: rc_qlinear_scratch_f32_avx2(m, n, k,
 * nt) bytes the kernel may overwrite (the activation widened to int16, a packed weight panel per
 * thread). nt: threads (1 = serial, 0 = OpenMP default), the same in both calls.
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
void rc_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                         void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                         int nt);

#endif
