/* AVX2 row helpers of layer_norm / rms_norm (see rc_norm_row.h), shared by norm_avx2.c and
 * fused_avx2.c (add_layer_norm).
 *
 * Reductions use four 8-lane fp32 accumulators (32 elements per step), the row tail a partial
 * load with its unused lanes zeroed; the row is read from memory once and from cache for the
 * later passes. rc_row_affine may run in place (y == x): each output is written after the last
 * read of its input.
 */
#ifndef RC_NORM_AVX2_H
#define RC_NORM_AVX2_H

#include "rc_avx2.h"

/* one accumulation step: s += x*s (sum) or s += (x*s - c)^2 (sq); m = max(|x|, m) if amax */
#define RC_STEP(acc, m, v)                                                                         \
    do {                                                                                           \
        __m256 v_ = (v);                                                                           \
        if (amax)                                                                                  \
            m = _mm256_max_ps(rc8_abs(v_), m);                                                     \
        if (sq) {                                                                                  \
            __m256 t_ = _mm256_fmsub_ps(v_, vs, vc);                                               \
            acc = _mm256_fmadd_ps(t_, t_, acc);                                                    \
        } else {                                                                                   \
            acc = _mm256_fmadd_ps(v_, vs, acc);                                                    \
        }                                                                                          \
    } while (0)

RC_INLINE float rc_row_reduce8(const void *x, int64_t d, float s, float c, int sq, float *amax,
                               int bf16)
{
    const __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(c);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, m0 = s0, m1 = s0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        RC_STEP(s0, m0, rc8_load(x, j, bf16));
        RC_STEP(s1, m1, rc8_load(x, j + 8, bf16));
        RC_STEP(s2, m0, rc8_load(x, j + 16, bf16));
        RC_STEP(s3, m1, rc8_load(x, j + 24, bf16));
    }
    for (; j + 8 <= d; j += 8)
        RC_STEP(s0, m0, rc8_load(x, j, bf16));
    if (j < d) {
        /* unused lanes load as 0; (0*s - c)^2 must not count */
        __m256 keep = _mm256_castsi256_ps(rc8_lanes(d - j)), t = s2;
        RC_STEP(t, m1, rc8_load_n(x, j, d - j, bf16));
        s2 = _mm256_blendv_ps(s2, t, keep);
    }
    if (amax)
        *amax = rc8_hmax(_mm256_max_ps(m0, m1));
    return rc8_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}
#undef RC_STEP

RC_INLINE float rc_row_sum(const void *x, int64_t d, float s, float *amax, int bf16)
{
    return rc_row_reduce8(x, d, s, 0.0f, 0, amax, bf16);
}

RC_INLINE float rc_row_sumsq(const void *x, int64_t d, float s, float c, float *amax, int bf16)
{
    return rc_row_reduce8(x, d, s, c, 1, amax, bf16);
}

RC_INLINE __m256 rc8_affine(__m256 v, __m256 vs, __m256 vc, __m256 vr, const void *w,
                            const void *b, int64_t j, int bf16)
{
    v = _mm256_fmsub_ps(v, vs, vc);
    __m256 scale = vr;
    if (w) { /* (v * rstd) * w: rstd * w first overflowed where the result is finite (fuzz) */
        v = _mm256_mul_ps(v, vr);
        scale = rc8_load(w, j, bf16);
    }
    return b ? _mm256_fmadd_ps(v, scale, rc8_load(b, j, bf16)) : _mm256_mul_ps(v, scale);
}

