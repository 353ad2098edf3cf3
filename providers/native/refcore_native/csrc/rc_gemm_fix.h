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
 * The bias joins the float64 sum before the one rounding, and the recomputed output's epilogue
 * (activation, residual) runs here in scalar C: a sum past FLT_MAX rounded to inf first and then
 * given a -inf bias was NaN where the reference's linear gives -inf (relu: 0), and a finite bias
 * could not bring a sum just past FLT_MAX back (found by refcore.fuzz).
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

/* x[row] . w[col] + b[col] in float64, rounded once to fp32 (b may be NULL: no bias). x is
 * (rows, K) in the kernel's dtype, b too. */
static inline float rc_dot_f64(const void *x, int64_t row, const void *w, int wkind, int bf16,
                               int64_t n, int64_t k, int64_t col, const void *b)
{
    double s = b ? (double)rc_ld(b, col, bf16) : 0.0;
    for (int64_t kk = 0; kk < k; kk++)
        s += (double)rc_ld(x, row * k + kk, bf16) * rc_w_at(w, wkind, bf16, n, k, col, kk);
    return (float)s;
}

/* The epilogue activations in scalar C (gemm.h's act codes: 0 none, 1 relu, 2 gelu (erf),
 * 3 gelu (tanh), 4 silu), the libm formulas of elementwise_portable.c. */
static inline float rc_act1(float v, int act)
{
    switch (act) {
    case 1: return v < 0.0f ? 0.0f : v; /* NaN stays NaN */
    case 2: return v * (0.5f * erfcf(-v * 0.70710678118654752f));
    case 3: return v / (1.0f + expf(v * (-1.5957691216057308f - 0.0713548162726f * v * v)));
    case 4: return v / (1.0f + expf(-v));
    default: return v;
    }
}

/* One output of the fused epilogue from its sum d (bias included): act(round(d)) + res[at], with
 * each intermediate rounded to the dtype as the unfused ops store it (the linear's output before
 * its activation, the activation's before the residual add). Kept in fp32, a bf16 sum just
 * below FLT_MAX gave silu 0 where its bf16 rounding (inf) gives NaN, and a residual cancelling
 * a sum of 1e38 kept digits the unfused ops round away (refcore.fuzz). res may be NULL. */
static inline float rc_epi1(float d, int act, const void *res, int64_t at, int bf16)
{
    float v = rc_act1(rc_round1(d, bf16), act);
    return res ? rc_round1(v, bf16) + rc_ld(res, at, bf16) : v;
}

/* Rows [m0, m0 + mr) x columns [n0, n0 + nr) of y (ld n): each output whose fp32 sum in the
 * block c (ld ldc) is not finite, recomputed as act(x . w + b) + res with the sum and bias in
 * float64. Call it after the level's epilogue (which wrote the fp32 block's outputs), only when
 * the block has a non-finite value (the level's vector check). x points at the batch item's
 * (M, K) input, w at its weight, res and y at its (M, N) residual and output; b, res may be
 * NULL. x, w, b, res and y are all fp32 or all bf16. */
static inline void rc_fix_block(const float *c, int64_t ldc, int64_t mr, int64_t nr,
                                const void *x, const void *w, int wkind, int bf16, int64_t n,
                                int64_t k, int64_t m0, int64_t n0, const void *b, const void *res,
                                void *y, int act)
{
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < nr; j++) {
            if (isfinite(c[r * ldc + j]))
                continue;
            const int64_t at = (m0 + r) * n + n0 + j;
            const float d = rc_dot_f64(x, m0 + r, w, wkind, bf16, n, k, n0 + j, b);
            rc_st(y, at, rc_epi1(d, act, res, at, bf16), bf16);
        }
}

#endif
