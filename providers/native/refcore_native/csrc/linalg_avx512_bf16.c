/* linalg family, AVX512-BF16: bf16 linear for small M with vdpbf16ps (32 bf16 products per
 * instruction, pairwise summed into 16 fp32 lanes; the instruction rounds to nearest even and
 * treats denormals as zero, well inside the bf16 tolerance). The driver is rc_gemv.h.
 */
#include "linalg.h"
#include "rc_avx512.h"

#ifndef __AVX512BF16__
#error "linalg_avx512_bf16.c needs -mavx512bf16"
#endif

typedef __m512 rc_acc_t;
#define RC_KSTEP 32
#define RC_ACC_ZERO _mm512_setzero_ps()
#define RC_FULL ((__mmask32)0xffffffffu)
#define RC_MASK(n) ((n) >= 32 ? RC_FULL : (__mmask32)((1u << (n)) - 1u))
#define RC_XLOAD(p, m) ((__m512bh)_mm512_maskz_loadu_epi16((m), (p)))
#define RC_WLOAD(p, m) RC_XLOAD(p, m)
#define RC_DOT(acc, xv, wv) _mm512_dpbf16_ps((acc), (xv), (wv))
#define RC_HSUM(acc) _mm512_reduce_add_ps(acc)

#include "rc_gemv.h"

void rc_linear_bf16_avx512_bf16(const void *x, const void *w, const void *b, void *y, int64_t m,
                                int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * RC_NB * 4))
    for (int64_t i = 0; i < RC_NBLOCKS(n); i++)
        linear_block(x, w, b, y, m, n, k, i * RC_NB, 1);
}
