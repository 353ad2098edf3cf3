/* linalg family, AVX-512: linear for small M (fp32 FMA; bf16 widened to fp32, then FMA).
 * The driver is rc_gemv.h; this file supplies 16-lane fp32 loads and FMA.
 */
#include "linalg.h"
#include "rc_avx512.h"

typedef __m512 rc_acc_t;
#define RC_KSTEP 16
#define RC_ACC_ZERO _mm512_setzero_ps()
#define RC_FULL ((__mmask16)0xffff)
#define RC_MASK(n) rc_tail16(n)
#define RC_DOT(acc, xv, wv) _mm512_fmadd_ps((xv), (wv), (acc))
#define RC_HSUM(acc) _mm512_reduce_add_ps(acc)

/* es (element size) is a constant after inlining, so the branch folds away */
#define RC_XLOAD(p, m) (es == 2 ? rc_load_m((p), 0, (m), 1) : rc_load_m((p), 0, (m), 0))
#define RC_WLOAD(p, m) RC_XLOAD(p, m)

#include "rc_gemv.h"

void rc_linear_f32_avx512(const void *x, const void *w, const void *b, void *y, int64_t m,
                          int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * RC_NB * 4))
    for (int64_t i = 0; i < RC_NBLOCKS(n); i++)
        linear_block(x, w, b, y, m, n, k, i * RC_NB, 0);
}

void rc_linear_bf16_avx512(const void *x, const void *w, const void *b, void *y, int64_t m,
                           int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k * RC_NB * 4))
    for (int64_t i = 0; i < RC_NBLOCKS(n); i++)
        linear_block(x, w, b, y, m, n, k, i * RC_NB, 1);
}
