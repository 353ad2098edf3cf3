/* AVX2 helpers: 8-lane fp32/bf16 loads and stores (full and partial), exp, gelu, silu, sums.
 *
 * Only for translation units compiled with -mavx2 -mfma (-mf16c): the avx2 level. The same
 * formulas as rc_avx512.h on 8 lanes, where AVX2 lacks what AVX-512 has: no masks (a row tail is
 * a maskload for fp32 and a copy through a small zeroed buffer for bf16), no scalef (2^n is built
 * in the exponent field), no rcp14 (rcpps has 12 bits: one Newton step gives ~22).
 * All functions are static inline (see rc_common.h).
 *
 * Special values follow the reference formulas: NaN propagates (min/max take the variable as
 * their second operand, which vminps/vmaxps return when either is NaN), exp(-inf) = 0,
 * exp(+inf) = +inf. No helper produces a denormal intermediate: each one costs a microcode assist
 * (MACHINE.md: 10-20x slower kernels on inputs with many such lanes).
 */
#ifndef RC_AVX2_H
#define RC_AVX2_H

#if !defined(__AVX2__) || !defined(__FMA__)
#error "rc_avx2.h needs -mavx2 -mfma"
#endif

#include <immintrin.h>

#include "rc_common.h"

#define RC_INLINE static inline __attribute__((always_inline))

