/* fused family, AVX-512: add + relu / gelu (erf, tanh) / silu, add + layer_norm.
 *
 * One pass over memory: the sum is formed in fp32, rounded to the dtype (as the unfused add
 * stores it: for bf16 the activation and the norm see the rounded sum, as the reference does),
 * then activated (rc_avx512.h formulas) or normalised (rc_norm_avx512.h: the sum is stored into
 * the output row while its mean is accumulated; the variance and affine passes read it from
 * cache). Same-shape operands run as one flat
 * loop in chunks of RC_CHUNK elements; a broadcast row (stride 0) runs row by row.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include "fused.h"
#include "rc_norm_avx512.h"

enum { RC_CHUNK = 16384, NONE = 0, RELU = 1, GELU = 2, GELU_TANH = 3, SILU = 4 };

static inline __attribute__((always_inline)) __m512 act(__m512 x, int op)
{
    switch (op) {
    case RELU: /* vmaxps returns its second operand when either is NaN: NaN stays NaN */
        return _mm512_max_ps(_mm512_setzero_ps(), x);
    case GELU:
        return rc_gelu_erf(x);
    case GELU_TANH:
        return rc_gelu_tanh(x);
    case SILU:
        return rc_silu(x);
    default:
        return x;
    }
}

/* a + b rounded to the dtype (a no-op for fp32), in fp32 */
static inline __attribute__((always_inline)) __m512 sum(__m512 a, __m512 b, int bf16)
{
    __m512 s = _mm512_add_ps(a, b);
    return bf16 ? rc_widen_bf16(rc_narrow_bf16(s)) : s;
}

/* y[j] = act(a[j] + b[j]) for j in [lo, hi) */
static inline __attribute__((always_inline)) void span(const void *a, const void *b, void *y,
                                                       int64_t lo, int64_t hi, int op, int bf16)
{
    int64_t j = lo;
    for (; j + 16 <= hi; j += 16)
        rc_store(y, j, act(sum(rc_load(a, j, bf16), rc_load(b, j, bf16), bf16), op), bf16);
    if (j < hi) {
        __mmask16 m = rc_tail16(hi - j);
        __m512 v = sum(rc_load_m(a, j, m, bf16), rc_load_m(b, j, m, bf16), bf16);
        rc_store_m(y, j, m, act(v, op), bf16);
    }
}

/* y[j] = a[j] + b[j] (rounded to the dtype) over a row of d; returns the row's sum of y and
 * puts its max |y| into *amax, so the norm needs two more passes over the row (from cache) */
static inline __attribute__((always_inline)) float add_row_sum(const void *a, const void *b,
                                                               void *y, int64_t d, float *amax,
                                                               int bf16)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, m0 = s0, m1 = s0;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
        __m512 v0 = sum(rc_load(a, j, bf16), rc_load(b, j, bf16), bf16);
        __m512 v1 = sum(rc_load(a, j + 16, bf16), rc_load(b, j + 16, bf16), bf16);
        rc_store(y, j, v0, bf16);
        rc_store(y, j + 16, v1, bf16);
        s0 = _mm512_add_ps(s0, v0);
        s1 = _mm512_add_ps(s1, v1);
        m0 = _mm512_max_ps(_mm512_abs_ps(v0), m0);
        m1 = _mm512_max_ps(_mm512_abs_ps(v1), m1);
    }
    for (; j < d; j += 16) {
        __mmask16 m = rc_tail16(d - j);
        __m512 v = sum(rc_load_m(a, j, m, bf16), rc_load_m(b, j, m, bf16), bf16);
        rc_store_m(y, j, m, v, bf16);
        s0 = _mm512_add_ps(s0, v); /* masked lanes are 0 + 0 */
        m0 = _mm512_max_ps(_mm512_abs_ps(v), m0);
    }
    *amax = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* y row = layer_norm(a row + b row): the sum stored into y with its mean, then two passes over y
 * from cache (centred sum of squares, affine in place) */
static inline __attribute__((always_inline)) void ln_row(const void *a, const void *b,
                                                         const void *w, const void *bias, void *y,
                                                         int64_t d, double eps, int bf16)
{
    float amax, total = add_row_sum(a, b, y, d, &amax, bf16);
    rc_layer_norm_rest(y, w, bias, y, d, total, amax, eps, bf16);
}

#include "rc_fused_driver.h"

RC_ADD_ACT(add_relu, bf16, RELU, 1)
RC_ADD_ACT(add_gelu, bf16, GELU, 1)
RC_ADD_ACT(add_gelu_tanh, bf16, GELU_TANH, 1)
RC_ADD_ACT(add_silu, bf16, SILU, 1)

RC_ADD_LN(bf16, 1)

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
RC_ADD_ACT(add_relu, f32, RELU, 0)
RC_ADD_ACT(add_gelu, f32, GELU, 0)
RC_ADD_ACT(add_gelu_tanh, f32, GELU_TANH, 0)
RC_ADD_ACT(add_silu, f32, SILU, 0)

RC_ADD_LN(f32, 0)
#endif
