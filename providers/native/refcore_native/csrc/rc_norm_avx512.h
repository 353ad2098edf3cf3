/* AVX-512 row helpers of layer_norm / rms_norm (see rc_norm_row.h), shared by norm_avx512.c and
 * fused_avx512.c (add_layer_norm).
 *
 * Statistics use four 16-lane fp32 accumulators (64 elements per step), the row tail a masked
 * load; the variance step is in double. The row is read from memory once and from cache for the
 * later passes. rc_layer_norm_row may run in place (y == x): each output is written after the
 * last read of its input.
 */
#ifndef RC_NORM_AVX512_H
#define RC_NORM_AVX512_H

#include "rc_avx512.h"

/* sum of (x*s - c)^2 when sq, else of x*s; max |x| into *amax when amax is not NULL */
static inline __attribute__((always_inline)) float rc_row_reduce(const void *x, int64_t d,
                                                                float s, float c, int sq,
                                                                float *amax, int bf16)
{
    const __m512 vs = _mm512_set1_ps(s), vc = _mm512_set1_ps(c);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, m0 = s0, m1 = s0;
    int64_t j = 0;
#define RC_TERM(v) _mm512_fmsub_ps((v), vs, vc)
#define RC_ACC(s, m, v)                                                                            \
    do {                                                                                           \
        __m512 v_ = (v);                                                                           \
        if (amax)                                                                                  \
            m = _mm512_max_ps(_mm512_abs_ps(v_), m);                                               \
        s = sq ? _mm512_fmadd_ps(RC_TERM(v_), RC_TERM(v_), s) : _mm512_fmadd_ps(v_, vs, s);        \
    } while (0)
    for (; j + 64 <= d; j += 64) {
        RC_ACC(s0, m0, rc_load(x, j, bf16));
        RC_ACC(s1, m1, rc_load(x, j + 16, bf16));
        RC_ACC(s2, m0, rc_load(x, j + 32, bf16));
        RC_ACC(s3, m1, rc_load(x, j + 48, bf16));
    }
    for (; j + 16 <= d; j += 16)
        RC_ACC(s0, m0, rc_load(x, j, bf16));
    if (j < d) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = rc_load_m(x, j, m, bf16);
        if (amax)
            m1 = _mm512_max_ps(_mm512_abs_ps(v), m1); /* masked lanes are 0 */
        /* (0*s - c)^2 must not count */
        s1 = sq ? _mm512_mask3_fmadd_ps(RC_TERM(v), RC_TERM(v), s1, m) : _mm512_fmadd_ps(v, vs, s1);
    }
#undef RC_ACC
#undef RC_TERM
    if (amax)
        *amax = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static inline __attribute__((always_inline)) float rc_row_sum(const void *x, int64_t d, float s,
                                                             float *amax, int bf16)
{
    return rc_row_reduce(x, d, s, 0.0f, 0, amax, bf16);
}

static inline __attribute__((always_inline)) float rc_row_sumsq(const void *x, int64_t d,
                                                               float s, float c, float *amax,
                                                               int bf16)
{
    return rc_row_reduce(x, d, s, c, 1, amax, bf16);
}

/* y = ((x*s - c) * rstd) * w + b over a row; w, b may be NULL */
static inline __attribute__((always_inline)) void rc_row_affine(const void *x, const void *w,
                                                                const void *b, void *y, int64_t d,
                                                                float s, float c, float rstd,
                                                                int bf16)
{
    const __m512 vs = _mm512_set1_ps(s), vc = _mm512_set1_ps(c), vr = _mm512_set1_ps(rstd);
    int64_t j = 0;
    for (; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = _mm512_fmsub_ps(rc_load_m(x, j, m, bf16), vs, vc);
        __m512 scale = vr;
        if (w) { /* (v * rstd) * w: rstd * w first overflowed where the result is finite (fuzz) */
            v = _mm512_mul_ps(v, vr);
            scale = rc_load_m(w, j, m, bf16);
        }
        v = b ? _mm512_fmadd_ps(v, scale, rc_load_m(b, j, m, bf16)) : _mm512_mul_ps(v, scale);
        if (m == 0xffff)
            rc_store(y, j, v, bf16);
        else
            rc_store_m(y, j, m, v, bf16);
    }
}

/* group_norm's output step (rc_group_norm.h): y = silu?(((x*s - c) * rstd) * w + b) over n
 * values; rc_span_affine1 with one s, c, rstd, w, b for them all (an NCHW channel plane; hw, hb:
 * whether w, b were given), rc_span_affinev with per-value fp32 arrays (a channels-last pixel; w,
 * b may be NULL). */
static inline __attribute__((always_inline)) __m512 rc16_gn(__m512 v, __m512 s, __m512 c,
                                                            __m512 r, __m512 w, __m512 b, int hw,
                                                            int hb, int silu, int bf16)
{
    v = _mm512_mul_ps(_mm512_fmsub_ps(v, s, c), r);
    if (hw)
        v = hb ? _mm512_fmadd_ps(v, w, b) : _mm512_mul_ps(v, w);
    else if (hb) {
        __asm__("" : "+v"(v)); /* no contraction into an FMA: see rc8_gn (rc_norm_avx2.h) */
        v = _mm512_add_ps(v, b);
    }
    return silu ? rc_silu(rc_round_to(v, bf16)) : v; /* silu of the dtype's value: see rc8_gn */
}

static inline __attribute__((always_inline)) void rc_span_affine1(const void *x, void *y,
                                                                  int64_t n, float s, float c,
                                                                  float r, float w, float b,
                                                                  int hw, int hb, int silu,
                                                                  int bf16)
{
    const __m512 vs = _mm512_set1_ps(s), vc = _mm512_set1_ps(c), vr = _mm512_set1_ps(r);
    const __m512 vw = _mm512_set1_ps(w), vb = _mm512_set1_ps(b);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = rc_tail16(n - j);
        __m512 v = rc16_gn(rc_load_m(x, j, m, bf16), vs, vc, vr, vw, vb, hw, hb, silu, bf16);
        if (m == 0xffff)
            rc_store(y, j, v, bf16);
        else
            rc_store_m(y, j, m, v, bf16);
    }
}

static inline __attribute__((always_inline)) void rc_span_affinev(const void *x, void *y,
                                                                  int64_t n, const float *s,
                                                                  const float *c, const float *r,
                                                                  const float *w, const float *b,
                                                                  int silu, int bf16)
{
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 m = rc_tail16(n - j);
        __m512 v = rc16_gn(rc_load_m(x, j, m, bf16), rc_load_m(s, j, m, 0),
                           rc_load_m(c, j, m, 0), rc_load_m(r, j, m, 0),
                           w ? rc_load_m(w, j, m, 0) : one, b ? rc_load_m(b, j, m, 0) : zero,
                           w != NULL, b != NULL, silu, bf16);
        if (m == 0xffff)
            rc_store(y, j, v, bf16);
        else
            rc_store_m(y, j, m, v, bf16);
    }
}

#include "rc_norm_row.h"

#endif