/* all-ones in lanes [0, n), zeros elsewhere (n may exceed 8) */
RC_INLINE __m256i rc8_lanes(int64_t n)
{
    int k = n >= 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

RC_INLINE __m256 rc8_widen(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 fp32 values from float or bf16 memory at element i. */
RC_INLINE __m256 rc8_load(const void *p, int64_t i, int bf16)
{
    if (bf16)
        return rc8_widen(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* Lanes [0, n) from element i (n < 8 here, the rest 0); nothing past the buffer is read. */
RC_INLINE __m256 rc8_load_n(const void *p, int64_t i, int64_t n, int bf16)
{
    if (bf16) {
        uint16_t t[8] = {0};
        memcpy(t, (const uint16_t *)p + i, (size_t)n * 2);
        return rc8_widen(_mm_loadu_si128((const __m128i *)t));
    }
    return _mm256_maskload_ps((const float *)p + i, rc8_lanes(n));
}

/* fp32 -> bf16 in the top half of each 32-bit lane (the bottom half is garbage): round to
 * nearest even; NaN stays a quiet NaN (as rc_f32_to_bf16). */
RC_INLINE __m256i rc8_rne_hi(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
}

/* fp32 -> bf16 bits (rc8_rne_hi, packed to 8 x 16 bits) */
RC_INLINE __m128i rc8_narrow(__m256 v)
{
    __m256i r = _mm256_srli_epi32(rc8_rne_hi(v), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

RC_INLINE void rc8_store(void *p, int64_t i, __m256 v, int bf16)
{
    if (bf16)
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), rc8_narrow(v));
    else
        _mm256_storeu_ps((float *)p + i, v);
}

/* Lanes [0, n) to element i (n < 8); memory past them is not touched. */
RC_INLINE void rc8_store_n(void *p, int64_t i, int64_t n, __m256 v, int bf16)
{
    if (bf16) {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, rc8_narrow(v));
        memcpy((uint16_t *)p + i, t, (size_t)n * 2);
    } else {
        _mm256_maskstore_ps((float *)p + i, rc8_lanes(n), v);
    }
}

/* v rounded to the dtype and widened back (a no-op for fp32): what a store then a load gives */
RC_INLINE __m256 rc8_round_to(__m256 v, int bf16)
{
    if (!bf16)
        return v;
    __m256i hi = _mm256_and_si256(rc8_rne_hi(v), _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_castsi256_ps(hi); /* no pack / unpack round trip */
}

RC_INLINE float rc8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

RC_INLINE float rc8_hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

RC_INLINE __m256 rc8_abs(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* 2^n for integral n in [-126, 127] (exact, built in the exponent field) */
RC_INLINE __m256 rc8_pow2i(__m256 n)
{
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}

/* p(r) ~ exp(r) - 1 - r for |r| <= ln2/2 (Cephes' degree-6 polynomial, as rc_avx512.h); returns
 * exp(x) = 2^n p for x = n ln2 + r, n = round(x log2 e) */
RC_INLINE __m256 rc8_exp_parts(__m256 x, __m256 *n)
{
    *n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(*n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    return _mm256_add_ps(p, _mm256_set1_ps(1.0f));
}

/* exp(x) for x <= 0 or NaN (softmax's x - row max), flushed to 0 below x = -70 as
 * rc_exp_nonpos in rc_avx512.h (no lane is ever a denormal, even after the 1/sum rescale).
 * exp(-inf) = 0; NaN stays NaN (NLT_UQ keeps unordered lanes). */
RC_INLINE __m256 rc8_exp_nonpos(__m256 x)
{
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-70.0f), _CMP_NLT_UQ);
    __m256 n, p = rc8_exp_parts(_mm256_max_ps(_mm256_set1_ps(-70.0f), x), &n);
    return _mm256_and_ps(keep, _mm256_mul_ps(p, rc8_pow2i(n)));
}

/* exp(x) where only 1 + exp(x) matters (rc_exp_for_sum1 in rc_avx512.h): below -86 it returns
 * exp(-86) = 4e-38, never a denormal (p 2^(n-1) >= 0.7 * 2^-125); above 88.73 it overflows to
 * +inf as exp does (2^n is applied as 2^(n-1) * 2, so n = 128 stays in range); NaN stays NaN. */
RC_INLINE __m256 rc8_exp_for_sum1(__m256 x)
{
    x = _mm256_max_ps(_mm256_set1_ps(-86.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);
    __m256 n, p = rc8_exp_parts(x, &n);
    __m256 s = rc8_pow2i(_mm256_sub_ps(n, _mm256_set1_ps(1.0f)));
    return _mm256_mul_ps(_mm256_mul_ps(p, s), _mm256_set1_ps(2.0f));
}

/* x * Phi(x) through q = Phi(-|x|) = exp(-x^2/2) R(|x|): the formula and coefficients of
 * rc_gelu_erf in rc_avx512.h (see there), with rcpps (12 bits) and one Newton step on the
 * quotient (relative error ~2^-22) in place of rcp14 + Newton. */
RC_INLINE __m256 rc8_gelu_erf(__m256 x)
{
    const __m256 ax = rc8_abs(x);
    const __m256 in = _mm256_cmp_ps(ax, _mm256_set1_ps(6.0f), _CMP_LT_OQ);
    const __m256 a = _mm256_min_ps(ax, _mm256_set1_ps(6.0f)); /* NaN becomes 6, masked */
    __m256 w = _mm256_mul_ps(a, _mm256_mul_ps(a, _mm256_set1_ps(-0.72134752044448170f)));
    __m256 n = _mm256_round_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(w, n);
    __m256 e = _mm256_set1_ps(1.3276444e-3f);
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(9.6755372e-3f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(5.5507135e-2f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(2.4022120e-1f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(6.9314694e-1f));
    e = _mm256_fmadd_ps(e, f, _mm256_set1_ps(1.0000001f));
    e = _mm256_mul_ps(e, rc8_pow2i(n)); /* n in [-26, 0] */
    __m256 p = _mm256_set1_ps(4.4061825e-2f);
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(2.2695602e-1f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(5.0000227e-1f));
    __m256 d = _mm256_set1_ps(1.0913451e-1f);
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(5.8656460e-1f));
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(1.2518705f));
    d = _mm256_fmadd_ps(d, a, _mm256_set1_ps(1.0f));
    __m256 r = _mm256_rcp_ps(d);
    __m256 num = _mm256_mul_ps(e, p);
    __m256 q = _mm256_mul_ps(num, r);
    q = _mm256_fmadd_ps(_mm256_fnmadd_ps(d, q, num), r, q);
    q = _mm256_and_ps(in, q);
    __m256 phi = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), q), q, x); /* sign of x */
    return _mm256_mul_ps(x, phi);
}

/* 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3). A true division:
 * x / inf = 0 and -inf / inf = NaN as the reference, and its throughput (one per ~3.5 cycles on
 * Zen 3) is not the limit. */
RC_INLINE __m256 rc8_gelu_tanh(__m256 x)
{
    __m256 v = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(-0.0713548162726f),
                                                _mm256_mul_ps(x, x),
                                                _mm256_set1_ps(-1.5957691216057308f)));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), rc8_exp_for_sum1(v)));
}

/* x * sigmoid(x) == x / (1 + exp(-x)); x = -inf gives -inf / inf = NaN, as the reference. */
RC_INLINE __m256 rc8_silu(__m256 x)
{
    __m256 e = rc8_exp_for_sum1(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

#endif
