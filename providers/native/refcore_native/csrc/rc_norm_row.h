/* layer_norm and rms_norm of one row, on top of a level's three row helpers.
 *
 * The includer (rc_norm_<level>.h) defines, for its ISA level:
 *   float rc_row_sum(x, d, s, float *amax, bf16)        sum of x*s; max |x| into *amax if non-NULL
 *   float rc_row_sumsq(x, d, s, c, float *amax, bf16)   sum of (x*s - c)^2; max |x| likewise
 *   void rc_row_affine(x, w, b, y, d, s, c, rstd, bf16) y = ((x*s - c) * rstd) * w + b (w, b may be
 *                                                       NULL: ones, zeros); may run in place
 * Statistics are fp32 sums (as torch's CPU kernels) over x scaled by a power of two s. s is 1
 * (every product exact: the plain two-pass kernel) unless the row's max |x| is so large that
 * (x - mean)^2 or its sum would overflow fp32 (|x| ~ 1e20 made layer_norm return zeros), or so
 * small that the squares would be denormal or 0 (wrong with eps = 0, and slow); then s brings
 * max |x| to [1, 4), and var + eps becomes var*s^2 + eps*s^2 (double), so the result is right
 * wherever it is representable. The max rides along the first pass: the common row pays one
 * andnot and one max per vector, a rare row one more pass.
 */
#ifndef RC_NORM_ROW_H
#define RC_NORM_ROW_H

#include <float.h>

#include "rc_common.h"

/* The power of two s for a row whose max |x| is amax (see above); 1 for 0, inf and NaN. */
static inline float rc_norm_scale(float amax)
{
    if ((amax >= 0x1p-30f && amax <= 0x1p40f) || amax == 0.0f || !(amax <= FLT_MAX))
        return 1.0f;
    int e;
    frexpf(amax, &e); /* amax = m 2^e, m in [0.5, 1) */
    e = e < -126 ? -126 : e > 126 ? 126 : e; /* s = 2^-e stays a normal fp32 */
    return ldexpf(1.0f, -e);
}

/* 1 / sqrt(ms / s^2 + eps), times 1/s: the reciprocal std of the scaled row. Past FLT_MAX it is
 * FLT_MAX: only a constant row (ms = 0, every x*s - c exactly 0) with eps * s^2 < 1e-77 gets
 * there, where the reference's 0 / sqrt(eps) is 0 and 0 * inf was NaN (a huge constant row: s
 * 2^-126; found by refcore.fuzz through add_layer_norm); inf (eps = 0: 0 / 0) stays inf. */
static inline float rc_norm_rstd(float ms, double eps, float s)
{
    const double r = 1.0 / sqrt((double)ms + eps * ((double)s * (double)s));
    return r > FLT_MAX && r < INFINITY ? FLT_MAX : (float)r;
}

/* sum of x*s - c, plain C: the mean's own rounding, which the corrected two-pass variance adds
 * back (mean += csum / d, var -= (csum / d)^2). The fp32 mean of d equal values can be an ulp off,
 * and x - mean an ulp rather than 0: with eps = 0, or eps * s^2 tiny for a huge row, that ulp
 * came out as +-1 where the reference gives NaN (0 / 0) or 0 (found by refcore.fuzz). Only
 * rows whose spread is below 2^-15 of their mean pay this pass; for them it is exact. */
static inline float rc_row_csum(const void *x, int64_t d, float s, float c, int bf16)
{
    float t = 0.0f;
    for (int64_t j = 0; j < d; j++)
        t += rc_ld(x, j, bf16) * s - c;
    return t;
}

/* sum of x*s over a scaled row (s != 1: some |x| past 2^40 or below 2^-30), compensated
 * (Neumaier) in double. Such a row may hold +-3e38 beside values near 1: scaled, +-3.5 beside
 * 2^-127, and a plain fp32 (or double) sum loses the small terms that the cancelling large ones
 * leave as the whole mean (native portable was 10% off with weights near 1e37; found by
 * refcore.fuzz). The compensation keeps each lost low part, so the sum is right to its last
 * place. Only rare rows pay this pass. */
static inline float rc_row_sum_exact(const void *x, int64_t d, float s, int bf16)
{
    double t = 0.0, c = 0.0;
    for (int64_t j = 0; j < d; j++) {
        const double v = (double)rc_ld(x, j, bf16) * (double)s, u = t + v;
        c += fabs(t) >= fabs(v) ? (t - u) + v : (v - u) + t;
        t = u;
    }
    return (float)(t + c);
}

/* layer_norm's statistics of a row whose plain sum and max |x| the caller has: the power of two
 * s the row is scaled by, the mean and 1/std of the scaled row (the scaled sum if needed, the
 * centred sum of squares, the constant-row correction). Shared by layer_norm, add_layer_norm and
 * group_norm (whose (sample, group) block in NCHW is one such row). */
static inline __attribute__((always_inline)) void rc_norm_stats(const void *x, int64_t d,
                                                                float sum, float amax,
                                                                double eps, int bf16, float *s_,
                                                                float *mean_, float *rstd_)
{
    float s = rc_norm_scale(amax);
    if (s != 1.0f)
        sum = rc_row_sum_exact(x, d, s, bf16);
    float mean = sum / (float)d;
    float var = rc_row_sumsq(x, d, s, mean, NULL, bf16) / (float)d;
    if (var <= mean * mean * 0x1p-30f) { /* a (nearly) constant row: see rc_row_csum */
        const float dm = rc_row_csum(x, d, s, mean, bf16) / (float)d;
        mean += dm;
        var = var - dm * dm > 0.0f ? var - dm * dm : 0.0f;
    }
    *s_ = s;
    *mean_ = mean;
    *rstd_ = rc_norm_rstd(var, eps, s);
}

/* layer_norm of a row whose plain sum and max |x| the caller has (the fused kernels get them
 * while they form the row) */
static inline __attribute__((always_inline)) void rc_layer_norm_rest(const void *x,
                                                                     const void *w,
                                                                     const void *b, void *y,
                                                                     int64_t d, float sum,
                                                                     float amax, double eps,
                                                                     int bf16)
{
    float s, mean, rstd;
    rc_norm_stats(x, d, sum, amax, eps, bf16, &s, &mean, &rstd);
    rc_row_affine(x, w, b, y, d, s, mean, rstd, bf16);
}

static inline __attribute__((always_inline)) void rc_layer_norm_row(const void *x,
                                                                    const void *w, const void *b,
                                                                    void *y, int64_t d,
                                                                    double eps, int bf16)
{
    float amax;
    float sum = rc_row_sum(x, d, 1.0f, &amax, bf16);
    rc_layer_norm_rest(x, w, b, y, d, sum, amax, eps, bf16);
}

static inline __attribute__((always_inline)) void rc_rms_norm_row(const void *x, const void *w,
                                                                  void *y, int64_t d, double eps,
                                                                  int bf16)
{
    float amax;
    float ss = rc_row_sumsq(x, d, 1.0f, 0.0f, &amax, bf16);
    float s = rc_norm_scale(amax);
    if (s != 1.0f)
        ss = rc_row_sumsq(x, d, s, 0.0f, NULL, bf16);
    rc_row_affine(x, w, NULL, y, d, s, 0.0f, rc_norm_rstd(ss / (float)d, eps, s), bf16);
}

#endif
