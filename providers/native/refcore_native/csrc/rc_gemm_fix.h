/* Non-finite GEMM sums recomputed in float64 (portable C, shared by every level's driver).
 *
 * Why: with fp32 accumulation, products that overflow to +inf and -inf meet in some partial sum
 * and give NaN (inf - inf), where the exact sum (and the float64 reference, and usually torch's
 * sequential FMA chain, in which a running inf absorbs later products) overflows to one
 * infinity, or is even finite (1e40 - 1e40). Which partial sums overflow depends on the
 * summation order (register blocks, lanes, K splits), so no fp32 order is right in general.
 * A sum that came out inf or NaN is therefore recomputed here in float64 from its operands:
 * fp32 (and bf16) products cannot overflow in float64, so the result is the reference's (its
 * NaN, inf and sign included), rounded once. Finite sums never come here: the check is one
 * subtraction per output vector, the recomputation K multiply-adds per non-finite output.
 * Limitation: the bias is added afterwards in fp32 (a sum just above FLT_MAX with a bias that
 * would bring it back below stays inf).
 *
 * The weight is read through rc_w_at: wkind 0 = plain (N, K), 1 = the level's packed layout
 * (fp32: avx512_f32_panel32, bf16: amx_bf16_vnni2), 2 = matmul's (K, N).
 */
#ifndef RC_GEMM_FIX_H
#define RC_GEMM_FIX_H

#include "rc_common.h"

/* Element (row j of N, column kk of K) of the weight w (see the header comment). */
static inline double rc_w_at(const void *w, int wkind, int bf16, int64_t n, int64_t k, int64_t j,
                             int64_t kk)
{
    int64_t i;
    if (wkind == 0)
        i = j * k + kk;
    else if (wkind == 2)
        i = kk * n + j;
    else if (!bf16) /* avx512_f32_panel32: (ceil(N/32), K, 32) */
        i = (j / 32) * k * 32 + kk * 32 + j % 32;
    else /* amx_bf16_vnni2: (ceil(N/16), ceil(K/32), 16, 16, 2) */
        i = (((j / 16) * ((k + 31) / 32) + kk / 32) * 16 + (kk % 32) / 2) * 32 + (j % 16) * 2 +
            kk % 2;
    return (double)rc_ld(w, i, bf16);
}

/* x[row] . w[col] in float64, rounded once to fp32. x is (rows, K) in the kernel's dtype. */
static inline float rc_dot_f64(const void *x, int64_t row, const void *w, int wkind, int bf16,
                               int64_t n, int64_t k, int64_t col)
{
    double s = 0.0;
    for (int64_t kk = 0; kk < k; kk++)
        s += (double)rc_ld(x, row * k + kk, bf16) * rc_w_at(w, wkind, bf16, n, k, col, kk);
    return (float)s;
}

/* Every non-finite value of the fp32 block c (rows [m0, m0 + mr) x columns [n0, n0 + nr) of
 * x @ W, ld ldc) recomputed in float64. x points at the batch item's (M, K) input, w at its
 * weight. Call it only when the block has a non-finite value (the level's vector check). */
static inline void rc_fix_block(float *c, int64_t ldc, int64_t mr, int64_t nr, const void *x,
                                const void *w, int wkind, int bf16, int64_t n, int64_t k,
                                int64_t m0, int64_t n0)
{
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < nr; j++)
            if (!isfinite(c[r * ldc + j]))
                c[r * ldc + j] = rc_dot_f64(x, m0 + r, w, wkind, bf16, n, k, n0 + j);
}

#endif
