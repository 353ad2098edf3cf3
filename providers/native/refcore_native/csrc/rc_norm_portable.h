/* Portable row helpers of layer_norm, shared by norm_portable.c and fused_portable.c.
 *
 * fp32 sums with 8 partial sums (vectorizable without reassociation flags), the variance step in
 * double; rc_layer_norm_row1 may run in place (y == x).
 */
#ifndef RC_NORM_PORTABLE_H
#define RC_NORM_PORTABLE_H

#include "rc_common.h"

enum { RC_P = 8 };

static inline float rc_row_sum1(const void *x, int64_t d, int bf16)
{
    float s[RC_P] = {0};
    int64_t j = 0;
    for (; j + RC_P <= d; j += RC_P)
        for (int k = 0; k < RC_P; k++)
            s[k] += rc_ld(x, j + k, bf16);
    for (; j < d; j++)
        s[0] += rc_ld(x, j, bf16);
    float t = 0.0f;
    for (int k = 0; k < RC_P; k++)
        t += s[k];
    return t;
}

/* sum of (x - c)^2 */
static inline float rc_row_sumsq1(const void *x, int64_t d, float c, int bf16)
{
    float s[RC_P] = {0};
    int64_t j = 0;
    for (; j + RC_P <= d; j += RC_P)
        for (int k = 0; k < RC_P; k++) {
            float v = rc_ld(x, j + k, bf16) - c;
            s[k] += v * v;
        }
    for (; j < d; j++) {
        float v = rc_ld(x, j, bf16) - c;
        s[0] += v * v;
    }
    float t = 0.0f;
    for (int k = 0; k < RC_P; k++)
        t += s[k];
    return t;
}

static inline void rc_layer_norm_row1(const void *x, const void *w, const void *b, void *y,
                                      int64_t d, double eps, int bf16)
{
    float mean = rc_row_sum1(x, d, bf16) / (float)d;
    float var = rc_row_sumsq1(x, d, mean, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)var + eps));
    for (int64_t j = 0; j < d; j++) {
        /* (x - mean) * (rstd * w) + b: no cancellation on a constant row (see specs/norm.yaml) */
        float scale = w ? rstd * rc_ld(w, j, bf16) : rstd;
        float v = (rc_ld(x, j, bf16) - mean) * scale;
        rc_st(y, j, b ? v + rc_ld(b, j, bf16) : v, bf16);
    }
}

#endif
