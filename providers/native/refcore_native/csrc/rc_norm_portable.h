/* Portable row helpers of layer_norm / rms_norm (see rc_norm_row.h), shared by norm_portable.c
 * and fused_portable.c.
 *
 * fp32 sums with 8 partial sums (vectorizable without reassociation flags), the variance step in
 * double; rc_row_affine may run in place (y == x).
 */
#ifndef RC_NORM_PORTABLE_H
#define RC_NORM_PORTABLE_H

#include "rc_common.h"
#include "rc_scalar.h"

enum { RC_P = 8 };

/* sum of (x*s - c)^2 when sq, else of x*s; max |x| into *amax when amax is not NULL */
static inline float rc_row_reduce1(const void *x, int64_t d, float s, float c, int sq,
                                   float *amax, int bf16)
{
    float acc[RC_P] = {0}, m[RC_P] = {0};
    int64_t j = 0;
    for (; j + RC_P <= d; j += RC_P)
        for (int k = 0; k < RC_P; k++) {
            float v = rc_ld(x, j + k, bf16), a = fabsf(v), t = v * s - c;
            m[k] = a > m[k] ? a : m[k];
            acc[k] += sq ? t * t : v * s;
        }
    for (; j < d; j++) {
        float v = rc_ld(x, j, bf16), a = fabsf(v), t = v * s - c;
        m[0] = a > m[0] ? a : m[0];
        acc[0] += sq ? t * t : v * s;
    }
    float r = 0.0f, mx = 0.0f;
    for (int k = 0; k < RC_P; k++) {
        r += acc[k];
        mx = m[k] > mx ? m[k] : mx;
    }
    if (amax)
        *amax = mx;
    return r;
}

static inline float rc_row_sum(const void *x, int64_t d, float s, float *amax, int bf16)
{
    return rc_row_reduce1(x, d, s, 0.0f, 0, amax, bf16);
}

static inline float rc_row_sumsq(const void *x, int64_t d, float s, float c, float *amax,
                                 int bf16)
{
    return rc_row_reduce1(x, d, s, c, 1, amax, bf16);
}

static inline void rc_row_affine(const void *x, const void *w, const void *b, void *y, int64_t d,
                                 float s, float c, float rstd, int bf16)
{
    for (int64_t j = 0; j < d; j++) {
        /* ((x - mean) * rstd) * w + b: no cancellation on a constant row (see specs/norm.yaml);
         * rstd * w first overflowed for a huge w (or rstd) where the result is finite. * w + b
         * in one rounding (fmaf), as the vector levels' FMA: rounded apart, x^ w = 4e38 became inf
         * where x^ w + b is 3.1e38 (refcore.fuzz, bf16 add_layer_norm) */
        float v = (rc_ld(x, j, bf16) * s - c) * rstd;
        const float bj = b ? rc_ld(b, j, bf16) : 0.0f;
        if (w)
            v = b ? fmaf(v, rc_ld(w, j, bf16), bj) : v * rc_ld(w, j, bf16);
        else if (b)
            v += bj;
        rc_st(y, j, v, bf16);
    }
}

/* group_norm's output step (rc_group_norm.h): y = silu?(((x*s - c) * rstd) * w + b) over n
 * values; rc_span_affine1 with one s, c, rstd, w, b for them all (an NCHW channel plane; hw, hb:
 * whether w, b were given), rc_span_affinev with per-value fp32 arrays (a channels-last pixel; w,
 * b may be NULL). */
static inline float rc_gn1(float v, float s, float c, float r, float w, float b, int hw, int hb,
                           int silu, int bf16)
{
    v = (v * s - c) * r;
    if (hw)
        v = hb ? fmaf(v, w, b) : v * w;
    else if (hb)
        v += b;
    return silu ? rc_silu1(rc_round1(v, bf16)) : v; /* silu of the dtype's value: see rc8_gn */
}

static inline void rc_span_affine1(const void *x, void *y, int64_t n, float s, float c, float r,
                                   float w, float b, int hw, int hb, int silu, int bf16)
{
    for (int64_t j = 0; j < n; j++)
        rc_st(y, j, rc_gn1(rc_ld(x, j, bf16), s, c, r, w, b, hw, hb, silu, bf16), bf16);
}

static inline void rc_span_affinev(const void *x, void *y, int64_t n, const float *s,
                                   const float *c, const float *r, const float *w,
                                   const float *b, int silu, int bf16)
{
    for (int64_t j = 0; j < n; j++)
        rc_st(y, j, rc_gn1(rc_ld(x, j, bf16), s[j], c[j], r[j], w ? w[j] : 1.0f,
                           b ? b[j] : 0.0f, w != NULL, b != NULL, silu, bf16), bf16);
}

#include "rc_norm_row.h"

#endif
