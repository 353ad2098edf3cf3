/* AVX-512 helpers: fp32/bf16 loads and stores (full and masked), exp, reciprocal, gelu, silu.
 *
 * Only for translation units compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq (and
 * -mavx512bf16 for the avx512_bf16 level, which switches the fp32 -> bf16 store to one
 * vcvtneps2bf16). All functions are static inline (see rc_common.h).
 *
 * Special values follow the reference formulas: NaN propagates (min/max take the variable as
 * their second operand, which vminps/vmaxps return when either is NaN), exp(-inf) = 0,
 * exp(+inf) = +inf, 1/inf = 0.
 */
#ifndef RC_AVX512_H
#define RC_AVX512_H

#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__)
#error "rc_avx512.h needs -mavx512f -mavx512bw -mavx512vl -mavx512dq"
#endif

#include <immintrin.h>

#include "rc_common.h"

/* Lanes [0, n) of a 16-lane vector (n may exceed 16). */
static inline __mmask16 rc_tail16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

static inline __m512 rc_widen_bf16(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16 fp32 values from float or bf16 memory at element i. */
static inline __m512 rc_load(const void *p, int64_t i, int bf16)
{
    if (bf16)
        return rc_widen_bf16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_loadu_ps((const float *)p + i);
}

/* Masked load: lanes outside m are not read (no fault past the buffer) and come back as 0. */
static inline __m512 rc_load_m(const void *p, int64_t i, __mmask16 m, int bf16)
{
    if (bf16)
        return rc_widen_bf16(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

/* fp32 -> bf16, round to nearest even; NaN stays a quiet NaN. vcvtneps2bf16 also treats fp32
 * denormals as zero (|x| < 1.2e-38), far inside every bf16 tolerance. */
static inline __m256i rc_narrow_bf16(__m512 v)
{
#ifdef __AVX512BF16__
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
#endif
}

static inline void rc_store(void *p, int64_t i, __m512 v, int bf16)
{
    if (bf16)
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), rc_narrow_bf16(v));
    else
        _mm512_storeu_ps((float *)p + i, v);
}

/* Masked store: memory outside m is not touched. */
static inline void rc_store_m(void *p, int64_t i, __mmask16 m, __m512 v, int bf16)
{
    if (bf16)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, rc_narrow_bf16(v));
    else
        _mm512_mask_storeu_ps((float *)p + i, m, v);
}

/* exp(x) for x in [-200, 88.7] or NaN: 2^n * p(r), r = x - n ln2 (Cody-Waite split), Cephes'
 * degree-6 polynomial (~1 ulp); scalef gives 0 (or a denormal) below -87.3 exactly as exp. */
static inline __m512 rc_exp_bounded(__m512 x)
{
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* exp(x) for any x: clamped to [-110, 100] first, so exp(-inf) = 0 (2^n * p underflows to
 * exactly 0, as exp does below -103.97) and exp(+inf) = +inf (scalef overflows as exp does above
 * 88.73); NaN passes the clamps (vminps/vmaxps return their second operand on NaN). */
static inline __m512 rc_exp(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
    return rc_exp_bounded(x);
}

/* 1/d for finite d >= 1: rcp14 plus one Newton step (~1 ulp); NaN stays NaN. */
static inline __m512 rc_recip_finite(__m512 d)
{
    __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}

/* 1/d for d >= 1 including +inf (-> 0, as a division gives; the Newton step alone gives NaN). */
static inline __m512 rc_recip(__m512 d)
{
    __mmask16 inf = _mm512_cmp_ps_mask(d, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(rc_recip_finite(d), inf, _mm512_setzero_ps());
}

/* x * Phi(x), Phi(x) = erfc(-x/sqrt2)/2 with Numerical Recipes' erfcc (relative error < 1.2e-7
 * everywhere), so the negative tail keeps its relative accuracy instead of suffering 1 + erf(z)'s
 * cancellation. |x|/sqrt2 is clamped to 11, where erfc is 0 in fp32: gelu(+inf) = +inf and
 * gelu(-inf) = -inf * 0 = NaN, as the reference formula gives. With the clamp, the exp argument
 * lies in [-123, 0] and the reciprocal's in [1, 6.5]: their unclamped forms suffice. */
static inline __m512 rc_gelu_erf(__m512 x)
{
    __m512 w = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
    w = _mm512_min_ps(_mm512_set1_ps(11.0f), w);
    __m512 t = rc_recip_finite(_mm512_fmadd_ps(_mm512_set1_ps(0.5f), w, _mm512_set1_ps(1.f)));
    __m512 p = _mm512_fmadd_ps(t, _mm512_set1_ps(0.17087277f), _mm512_set1_ps(-0.82215223f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(1.48851587f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(-1.13520398f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(0.27886807f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(-0.18628806f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(0.09678418f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(0.37409196f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(1.00002368f));
    p = _mm512_fmadd_ps(t, p, _mm512_set1_ps(-1.26551223f));
    __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), t),
                                     rc_exp_bounded(_mm512_fnmadd_ps(w, w, p)));
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    __m512 phi = _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), neg, half_erfc);
    return _mm512_mul_ps(x, phi);
}

/* 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): one exp, one
 * reciprocal. For x = -inf the denominator is +inf and x * 0 gives NaN, as the reference. */
static inline __m512 rc_gelu_tanh(__m512 x)
{
    __m512 v = _mm512_mul_ps(x, _mm512_fmadd_ps(_mm512_set1_ps(-0.0713548162726f),
                                                _mm512_mul_ps(x, x),
                                                _mm512_set1_ps(-1.5957691216057308f)));
    return _mm512_mul_ps(x, rc_recip(_mm512_add_ps(_mm512_set1_ps(1.0f), rc_exp(v))));
}

/* x * sigmoid(x) == x / (1 + exp(-x)); x = -inf gives -inf * 0 = NaN, as the reference. */
static inline __m512 rc_silu(__m512 x)
{
    __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), rc_exp(_mm512_sub_ps(_mm512_setzero_ps(), x)));
    return _mm512_mul_ps(x, rc_recip(d));
}

#endif
