/* gemm family, AVX512-BF16: bf16 GEMM with vdpbf16ps over the amx_bf16_vnni2 layout (the
 * driver is rc_gemm_vnni.h), for CPUs with AVX512-BF16 but no AMX.
 */
#include "gemm.h"

#ifndef __AVX512BF16__
#error "gemm_avx512_bf16.c needs -mavx512bf16"
#endif

#define RC_VNNI_DPBF16 1
#include "rc_gemm_vnni.h"

int rc_gemm_bf16_avx512_bf16(const void *x, const void *w, const void *b, const void *res,
                             void *y, int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm_vnni(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt);
}

int rc_matmul_bf16_avx512_bf16(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                               int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm_vnni(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt);
}
