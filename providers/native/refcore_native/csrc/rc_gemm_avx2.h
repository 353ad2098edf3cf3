/* AVX2 helpers of the GEMM family (gemm_avx2.c, linalg_avx2.c, conv_avx2.c): loads and stores
 * with tails of any length, weight packing into K x width fp32 panels, the fused epilogue (its
 * activations are rc_avx2.h's) and the finiteness check.
 *
 * Only for translation units compiled with -mavx2 -mfma (no AVX-512 here). All static inline.
 * Special values follow the reference formulas as rc_avx512.h does: NaN propagates (min/max take
 * the variable as their second operand), exp(+inf) = +inf, x / inf = 0, so gelu(-inf) and
 * silu(-inf) are NaN (-inf * 0) as the references'. Divisions instead of reciprocal estimates:
 * the epilogue runs once per output against K FMAs, so its cost hardly shows.
 */
#ifndef RC_GEMM_AVX2_H
#define RC_GEMM_AVX2_H

#if !defined(__AVX2__) || !defined(__FMA__)
#error "rc_gemm_avx2.h needs -mavx2 -mfma"
#endif

#include <immintrin.h>

#include "rc_avx2.h"

/* Epilogue codes (gemm.py passes the same numbers): y = act(acc + bias) + residual. */
enum { RC_ACT_NONE = 0, RC_ACT_RELU = 1, RC_ACT_GELU = 2, RC_ACT_GELU_TANH = 3, RC_ACT_SILU = 4 };

/* Tails: n >= 8 lanes is a whole vector (rc_avx2.h's _n forms take n < 8). */
static inline __m256 rc2_load_n(const void *p, int64_t i, int64_t n, int bf16)
{
    return n >= 8 ? rc8_load(p, i, bf16) : rc8_load_n(p, i, n, bf16);
}

static inline void rc2_store_n(void *p, int64_t i, int64_t n, __m256 v, int bf16)
{
    if (n >= 8)
        rc8_store(p, i, v, bf16);
    else
        rc8_store_n(p, i, n, v, bf16);
}

/* dst[c * ld .. + 8] for c < 8 = column block of the 8 x 8 fp32 tile whose rows are r[0..7]. */
static inline void rc2_transpose8_store(__m256 r[8], float *dst, int64_t ld)
{
    __m256 t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ld, _mm256_permute2f128_ps(s[i], s[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ld, _mm256_permute2f128_ps(s[i], s[i + 4], 0x31));
    }
}

/* Rows [n0, n0 + width) of w (N, K) (fp32 or bf16; width a multiple of 8) as a K x width fp32
 * panel: dst[kk * width + j] = w[n0 + j, kk], zeros for rows past N (bf16 widened exactly). */
static inline void rc2_pack_nk(const void *w, int bf16, int64_t n, int64_t k, int64_t n0,
                               int64_t width, float *dst)
{
    for (int64_t c0 = 0; c0 < width; c0 += 8) {
        const int64_t r0 = n0 + c0, rows = rc_min64(8, n - r0);
        for (int64_t k0 = 0; k0 < k; k0 += 8) {
            const int64_t ks = rc_min64(8, k - k0);
            if (rows == 8 && ks == 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = rc2_load_n(w, (r0 + i) * k + k0, 8, bf16);
                rc2_transpose8_store(r, dst + k0 * width + c0, width);
                continue;
            }
            for (int64_t i = 0; i < ks; i++)
                for (int64_t c = 0; c < 8; c++)
                    dst[(k0 + i) * width + c0 + c] =
                        c < rows ? rc_ld(w, (r0 + c) * k + k0 + i, bf16) : 0.0f;
        }
    }
}

static inline __m256 rc2_act(__m256 v, int act)
{
    switch (act) {
    case RC_ACT_RELU: return _mm256_max_ps(_mm256_setzero_ps(), v); /* NaN stays NaN */
    case RC_ACT_GELU: return rc8_gelu_erf(v);
    case RC_ACT_GELU_TANH: return rc8_gelu_tanh(v);
    case RC_ACT_SILU: return rc8_silu(v);
    default: return v;
    }
}

static inline __attribute__((always_inline)) void rc2_epilogue_act(
    const float *c, int64_t ldc, int64_t mr, int64_t nr, const void *b, const void *res, void *y,
    int64_t n, int64_t m0, int64_t n0, const int act, int bf16)
{
    for (int64_t j = 0; j < nr; j += 8) {
        const int64_t left = nr - j;
        const __m256 bv = b ? rc2_load_n(b, n0 + j, left, bf16) : _mm256_setzero_ps();
        for (int64_t r = 0; r < mr; r++) {
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + j), bv);
            v = rc2_act(rc8_round_to(v, bf16), act); /* rounded as rc_epi1 (rc_gemm_fix.h) */
            const int64_t at = (m0 + r) * n + n0 + j;
            if (res)
                v = _mm256_add_ps(rc8_round_to(v, bf16), rc2_load_n(res, at, left, bf16));
            rc2_store_n(y, at, left, v, bf16);
        }
    }
}

/* Rows [m0, m0 + mr) x columns [n0, n0 + nr) of y (ld n) from the fp32 block c (ld ldc, whole
 * vectors of 8 readable): y = act(c + b[n]) + res[m, n], each intermediate rounded to the dtype
 * as the unfused ops store it (rc_epi1 in rc_gemm_fix.h says why). */
static inline void rc2_epilogue(const float *c, int64_t ldc, int64_t mr, int64_t nr,
                                const void *b, const void *res, void *y, int64_t n, int64_t m0,
                                int64_t n0, int act, int bf16)
{
    switch (act) {
#define RC_EPI(a)                                                                                  \
    case a: rc2_epilogue_act(c, ldc, mr, nr, b, res, y, n, m0, n0, a, bf16); break;
        RC_EPI(RC_ACT_RELU) RC_EPI(RC_ACT_GELU) RC_EPI(RC_ACT_GELU_TANH) RC_EPI(RC_ACT_SILU)
#undef RC_EPI
    default: rc2_epilogue_act(c, ldc, mr, nr, b, res, y, n, m0, n0, RC_ACT_NONE, bf16); break;
    }
}

/* 1 when every value of the fp32 block c (mr rows of nr, ld ldc, whole vectors readable) is
 * finite: x - x is 0 for finite x, NaN for inf and NaN. */
static inline int rc2_block_finite(const float *c, int64_t ldc, int64_t mr, int64_t nr)
{
    __m256 bad = _mm256_setzero_ps();
    for (int64_t r = 0; r < mr; r++)
        for (int64_t j = 0; j < nr; j += 8) {
            const __m256 v = _mm256_loadu_ps(c + r * ldc + j);
            bad = _mm256_or_ps(bad, _mm256_sub_ps(v, v));
        }
    return !_mm256_movemask_ps(_mm256_cmp_ps(bad, bad, _CMP_UNORD_Q));
}

#endif
