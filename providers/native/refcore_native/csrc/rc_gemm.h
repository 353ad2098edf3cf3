/* Helpers of the GEMM family (gemm_amx.c, gemm_avx512.c): weight panel packing and the fused
 * epilogue. AVX-512 only (include after rc_avx512.h).
 *
 * Packing is a 16 x 16 transpose of 32-bit elements: for the AMX VNNI-2 tile a 32-bit element is
 * a pair of bf16 along K, for the fp32 panel it is one float. Loads are masked by 16-bit element
 * (so an odd K splits a pair correctly) and rows past N are zeros: a packed block is always
 * whole, and its padding contributes 0 * 0 to the sums.
 */
#ifndef RC_GEMM_H
#define RC_GEMM_H

#include "rc_avx512.h"
#include "rc_transpose.h"

/* Epilogue codes (gemm.py passes the same numbers): y = act(acc + bias) + residual. */
enum { RC_ACT_NONE = 0, RC_ACT_RELU = 1, RC_ACT_GELU = 2, RC_ACT_GELU_TANH = 3, RC_ACT_SILU = 4 };

/* Columns [32 p, 32 p + 32) of the fp32 w (N, K) as a K x 32 panel at dst (the
 * avx512_f32_panel32 layout; zero columns past N). */
static inline void rc_pack_panel32(const float *w, int64_t n, int64_t k, int64_t p, float *dst)
{
    for (int64_t k0 = 0; k0 < k; k0 += 16)
        for (int64_t h = 0; h < 2; h++) {
            const int64_t r0 = p * 32 + 16 * h;
            rc_transpose16((const char *)(w + r0 * k + k0), k * 4, n - r0,
                           rc_tail32(2 * (k - k0)), (char *)(dst + k0 * 32 + 16 * h), 32 * 4,
                           rc_min64(16, k - k0));
        }
}

/* The amx_bf16_vnni2 layout: tiles of 16 columns of N x 32 of K (16 rows of K pairs x 16 x 2). */
enum { TK = 32, TN = 16, TILE = TN * TK }; /* bf16 per tile */

/* Columns [16 nb, 16 nb + 16) of w (N, K) as kt VNNI-2 tiles at dst (zeros past N and K). */
static inline void rc_pack_vnni_nk(const uint16_t *w, int64_t n, int64_t k, int64_t nb,
                                   uint16_t *dst)
{
    const int64_t kt = (k + TK - 1) / TK, rows = rc_min64(TN, n - nb * TN);
    const char *src = (const char *)(w + nb * TN * k);
    /* measured ~140 cycles per tile, hot, one thread (64 of them port-5 shuffles); software
     * prefetch of the 16 row streams made no difference */
    for (int64_t kb = 0; kb < kt; kb++)
        rc_transpose16(src + kb * TK * 2, k * 2, rows, rc_tail32(k - kb * TK),
                       (char *)(dst + kb * TILE), 64, 16);
}

/* Columns [16 nb, 16 nb + 16) of w (K, N) (matmul's other) as kt VNNI-2 tiles at dst: tile row r
 * interleaves rows 2r and 2r + 1 of K (vpermw), zeros past N and K. */
static inline void rc_pack_vnni_kn(const uint16_t *w, int64_t n, int64_t k, int64_t nb,
                                   uint16_t *dst)
{
    const int64_t kt = (k + TK - 1) / TK;
    const __mmask16 mk = rc_tail16(n - nb * TN);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t r = 0; r < kt * 16; r++) {
        const int64_t k0 = 2 * r;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        if (k0 < k)
            lo = _mm256_maskz_loadu_epi16(mk, w + k0 * n + nb * TN);
        if (k0 + 1 < k)
            hi = _mm256_maskz_loadu_epi16(mk, w + (k0 + 1) * n + nb * TN);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_storeu_si512(dst + (r / 16) * TILE + (r % 16) * 32, _mm512_permutexvar_epi16(idx, v));
    }
}

/* 1 when every value of the fp32 block c (mr rows of nr, ld ldc, whole vectors of 16 readable)
 * is finite (x - x is 0 for finite x, NaN for inf and NaN); else rc_fix_block (rc_gemm_fix.h)
 * recomputes the others in float64. */
static inline int rc_block_finite(const float *c, int64_t ldc, int64_t mr, int64_t nr)
{
    __m512 bad = _mm512_setzero_ps();
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < nr; j += 16) {
            const __m512 v = _mm512_loadu_ps(c + r * ldc + j);
            bad = _mm512_or_ps(bad, _mm512_sub_ps(v, v));
        }
    return !_mm512_cmp_ps_mask(bad, bad, _CMP_UNORD_Q);
}

/* The activation on 16 fp32 lanes. */
static inline __m512 rc_act(__m512 v, int act)
{
    switch (act) {
    case RC_ACT_RELU: return _mm512_max_ps(_mm512_setzero_ps(), v); /* NaN stays NaN */
    case RC_ACT_GELU: return rc_gelu_erf(v);
    case RC_ACT_GELU_TANH: return rc_gelu_tanh(v);
    case RC_ACT_SILU: return rc_silu(v);
    default: return v;
    }
}

/* rc_epilogue's body for one activation (a constant once inlined: no switch per vector). */
static inline __attribute__((always_inline)) void rc_epilogue_act(
    const float *c, int64_t ldc, int64_t mr, int64_t nr, const void *b, const void *res, void *y,
    int64_t n, int64_t m0, int64_t n0, const int act, int bf16)
{
    for (int64_t j = 0; j < nr; j += 16) {
        __mmask16 mk = rc_tail16(nr - j);
        __m512 bv = b ? rc_load_m(b, n0 + j, mk, bf16) : _mm512_setzero_ps();
        for (int64_t r = 0; r < mr; r++) {
            __m512 v = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + j), bv);
            v = rc_act(rc_round_to(v, bf16), act); /* rounded as rc_epi1 (rc_gemm_fix.h) */
            int64_t at = (m0 + r) * n + n0 + j;
            if (res)
                v = _mm512_add_ps(rc_round_to(v, bf16), rc_load_m(res, at, mk, bf16));
            rc_store_m(y, at, mk, v, bf16);
        }
    }
}

/* Rows [m0, m0 + mr) x columns [n0, n0 + nr) of y (ld n) from the fp32 block c (ld ldc floats):
 * y = act(c + b[n]) + res[m, n], each intermediate rounded to y's dtype as the unfused ops store
 * it (rc_epi1 in rc_gemm_fix.h says why). b and res may be NULL. The switch
 * on act sits outside the loops (inside them it cost ~5% of an AMX GEMM at 1024 x 384 x 384). */
static inline void rc_epilogue(const float *c, int64_t ldc, int64_t mr, int64_t nr,
                               const void *b, const void *res, void *y, int64_t n, int64_t m0,
                               int64_t n0, int act, int bf16)
{
    switch (act) {
#define RC_EPI(a)                                                                                  \
    case a: rc_epilogue_act(c, ldc, mr, nr, b, res, y, n, m0, n0, a, bf16); break;
        RC_EPI(RC_ACT_RELU) RC_EPI(RC_ACT_GELU) RC_EPI(RC_ACT_GELU_TANH) RC_EPI(RC_ACT_SILU)
#undef RC_EPI
    default: rc_epilogue_act(c, ldc, mr, nr, b, res, y, n, m0, n0, RC_ACT_NONE, bf16); break;
    }
}

#endif
