/* reduction family, AVX-512: softmax and log_softmax over contiguous rows.
 *
 * Same passes as reduction_portable.c, 16 lanes at a time with a masked tail: max, then
 * exp(x - max) summed in fp32 (four accumulators), then the output. softmax keeps exp(x - max)
 * in fp32 during the sum and rescales it (one exp per element): in the output row itself for
 * float32, in a per-thread scratch row for bf16. Special values as in the portable file; the
 * vector max ignores NaN, which the sum then propagates.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include <stdlib.h>

#include "rc_avx512.h"
#include "reduction.h"

static inline __attribute__((always_inline)) float row_max(const void *x, int64_t d, int bf16)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        m0 = _mm512_max_ps(rc_load(x, j, bf16), m0);
        m1 = _mm512_max_ps(rc_load(x, j + 16, bf16), m1);
    }
    for (; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        m0 = _mm512_mask_max_ps(m0, m, rc_load_m(x, j, m, bf16), m0);
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

/* sum of exp(x - mx); when keep, exp(x - mx) is also stored to the fp32 row y */
static inline __attribute__((always_inline)) float row_sumexp(const void *x, float *y, int64_t d,
                                                             float mx, int keep, int bf16)
{
    const __m512 vm = _mm512_set1_ps(mx);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= d; j += 64) {
        __m512 e0 = rc_exp_nonpos(_mm512_sub_ps(rc_load(x, j, bf16), vm));
        __m512 e1 = rc_exp_nonpos(_mm512_sub_ps(rc_load(x, j + 16, bf16), vm));
        __m512 e2 = rc_exp_nonpos(_mm512_sub_ps(rc_load(x, j + 32, bf16), vm));
        __m512 e3 = rc_exp_nonpos(_mm512_sub_ps(rc_load(x, j + 48, bf16), vm));
        if (keep) {
            _mm512_storeu_ps(y + j, e0);
            _mm512_storeu_ps(y + j + 16, e1);
            _mm512_storeu_ps(y + j + 32, e2);
            _mm512_storeu_ps(y + j + 48, e3);
        }
        s0 = _mm512_add_ps(s0, e0);
        s1 = _mm512_add_ps(s1, e1);
        s2 = _mm512_add_ps(s2, e2);
        s3 = _mm512_add_ps(s3, e3);
    }
    for (; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        __m512 e = rc_exp_nonpos(_mm512_sub_ps(rc_load_m(x, j, m, bf16), vm));
        if (keep)
            _mm512_mask_storeu_ps(y + j, m, e);
        s0 = _mm512_mask_add_ps(s0, m, s0, e);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* tmp: an fp32 row for exp(x - max) (the output row itself for float32), or NULL to compute
 * the exp twice (bf16 when the scratch row could not be allocated) */
static inline __attribute__((always_inline)) void softmax_row(const void *x, void *y, int64_t d,
                                                              float *tmp, int bf16)
{
    float mx = row_max(x, d, bf16);
    if (tmp) {
        const __m512 inv = _mm512_set1_ps(1.0f / row_sumexp(x, tmp, d, mx, 1, bf16));
        for (int64_t j = 0; j < d; j += 16) {
            __mmask16 m = rc_tail16(d - j);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, tmp + j), inv);
            if (m == 0xffff)
                rc_store(y, j, v, bf16);
            else
                rc_store_m(y, j, m, v, bf16);
        }
        return;
    }
    const __m512 vm = _mm512_set1_ps(mx);
    const __m512 inv = _mm512_set1_ps(1.0f / row_sumexp(x, NULL, d, mx, 0, bf16));
    for (int64_t j = 0; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        __m512 e = rc_exp_nonpos(_mm512_sub_ps(rc_load_m(x, j, m, bf16), vm));
        rc_store_m(y, j, m, _mm512_mul_ps(e, inv), bf16);
    }
}

static inline __attribute__((always_inline)) void log_softmax_row(const void *x, void *y,
                                                                  int64_t d, int bf16)
{
    float mx = row_max(x, d, bf16);
    const __m512 vm = _mm512_set1_ps(mx);
    const __m512 lse = _mm512_set1_ps((float)log((double)row_sumexp(x, NULL, d, mx, 0, bf16)));
    int64_t j = 0;
    for (; j + 16 <= d; j += 16)
        rc_store(y, j, _mm512_sub_ps(_mm512_sub_ps(rc_load(x, j, bf16), vm), lse), bf16);
    if (j < d) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = _mm512_sub_ps(_mm512_sub_ps(rc_load_m(x, j, m, bf16), vm), lse);
        rc_store_m(y, j, m, v, bf16);
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

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
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
#endif
