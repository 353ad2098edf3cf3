/* gemm family: linear for M > 16 and the fused linear ops (specs/linalg.yaml, specs/fused.yaml).
 *
 * y (M, N) = act(x (M, K) @ w.T + b) + res: x, b (N,) or NULL, res (M, N) or NULL, y all
 * C-contiguous in the kernel's dtype (bf16 as its bits); fp32 accumulation, one rounding.
 * w is the plain (N, K) weight when packed == 0 (the kernel packs it panel by panel per call),
 * else the level's layout of specs/layouts.yaml (bf16: amx_bf16_vnni2, fp32:
 * avx512_f32_panel32, also read by the avx2 level; the portable level reads plain weights only). act: 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh), 4 silu.
 * rc_matmul_*: batch products y[i] (M, N) = x[i] (M, K) @ w[i] (K, N), x[i] at x + i * xs and
 * w[i] at w + i * ws elements (a stride 0 shares the operand), y dense.
 * nt: threads (1 serial, 0 OpenMP default). Returns 0, or -1 when scratch memory ran out.
 * rc_gemm_pack_* writes a layout's packed array.
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_GEMM_FAMILY_H
#define RC_GEMM_FAMILY_H
#include <stdint.h>

int rc_gemm_bf16_amx(const void *x, const void *w, const void *b, const void *res, void *y,
                     int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_bf16_amx(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                       int64_t ws, int64_t m, int64_t n, int64_t k, int nt);
void rc_gemm_pack_bf16_amx(const void *w, void *wp, int64_t n, int64_t k, int nt);

int rc_gemm_f32_avx512(const void *x, const void *w, const void *b, const void *res, void *y,
                       int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_f32_avx512(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                         int64_t ws, int64_t m, int64_t n, int64_t k, int nt);
void rc_gemm_pack_f32_avx512(const void *w, void *wp, int64_t n, int64_t k, int nt);

int rc_gemm_bf16_avx512_bf16(const void *x, const void *w, const void *b, const void *res,
                             void *y, int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_bf16_avx512_bf16(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                               int64_t ws, int64_t m, int64_t n, int64_t k, int nt);
int rc_gemm_bf16_avx512(const void *x, const void *w, const void *b, const void *res, void *y,
                        int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_bf16_avx512(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                          int64_t ws, int64_t m, int64_t n, int64_t k, int nt);

int rc_gemm_f32_avx2(const void *x, const void *w, const void *b, const void *res, void *y,
                     int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_f32_avx2(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                       int64_t ws, int64_t m, int64_t n, int64_t k, int nt);
void rc_gemm_pack_f32_avx2(const void *w, void *wp, int64_t n, int64_t k, int nt);
int rc_gemm_bf16_avx2(const void *x, const void *w, const void *b, const void *res, void *y,
                      int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_bf16_avx2(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                        int64_t ws, int64_t m, int64_t n, int64_t k, int nt);

int rc_gemm_f32_portable(const void *x, const void *w, const void *b, const void *res, void *y,
                         int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_gemm_bf16_portable(const void *x, const void *w, const void *b, const void *res, void *y,
                          int64_t m, int64_t n, int64_t k, int packed, int act, int nt);
int rc_matmul_f32_portable(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                           int64_t ws, int64_t m, int64_t n, int64_t k, int nt);
int rc_matmul_bf16_portable(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                            int64_t ws, int64_t m, int64_t n, int64_t k, int nt);

#endif
