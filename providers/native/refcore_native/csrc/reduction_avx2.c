/* reduction family, AVX2 (+FMA): softmax and log_softmax over contiguous rows.
 *
 * The passes of reduction_avx512.c on 8 lanes with a partial tail: max, then exp(x - max)
 * (rc8_exp_nonpos: flushed to 0 below -70, never a denormal) summed in fp32 (four
 * accumulators), then the output. softmax keeps exp(x - max) in fp32 during the sum and rescales
 * it (one exp per element): in the output row itself for float32, in a per-thread scratch row for
 * bf16. The vector max ignores NaN, which the sum then propagates.
 */
#define RC_LEVEL avx2

#include <stdlib.h>

#include "rc_avx2.h"
#include "reduction.h"

RC_INLINE float row_max(const void *x, int64_t d, int bf16)
{
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        m0 = _mm256_max_ps(rc8_load(x, j, bf16), m0);
        m1 = _mm256_max_ps(rc8_load(x, j + 8, bf16), m1);
        m2 = _mm256_max_ps(rc8_load(x, j + 16, bf16), m2);
        m3 = _mm256_max_ps(rc8_load(x, j + 24, bf16), m3);
    }
    for (; j + 8 <= d; j += 8)
        m0 = _mm256_max_ps(rc8_load(x, j, bf16), m0);
    if (j < d) { /* unused lanes stay -inf */
        __m256 keep = _mm256_castsi256_ps(rc8_lanes(d - j));
        __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), rc8_load_n(x, j, d - j, bf16), keep);
        m1 = _mm256_max_ps(v, m1);
    }
    return rc8_hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* sum of exp(x - mx); when keep, exp(x - mx) is also stored to the fp32 row y */
RC_INLINE float row_sumexp(const void *x, float *y, int64_t d, float mx, int keep, int bf16)
{
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        __m256 e0 = rc8_exp_nonpos(_mm256_sub_ps(rc8_load(x, j, bf16), vm));
        __m256 e1 = rc8_exp_nonpos(_mm256_sub_ps(rc8_load(x, j + 8, bf16), vm));
        __m256 e2 = rc8_exp_nonpos(_mm256_sub_ps(rc8_load(x, j + 16, bf16), vm));
        __m256 e3 = rc8_exp_nonpos(_mm256_sub_ps(rc8_load(x, j + 24, bf16), vm));
        if (keep) {
            _mm256_storeu_ps(y + j, e0);
            _mm256_storeu_ps(y + j + 8, e1);
            _mm256_storeu_ps(y + j + 16, e2);
            _mm256_storeu_ps(y + j + 24, e3);
        }
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
        s2 = _mm256_add_ps(s2, e2);
        s3 = _mm256_add_ps(s3, e3);
    }
    for (; j + 8 <= d; j += 8) {
        __m256 e = rc8_exp_nonpos(_mm256_sub_ps(rc8_load(x, j, bf16), vm));
        if (keep)
            _mm256_storeu_ps(y + j, e);
        s0 = _mm256_add_ps(s0, e);
    }
    if (j < d) {
        __m256 e = rc8_exp_nonpos(_mm256_sub_ps(rc8_load_n(x, j, d - j, bf16), vm));
        e = _mm256_and_ps(_mm256_castsi256_ps(rc8_lanes(d - j)), e);
        if (keep)
            rc8_store_n(y, j, d - j, e, 0);
        s1 = _mm256_add_ps(s1, e);
    }
    return rc8_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* y = tmp * inv over a row (tmp fp32) */
RC_INLINE void row_scale(const float *tmp, void *y, int64_t d, float inv, int bf16)
{
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        __m256 v0 = _mm256_mul_ps(_mm256_loadu_ps(tmp + j), vi);
        __m256 v1 = _mm256_mul_ps(_mm256_loadu_ps(tmp + j + 8), vi);
        rc8_store(y, j, v0, bf16);
        rc8_store(y, j + 8, v1, bf16);
    }
    for (; j + 8 <= d; j += 8)
        rc8_store(y, j, _mm256_mul_ps(_mm256_loadu_ps(tmp + j), vi), bf16);
    if (j < d)
        rc8_store_n(y, j, d - j, _mm256_mul_ps(rc8_load_n(tmp, j, d - j, 0), vi), bf16);
}

/* tmp: an fp32 row for exp(x - max) (the output row itself for float32), or NULL to compute
 * the exp twice (bf16 when the scratch row could not be allocated) */
RC_INLINE void softmax_row(const void *x, void *y, int64_t d, float *tmp, int bf16)
{
    float mx = row_max(x, d, bf16);
    if (tmp) {
        row_scale(tmp, y, d, 1.0f / row_sumexp(x, tmp, d, mx, 1, bf16), bf16);
        return;
    }
    const __m256 vm = _mm256_set1_ps(mx);
    const __m256 inv = _mm256_set1_ps(1.0f / row_sumexp(x, NULL, d, mx, 0, bf16));
    for (int64_t j = 0; j < d; j += 8) {
        int64_t n = rc_min64(8, d - j);
        __m256 e = rc8_exp_nonpos(_mm256_sub_ps(rc8_load_n(x, j, n, bf16), vm));
        rc8_store_n(y, j, n, _mm256_mul_ps(e, inv), bf16);
    }
}

RC_INLINE void log_softmax_row(const void *x, void *y, int64_t d, int bf16)
{
    float mx = row_max(x, d, bf16);
    const __m256 vm = _mm256_set1_ps(mx);
    const __m256 lse = _mm256_set1_ps((float)log((double)row_sumexp(x, NULL, d, mx, 0, bf16)));
    int64_t j = 0;
    for (; j + 8 <= d; j += 8)
        rc8_store(y, j, _mm256_sub_ps(_mm256_sub_ps(rc8_load(x, j, bf16), vm), lse), bf16);
    if (j < d) {
        __m256 v = _mm256_sub_ps(_mm256_sub_ps(rc8_load_n(x, j, d - j, bf16), vm), lse);
        rc8_store_n(y, j, d - j, v, bf16);
    }
}

void RC_FN(rc_softmax_bf16)(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        float *tmp = malloc((size_t)d * sizeof(float)); /* one fp32 row per thread */
#pragma omp for schedule(dynamic, rc_rows_per_chunk(d * 2))
        for (int64_t i = 0; i < rows; i++)
            softmax_row((const uint16_t *)x + i * d, (uint16_t *)y + i * d, d, tmp, 1);
        free(tmp);
    }
}

void RC_FN(rc_log_softmax_bf16)(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        log_softmax_row((const uint16_t *)x + i * d, (uint16_t *)y + i * d, d, 1);
}

void RC_FN(rc_softmax_f32)(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        softmax_row((const float *)x + i * d, (float *)y + i * d, d, (float *)y + i * d, 0);
}

void RC_FN(rc_log_softmax_f32)(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        log_softmax_row((const float *)x + i * d, (float *)y + i * d, d, 0);
}
