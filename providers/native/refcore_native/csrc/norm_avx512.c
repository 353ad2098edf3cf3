/* norm family, AVX-512: layer_norm, rms_norm (same arithmetic as norm_portable.c).
 *
 * One row per iteration, rows split statically over the threads. Statistics use four 16-lane
 * fp32 accumulators (64 elements per step), the row tail a masked load; the variance step is in
 * double. The row is read from memory once and from cache for the later passes.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include "norm.h"
#include "rc_avx512.h"

/* sum of (x - c)^2 when sq, else sum of x */
static inline __attribute__((always_inline)) float row_reduce(const void *x, int64_t d, float c,
                                                             int sq, int bf16)
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
static inline __attribute__((always_inline)) void row_affine(const void *x, const void *w,
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

static inline __attribute__((always_inline)) void layer_norm_row(const void *x, const void *w,
                                                                 const void *b, void *y,
                                                                 int64_t d, double eps, int bf16)
{
    float mean = row_reduce(x, d, 0.0f, 0, bf16) / (float)d;
    float var = row_reduce(x, d, mean, 1, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)var + eps));
    row_affine(x, w, b, y, d, mean, rstd, bf16);
}

static inline __attribute__((always_inline)) void rms_norm_row(const void *x, const void *w,
                                                               void *y, int64_t d, double eps,
                                                               int bf16)
{
    float ms = row_reduce(x, d, 0.0f, 1, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)ms + eps));
    row_affine(x, w, NULL, y, d, 0.0f, rstd, bf16);
}

void RC_FN(rc_layer_norm_bf16)(const void *x, const void *w, const void *b, void *y,
                               int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        layer_norm_row((const uint16_t *)x + i * d, w, b, (uint16_t *)y + i * d, d, eps, 1);
}

void RC_FN(rc_rms_norm_bf16)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                             double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rms_norm_row((const uint16_t *)x + i * d, w, (uint16_t *)y + i * d, d, eps, 1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
void RC_FN(rc_layer_norm_f32)(const void *x, const void *w, const void *b, void *y,
                              int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        layer_norm_row((const float *)x + i * d, w, b, (float *)y + i * d, d, eps, 0);
}

void RC_FN(rc_rms_norm_f32)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                            double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rms_norm_row((const float *)x + i * d, w, (float *)y + i * d, d, eps, 0);
}
#endif
