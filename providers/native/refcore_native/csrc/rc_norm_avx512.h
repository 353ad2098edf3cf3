/* AVX-512 row helpers of layer_norm, shared by norm_avx512.c and fused_avx512.c (add_layer_norm).
 *
 * Statistics use four 16-lane fp32 accumulators (64 elements per step), the row tail a masked
 * load; the variance step is in double. The row is read from memory once and from cache for the
 * later passes. rc_layer_norm_row may run in place (y == x): each output is written after the
 * last read of its input.
 */
#ifndef RC_NORM_AVX512_H
#define RC_NORM_AVX512_H

#include "rc_avx512.h"

/* sum of (x - c)^2 when sq, else sum of x */
static inline __attribute__((always_inline)) float rc_row_reduce(const void *x, int64_t d,
                                                                float c, int sq, int bf16)
{
    const __m512 vc = _mm512_set1_ps(c);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
#define RC_TERM(v) (sq ? _mm512_sub_ps((v), vc) : (v))
#define RC_ACC(s, v) (sq ? _mm512_fmadd_ps(RC_TERM(v), RC_TERM(v), (s)) : _mm512_add_ps((s), (v)))
    for (; j + 64 <= d; j += 64) {
        s0 = RC_ACC(s0, rc_load(x, j, bf16));
        s1 = RC_ACC(s1, rc_load(x, j + 16, bf16));
        s2 = RC_ACC(s2, rc_load(x, j + 32, bf16));
        s3 = RC_ACC(s3, rc_load(x, j + 48, bf16));
    }
    for (; j + 16 <= d; j += 16)
        s0 = RC_ACC(s0, rc_load(x, j, bf16));
    if (j < d) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = rc_load_m(x, j, m, bf16);
        /* masked lanes are 0, and (0 - c)^2 must not count */
        s1 = sq ? _mm512_mask3_fmadd_ps(RC_TERM(v), RC_TERM(v), s1, m) : _mm512_add_ps(s1, v);
    }
#undef RC_ACC
#undef RC_TERM
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* y = (x - c) * (rstd * w) + b over a row; w, b may be NULL */
static inline __attribute__((always_inline)) void rc_row_affine(const void *x, const void *w,
                                                                const void *b, void *y, int64_t d,
                                                                float c, float rstd, int bf16)
{
    const __m512 vc = _mm512_set1_ps(c), vr = _mm512_set1_ps(rstd);
    int64_t j = 0;
    for (; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = _mm512_sub_ps(rc_load_m(x, j, m, bf16), vc);
        __m512 scale = w ? _mm512_mul_ps(vr, rc_load_m(w, j, m, bf16)) : vr;
        v = b ? _mm512_fmadd_ps(v, scale, rc_load_m(b, j, m, bf16)) : _mm512_mul_ps(v, scale);
        if (m == 0xffff)
            rc_store(y, j, v, bf16);
        else
            rc_store_m(y, j, m, v, bf16);
    }
}

static inline __attribute__((always_inline)) void rc_layer_norm_row(const void *x,
                                                                    const void *w, const void *b,
                                                                    void *y, int64_t d,
                                                                    double eps, int bf16)
{
    float mean = rc_row_reduce(x, d, 0.0f, 0, bf16) / (float)d;
    float var = rc_row_reduce(x, d, mean, 1, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)var + eps));
    rc_row_affine(x, w, b, y, d, mean, rstd, bf16);
}

#endif
