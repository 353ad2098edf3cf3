/* fused family, AVX-512: add + relu / gelu (erf, tanh) / silu, add + layer_norm.
 *
 * One pass over memory: the sum is formed in fp32, rounded to the dtype (as the unfused add
 * stores it: for bf16 the activation and the norm see the rounded sum, as the reference does),
 * then activated (rc_avx512.h formulas) or normalised (rc_norm_avx512.h: the sum is stored into
 * the output row, whose later passes read it from cache). Same-shape operands run as one flat
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

#define RC_ROW(p, i, rs) ((const char *)(p) + (i) * (rs) * esz)

static inline __attribute__((always_inline)) void add_act(const void *a, const void *b, void *y,
                                                          int64_t rows, int64_t d, int64_t a_rs,
                                                          int64_t b_rs, int nt, int op, int bf16)
{
    const int64_t esz = bf16 ? 2 : 4;
    if (a_rs == d && b_rs == d) {
        const int64_t n = rows * d, chunks = (n + RC_CHUNK - 1) / RC_CHUNK;
        RC_PARALLEL_FOR(nt, 1)
        for (int64_t c = 0; c < chunks; c++)
            span(a, b, y, c * RC_CHUNK, rc_min64(n, (c + 1) * RC_CHUNK), op, bf16);
        return;
    }
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * esz))
    for (int64_t i = 0; i < rows; i++)
        span(RC_ROW(a, i, a_rs), RC_ROW(b, i, b_rs), (char *)y + i * d * esz, 0, d, op, bf16);
}

static inline __attribute__((always_inline)) void add_layer_norm(
    const void *a, const void *b, const void *w, const void *bias, void *y, int64_t rows,
    int64_t d, int64_t a_rs, int64_t b_rs, double eps, int nt, int bf16)
{
    const int64_t esz = bf16 ? 2 : 4;
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(2 * d * esz))
    for (int64_t i = 0; i < rows; i++) {
        char *yi = (char *)y + i * d * esz;
        span(RC_ROW(a, i, a_rs), RC_ROW(b, i, b_rs), yi, 0, d, NONE, bf16);
        rc_layer_norm_row(yi, w, bias, yi, d, eps, bf16);
    }
}

#define RC_ADD_ACT(name, tag, op, bf16)                                                            \
    void RC_FN(rc_##name##_##tag)(const void *a, const void *b, void *y, int64_t rows, int64_t d, \
                                  int64_t a_rs, int64_t b_rs, int nt)                              \
    {                                                                                              \
        add_act(a, b, y, rows, d, a_rs, b_rs, nt, op, bf16);                                       \
    }

RC_ADD_ACT(add_relu, bf16, RELU, 1)
RC_ADD_ACT(add_gelu, bf16, GELU, 1)
RC_ADD_ACT(add_gelu_tanh, bf16, GELU_TANH, 1)
RC_ADD_ACT(add_silu, bf16, SILU, 1)

void RC_FN(rc_add_layer_norm_bf16)(const void *a, const void *b, const void *w, const void *bias,
                                   void *y, int64_t rows, int64_t d, int64_t a_rs, int64_t b_rs,
                                   double eps, int nt)
{
    add_layer_norm(a, b, w, bias, y, rows, d, a_rs, b_rs, eps, nt, 1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
RC_ADD_ACT(add_relu, f32, RELU, 0)
RC_ADD_ACT(add_gelu, f32, GELU, 0)
RC_ADD_ACT(add_gelu_tanh, f32, GELU_TANH, 0)
RC_ADD_ACT(add_silu, f32, SILU, 0)

void RC_FN(rc_add_layer_norm_f32)(const void *a, const void *b, const void *w, const void *bias,
                                  void *y, int64_t rows, int64_t d, int64_t a_rs, int64_t b_rs,
                                  double eps, int nt)
{
    add_layer_norm(a, b, w, bias, y, rows, d, a_rs, b_rs, eps, nt, 0);
}
#endif
