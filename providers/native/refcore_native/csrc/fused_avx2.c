/* fused family, AVX2 (+FMA): add + relu / gelu (erf, tanh) / silu, add + layer_norm.
 *
 * fused_avx512.c on 8 lanes: one pass over memory, the sum formed in fp32 and rounded to the
 * dtype (as the unfused add stores it), then activated (rc_avx2.h formulas) or normalised
 * (rc_norm_avx2.h: the sum is stored into the output row while its sum and max |.| are taken;
 * the variance and affine passes read it from cache). Same-shape operands run as one flat loop
 * in chunks of RC_CHUNK elements; a broadcast row (stride 0) runs row by row.
 */
#define RC_LEVEL avx2

#include "fused.h"
#include "rc_norm_avx2.h"

enum { RC_CHUNK = 16384, NONE = 0, RELU = 1, GELU = 2, GELU_TANH = 3, SILU = 4 };

RC_INLINE __m256 act(__m256 x, int op)
{
    switch (op) {
    case RELU: /* vmaxps returns its second operand when either is NaN: NaN stays NaN */
        return _mm256_max_ps(_mm256_setzero_ps(), x);
    case GELU:
        return rc8_gelu_erf(x);
    case GELU_TANH:
        return rc8_gelu_tanh(x);
    case SILU:
        return rc8_silu(x);
    default:
        return x;
    }
}

/* y[j] = act(a[j] + b[j]) for j in [lo, hi), the sum rounded to the dtype first */
RC_INLINE void span(const void *a, const void *b, void *y, int64_t lo, int64_t hi, int op,
                    int bf16)
{
    int64_t j = lo;
    for (; j + 16 <= hi; j += 16) {
        __m256 v0 = _mm256_add_ps(rc8_load(a, j, bf16), rc8_load(b, j, bf16));
        __m256 v1 = _mm256_add_ps(rc8_load(a, j + 8, bf16), rc8_load(b, j + 8, bf16));
        rc8_store(y, j, act(rc8_round_to(v0, bf16), op), bf16);
        rc8_store(y, j + 8, act(rc8_round_to(v1, bf16), op), bf16);
    }
    for (; j + 8 <= hi; j += 8) {
        __m256 v = _mm256_add_ps(rc8_load(a, j, bf16), rc8_load(b, j, bf16));
        rc8_store(y, j, act(rc8_round_to(v, bf16), op), bf16);
    }
    if (j < hi) {
        int64_t n = hi - j;
        __m256 v = _mm256_add_ps(rc8_load_n(a, j, n, bf16), rc8_load_n(b, j, n, bf16));
        rc8_store_n(y, j, n, act(rc8_round_to(v, bf16), op), bf16);
    }
}

/* y[j] = a[j] + b[j] (rounded to the dtype) over a row of d; returns the row's sum of y and
 * puts its max |y| into *amax, so the norm needs two more passes over the row (from cache) */
RC_INLINE float add_row_sum(const void *a, const void *b, void *y, int64_t d, float *amax,
                            int bf16)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, m0 = s0, m1 = s0;
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        __m256 v0 = rc8_round_to(_mm256_add_ps(rc8_load(a, j, bf16), rc8_load(b, j, bf16)), bf16);
        __m256 v1 = rc8_round_to(
            _mm256_add_ps(rc8_load(a, j + 8, bf16), rc8_load(b, j + 8, bf16)), bf16);
        rc8_store(y, j, v0, bf16);
        rc8_store(y, j + 8, v1, bf16);
        s0 = _mm256_add_ps(s0, v0);
        s1 = _mm256_add_ps(s1, v1);
        m0 = _mm256_max_ps(rc8_abs(v0), m0);
        m1 = _mm256_max_ps(rc8_abs(v1), m1);
    }
    for (; j < d; j += 8) { /* unused lanes of a partial load are 0 + 0 */
        int64_t n = rc_min64(8, d - j);
        __m256 v = _mm256_add_ps(rc8_load_n(a, j, n, bf16), rc8_load_n(b, j, n, bf16));
        v = rc8_round_to(v, bf16);
        rc8_store_n(y, j, n, v, bf16);
        s0 = _mm256_add_ps(s0, v);
        m0 = _mm256_max_ps(rc8_abs(v), m0);
    }
    *amax = rc8_hmax(_mm256_max_ps(m0, m1));
    return rc8_hsum(_mm256_add_ps(s0, s1));
}

/* y row = layer_norm(a row + b row): the sum stored into y with its sum and max, then two passes
 * over y from cache (centred sum of squares, affine in place) */
RC_INLINE void ln_row(const void *a, const void *b, const void *w, const void *bias, void *y,
                      int64_t d, double eps, int bf16)
{
    float amax, total = add_row_sum(a, b, y, d, &amax, bf16);
    rc_layer_norm_rest(y, w, bias, y, d, total, amax, eps, bf16);
}

#include "rc_fused_driver.h"

RC_ADD_ACT(add_relu, f32, RELU, 0)
RC_ADD_ACT(add_relu, bf16, RELU, 1)
RC_ADD_ACT(add_gelu, f32, GELU, 0)
RC_ADD_ACT(add_gelu, bf16, GELU, 1)
RC_ADD_ACT(add_gelu_tanh, f32, GELU_TANH, 0)
RC_ADD_ACT(add_gelu_tanh, bf16, GELU_TANH, 1)
RC_ADD_ACT(add_silu, f32, SILU, 0)
RC_ADD_ACT(add_silu, bf16, SILU, 1)

RC_ADD_LN(f32, 0)
RC_ADD_LN(bf16, 1)