/* y = ((x*s - c) * rstd) * w + b over a row; w, b may be NULL */
RC_INLINE void rc_row_affine(const void *x, const void *w, const void *b, void *y, int64_t d,
                             float s, float c, float rstd, int bf16)
{
    const __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(c), vr = _mm256_set1_ps(rstd);
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        __m256 v0 = rc8_affine(rc8_load(x, j, bf16), vs, vc, vr, w, b, j, bf16);
        __m256 v1 = rc8_affine(rc8_load(x, j + 8, bf16), vs, vc, vr, w, b, j + 8, bf16);
        rc8_store(y, j, v0, bf16);
        rc8_store(y, j + 8, v1, bf16);
    }
    for (; j + 8 <= d; j += 8)
        rc8_store(y, j, rc8_affine(rc8_load(x, j, bf16), vs, vc, vr, w, b, j, bf16), bf16);
    if (j < d) {
        int64_t n = d - j;
        __m256 v = _mm256_fmsub_ps(rc8_load_n(x, j, n, bf16), vs, vc);
        __m256 scale = vr;
        if (w) {
            v = _mm256_mul_ps(v, vr);
            scale = rc8_load_n(w, j, n, bf16);
        }
        v = b ? _mm256_fmadd_ps(v, scale, rc8_load_n(b, j, n, bf16)) : _mm256_mul_ps(v, scale);
        rc8_store_n(y, j, n, v, bf16);
    }
}

/* group_norm's output step (rc_group_norm.h): y = silu?(((x*s - c) * rstd) * w + b) over n
 * values; rc_span_affine1 with one s, c, rstd, w, b for them all (an NCHW channel plane; hw, hb:
 * whether w, b were given), rc_span_affinev with per-value fp32 arrays (a channels-last pixel; w,
 * b may be NULL). */
RC_INLINE __m256 rc8_gn(__m256 v, __m256 s, __m256 c, __m256 r, __m256 w, __m256 b, int hw,
                        int hb, int silu, int bf16)
{
    v = _mm256_mul_ps(_mm256_fmsub_ps(v, s, c), r);
    if (hw)
        v = hb ? _mm256_fmadd_ps(v, w, b) : _mm256_mul_ps(v, w);
    else if (hb) {
        /* the product rounded before the add (channel_affine is torch's mul then add): GCC
         * contracts a mul and an add intrinsic into an FMA, which kept 1e30 * 1e10 + -inf at -inf
         * where the rounded product (inf) gives NaN; the empty asm makes v a register value */
        __asm__("" : "+x"(v));
        v = _mm256_add_ps(v, b);
    }
    /* group_norm_silu means silu of group_norm's output in the dtype (specs/fused.yaml): a bf16
     * -3.3e38 is -inf there and its silu NaN, where the fp32 value's silu is -0.0 (found by
     * refcore.fuzz, as for the linear epilogues) */
    return silu ? rc8_silu(rc8_round_to(v, bf16)) : v;
}

RC_INLINE void rc_span_affine1(const void *x, void *y, int64_t n, float s, float c, float r,
                               float w, float b, int hw, int hb, int silu, int bf16)
{
    const __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(c), vr = _mm256_set1_ps(r);
    const __m256 vw = _mm256_set1_ps(w), vb = _mm256_set1_ps(b);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        rc8_store(y, j, rc8_gn(rc8_load(x, j, bf16), vs, vc, vr, vw, vb, hw, hb, silu, bf16), bf16);
    if (j < n)
        rc8_store_n(y, j, n - j,
                    rc8_gn(rc8_load_n(x, j, n - j, bf16), vs, vc, vr, vw, vb, hw, hb, silu, bf16),
                    bf16);
}

RC_INLINE void rc_span_affinev(const void *x, void *y, int64_t n, const float *s, const float *c,
                               const float *r, const float *w, const float *b, int silu, int bf16)
{
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = rc8_gn(rc8_load(x, j, bf16), rc8_load(s, j, 0), rc8_load(c, j, 0),
                          rc8_load(r, j, 0), w ? rc8_load(w, j, 0) : one,
                          b ? rc8_load(b, j, 0) : zero, w != NULL, b != NULL, silu, bf16);
        rc8_store(y, j, v, bf16);
    }
    if (j < n) {
        const int64_t k = n - j;
        __m256 v = rc8_gn(rc8_load_n(x, j, k, bf16), rc8_load_n(s, j, k, 0),
                          rc8_load_n(c, j, k, 0), rc8_load_n(r, j, k, 0),
                          w ? rc8_load_n(w, j, k, 0) : one, b ? rc8_load_n(b, j, k, 0) : zero,
                          w != NULL, b != NULL, silu, bf16);
        rc8_store_n(y, j, k, v, bf16);
    }
}

#include "rc_norm_row.h"

#endif
