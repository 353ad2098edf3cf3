/* AVX2 helpers of the GEMM family (gemm_avx2.c): 8-lane fp32 / bf16 loads and stores with tails,
 * the activations of the fused epilogue (exp, gelu erf / tanh, silu) and the epilogue itself.
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

#include "rc_common.h"

/* Epilogue codes (gemm.py passes the same numbers): y = act(acc + bias) + residual. */
enum { RC_ACT_NONE = 0, RC_ACT_RELU = 1, RC_ACT_GELU = 2, RC_ACT_GELU_TANH = 3, RC_ACT_SILU = 4 };

static inline __m256 rc2_widen_bf16(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* fp32 -> bf16, round to nearest even; a NaN stays a quiet NaN (as rc_f32_to_bf16). */
static inline __m128i rc2_narrow_bf16(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* 8 fp32 values from float or bf16 memory at element i; n < 8 reads only lanes [0, n) (0 else). */
static inline __m256 rc2_load_n(const void *p, int64_t i, int64_t n, int bf16)
{
    if (n >= 8)
        return bf16 ? rc2_widen_bf16(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
                    : _mm256_loadu_ps((const float *)p + i);
    float t[8] = {0};
    for (int64_t j = 0; j < n; j++)
        t[j] = rc_ld(p, i + j, bf16);
    return _mm256_loadu_ps(t);
}

/* Stores lanes [0, min(n, 8)) of v at element i of float or bf16 memory; nothing else. */
static inline void rc2_store_n(void *p, int64_t i, int64_t n, __m256 v, int bf16)
{
    if (n >= 8) {
        if (bf16)
            _mm_storeu_si128((__m128i *)((uint16_t *)p + i), rc2_narrow_bf16(v));
        else
            _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    if (bf16) {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, rc2_narrow_bf16(v));
        memcpy((uint16_t *)p + i, t, (size_t)n * 2);
    } else {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy((float *)p + i, t, (size_t)n * 4);
    }
}

/* 2^n for integral n in [-126, 127] (exponent bits). */
static inline __m256 rc2_pow2i(__m256 n)
{
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

/* exp(x) where only 1 + exp(x) matters (as rc_exp_for_sum1): x clamped to [-87, 88] (no
 * denormal result), exp(x) = +inf above 88 (so 1 + exp is +inf there), NaN stays NaN. Cody-Waite
 * split and Cephes' degree-6 polynomial (~1 ulp), as rc_exp_bounded. */
static inline __m256 rc2_exp_for_sum1(__m256 x)
{
    const __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
    __m256 c = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    c = _mm256_min_ps(_mm256_set1_ps(88.0f), c);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    /* n in [-126, 127]: 2^n in one step (n = 127 only for c = 88: 2^127 * p < FLT_MAX) */
    const __m256 e = _mm256_mul_ps(p, rc2_pow2i(n));
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), big);
}

/* x * Phi(x) as rc_gelu_erf (rc_avx512.h, which documents the fit): q = Phi(-|x|) =
 * exp(-x^2/2) R(|x|), Phi(x) = q for x < 0 and 1 - q else; q = 0 beyond |x| = 6. */
static inline __m256 rc2_gelu_erf(__m256 x)
{
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 in = _mm256_cmp_ps(ax, _mm256_set1_ps(6.0f), _CMP_LT_OQ);
    const __m256 a = _mm256_min_ps(_mm256_set1_ps(6.0f), ax); /* NaN -> 6 (masked) */
    const __m256 w = _mm256_mul_ps(a, _mm256_mul_ps(a, _mm256_set1_ps(-0.72134752044448170f)));
    const __m256 n = _mm256_round_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(w, n);
    __m256 e = _mm256_set1_ps(1.3276444e-3f);
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(9.6755372e-3f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(5.5507135e-2f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(2.4022120e-1f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(6.9314694e-1f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(1.0000001f));
    e = _mm256_mul_ps(e, rc2_pow2i(n)); /* n in [-26, 0] */
    __m256 p = _mm256_set1_ps(4.4061825e-2f);
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(2.2695602e-1f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(5.0000227e-1f));
    __m256 d = _mm256_set1_ps(1.0913451e-1f);
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(5.8656460e-1f));
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(1.2518705f));
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(1.0f));
    const __m256 q = _mm256_and_ps(in, _mm256_div_ps(_mm256_mul_ps(e, p), d));
    const __m256 phi = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), q), q, x);
    return _mm256_mul_ps(x, phi);
}

/* 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3). */
static inline __m256 rc2_gelu_tanh(__m256 x)
{
    const __m256 v = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(-0.0713548162726f),
                                                      _mm256_mul_ps(x, x),
                                                      _mm256_set1_ps(-1.5957691216057308f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), rc2_exp_for_sum1(v)));
}

/* x * sigmoid(x) == x / (1 + exp(-x)). */
static inline __m256 rc2_silu(__m256 x)
{
    const __m256 e = rc2_exp_for_sum1(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 rc2_act(__m256 v, int act)
{
    switch (act) {
    case RC_ACT_RELU: return _mm256_max_ps(_mm256_setzero_ps(), v); /* NaN stays NaN */
    case RC_ACT_GELU: return rc2_gelu_erf(v);
    case RC_ACT_GELU_TANH: return rc2_gelu_tanh(v);
    case RC_ACT_SILU: return rc2_silu(v);
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
            __m256 v = rc2_act(_mm256_add_ps(_mm256_loadu_ps(c + r * ldc + j), bv), act);
            const int64_t at = (m0 + r) * n + n0 + j;
            if (res)
                v = _mm256_add_ps(v, rc2_load_n(res, at, left, bf16));
            rc2_store_n(y, at, left, v, bf16);
        }
    }
}

/* Rows [m0, m0 + mr) x columns [n0, n0 + nr) of y (ld n) from the fp32 block c (ld ldc, whole
 * vectors of 8 readable): y = act(c + b[n]) + res[m, n], rounded once (as rc_epilogue). */
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
