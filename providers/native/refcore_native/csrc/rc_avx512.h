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

/* v rounded to the dtype and widened back (a no-op for fp32): what a store then a load gives */
static inline __m512 rc_round_to(__m512 v, int bf16)
{
    return bf16 ? rc_widen_bf16(rc_narrow_bf16(v)) : v;
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

/* exp(x) where only 1 + exp(x) matters: as rc_exp, except that below -87 (where exp(x) falls under
 * FLT_MIN) it returns exp(-87) = 1.6e-38 instead of a denormal or 0. 1 + exp(x) is the same;
 * the point is speed: every denormal (or underflowing) result costs a microcode assist, which
 * made silu on U[-100, 100] and gelu(tanh) on 8*randn 13x slower (4.1-4.9 against 0.33 ns per
 * element). exp(+inf) is still +inf, NaN stays NaN. */
static inline __m512 rc_exp_for_sum1(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(100.0f), x);
    return rc_exp_bounded(x);
}

/* exp(x) for x <= 0 or NaN (softmax's x - row max), flushed to 0 below x = -70 (exp(-70) =
 * 4e-31, far inside every tolerance): no lane is ever a denormal, even after the 1/sum rescale
 * (>= 4e-31 / d), and every denormal or underflowing result costs a microcode assist (softmax on
 * 30*randn rows was 20x slower: 6.9 against 0.36 ns per element). exp(-inf) = 0; NaN stays NaN
 * (NLT_UQ keeps unordered lanes). */
static inline __m512 rc_exp_nonpos(__m512 x)
{
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-70.0f), _CMP_NLT_UQ);
    return _mm512_maskz_mov_ps(keep, rc_exp_bounded(_mm512_max_ps(_mm512_set1_ps(-70.0f), x)));
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

/* x * Phi(x), computed through q = Phi(-|x|) = erfc(|x|/sqrt2)/2 = exp(-x^2/2) * R(|x|), so both
 * tails keep their accuracy: Phi(x) = q for x < 0 (no 1 + erf(z) cancellation: torch's
 * 0.5x(1 + erf) reaches 1.1e-6 absolute error near x = -3.5) and 1 - q for x >= 0.
 *
 * exp(-x^2/2) = 2^w, w = -x^2 log2(e)/2 = n + f (n integer, |f| <= 1/2): a degree-5 polynomial for
 * 2^f (relative error 7.5e-8) scaled by scalef. R(a) = erfc(a/sqrt2) exp(a^2/2)/2 is smooth and
 * slowly decaying (0.5 at 0, ~0.065 at 6): a (2, 3) rational in a, fitted by weighted
 * least-squares iterations (Lawson) on [0, 6] for the absolute error of x * q (4e-8), divided by
 * rcp14 plus one Newton step. Beyond |x| = 6 q is set to 0 (x * Phi(-6) = -6e-9), so gelu(+inf)
 * = +inf, gelu(-inf) = -inf * 0 = NaN (as the reference formula), NaN stays NaN. About 27
 * instructions per 16 lanes against ~36 for an erfc with a full exp. Measured over every fp32
 * with |x| in [0.25, 16) and a stride over all others: worst error 0.048 of the spec tolerance
 * (atol 1e-6 + rtol 1e-5 |y|); tests/test_native_activations.py checks a dense grid. */
static inline __m512 rc_gelu_erf(__m512 x)
{
    const __mmask16 in = _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(6.0f), _CMP_LT_OQ);
    /* clamped (NaN becomes 6 too, and is masked): past |x| = 13.2 exp(-x^2/2) would be an fp32
     * denormal, and denormal results cost a microcode assist each (10x slower on inputs with
     * 3% of such lanes) */
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(6.0f));
    /* exp(-a^2/2) = 2^w */
    __m512 w = _mm512_mul_ps(a, _mm512_mul_ps(a, _mm512_set1_ps(-0.72134752044448170f)));
    __m512 n = _mm512_roundscale_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(w, n);
    __m512 e = _mm512_set1_ps(1.3276444e-3f);
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(9.6755372e-3f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(5.5507135e-2f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(2.4022120e-1f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(6.9314694e-1f));
    e = _mm512_fmadd_ps(e, f, _mm512_set1_ps(1.0000001f));
    e = _mm512_scalef_ps(e, n);
    /* R(a) = p(a) / d(a) */
    __m512 p = _mm512_set1_ps(4.4061825e-2f);
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(2.2695602e-1f));
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(5.0000227e-1f));
    __m512 d = _mm512_set1_ps(1.0913451e-1f);
    d = _mm512_fmadd_ps(d, a, _mm512_set1_ps(5.8656460e-1f));
    d = _mm512_fmadd_ps(d, a, _mm512_set1_ps(1.2518705f));
    d = _mm512_fmadd_ps(d, a, _mm512_set1_ps(1.0f));
    /* q = e * p / d: rcp14 (relative error < 2^-14), then one Newton step on the quotient */
    __m512 r = _mm512_rcp14_ps(d);
    __m512 num = _mm512_mul_ps(e, p);
    __m512 q = _mm512_mul_ps(num, r);
    q = _mm512_maskz_fmadd_ps(in, _mm512_fnmadd_ps(d, q, num), r, q);
    __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(x));
    __m512 phi = _mm512_mask_mov_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), q), neg, q);
    return _mm512_mul_ps(x, phi);
}

/* 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): one exp, one
 * reciprocal. For x = -inf the denominator is +inf and x * 0 gives NaN, as the reference. */
static inline __m512 rc_gelu_tanh(__m512 x)
{
    __m512 v = _mm512_mul_ps(x, _mm512_fmadd_ps(_mm512_set1_ps(-0.0713548162726f),
                                                _mm512_mul_ps(x, x),
                                                _mm512_set1_ps(-1.5957691216057308f)));
    return _mm512_mul_ps(x, rc_recip(_mm512_add_ps(_mm512_set1_ps(1.0f), rc_exp_for_sum1(v))));
}

/* x * sigmoid(x) == x / (1 + exp(-x)); x = -inf gives -inf * 0 = NaN, as the reference. */
static inline __m512 rc_silu(__m512 x)
{
    __m512 e = rc_exp_for_sum1(_mm512_sub_ps(_mm512_setzero_ps(), x));
    __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
    return _mm512_mul_ps(x, rc_recip(d));
}

#endif
