/* elementwise family, AVX-512: gelu (erf, tanh), silu, add (same shape, trailing row).
 *
 * The activations are the vector formulas of rc_avx512.h (exp, Phi(-|x|), reciprocal: a few ulp
 * in fp32), four 16-lane vectors per iteration (independent chains keep both FMA ports busy)
 * and a masked tail; flat loops are split over the threads in chunks of RC_CHUNK elements; bf16
 * is widened exactly and rounded once (RNE) at the store.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include "elementwise.h"
#include "rc_avx512.h"

enum { RC_CHUNK = 16384, GELU = 0, GELU_TANH = 1, SILU = 2 };

static inline __attribute__((always_inline)) __m512 unary(__m512 x, int op)
{
    return op == GELU ? rc_gelu_erf(x) : op == GELU_TANH ? rc_gelu_tanh(x) : rc_silu(x);
}

static inline __attribute__((always_inline)) void unary_chunk(const void *x, void *y, int64_t c,
                                                              int64_t n, int op, int bf16)
{
    int64_t j = c * RC_CHUNK, hi = rc_min64(n, (c + 1) * RC_CHUNK);
    for (; j + 64 <= hi; j += 64) {
        __m512 v0 = rc_load(x, j, bf16), v1 = rc_load(x, j + 16, bf16);
        __m512 v2 = rc_load(x, j + 32, bf16), v3 = rc_load(x, j + 48, bf16);
        v0 = unary(v0, op);
        v1 = unary(v1, op);
        v2 = unary(v2, op);
        v3 = unary(v3, op);
        rc_store(y, j, v0, bf16);
        rc_store(y, j + 16, v1, bf16);
        rc_store(y, j + 32, v2, bf16);
        rc_store(y, j + 48, v3, bf16);
    }
    for (; j + 16 <= hi; j += 16)
        rc_store(y, j, unary(rc_load(x, j, bf16), op), bf16);
    if (j < hi) {
        __mmask16 m = rc_tail16(hi - j);
        rc_store_m(y, j, m, unary(rc_load_m(x, j, m, bf16), op), bf16);
    }
}

#define RC_CHUNKS(n) (((n) + RC_CHUNK - 1) / RC_CHUNK)

/* y[j] = a[j] + alpha * b[j] over [lo, hi) with one rounding (FMA) */
static inline __attribute__((always_inline)) void add_span(const void *a, const void *b, void *y,
                                                           int64_t lo, int64_t hi, __m512 alpha,
                                                           int bf16)
{
    int64_t j = lo;
    for (; j + 16 <= hi; j += 16)
        rc_store(y, j, _mm512_fmadd_ps(alpha, rc_load(b, j, bf16), rc_load(a, j, bf16)), bf16);
    if (j < hi) {
        __mmask16 m = rc_tail16(hi - j);
        __m512 v = _mm512_fmadd_ps(alpha, rc_load_m(b, j, m, bf16), rc_load_m(a, j, m, bf16));
        rc_store_m(y, j, m, v, bf16);
    }
}

/* One row of the full operand against the broadcast row (both start at element 0 here). */
static inline __attribute__((always_inline)) void add_row(const void *full, const void *row,
                                                          void *y, int64_t d, __m512 alpha,
                                                          int row_is_input, int bf16)
{
    if (row_is_input)
        add_span(row, full, y, 0, d, alpha, bf16);
    else
        add_span(full, row, y, 0, d, alpha, bf16);
}

void RC_FN(rc_gelu_bf16)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU, 1);
}

void RC_FN(rc_gelu_tanh_bf16)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU_TANH, 1);
}

void RC_FN(rc_silu_bf16)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, SILU, 1);
}

void RC_FN(rc_add_bf16)(const void *a, const void *b, void *y, int64_t n, float alpha, int nt)
{
    const __m512 va = _mm512_set1_ps(alpha);
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        add_span(a, b, y, c * RC_CHUNK, rc_min64(n, (c + 1) * RC_CHUNK), va, 1);
}

void RC_FN(rc_add_row_bf16)(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                            float alpha, int row_is_input, int nt)
{
    const __m512 va = _mm512_set1_ps(alpha);
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        add_row((const uint16_t *)full + i * d, row, (uint16_t *)y + i * d, d, va, row_is_input,
                1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
void RC_FN(rc_gelu_f32)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU, 0);
}

void RC_FN(rc_gelu_tanh_f32)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU_TANH, 0);
}

void RC_FN(rc_silu_f32)(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, SILU, 0);
}

void RC_FN(rc_add_f32)(const void *a, const void *b, void *y, int64_t n, float alpha, int nt)
{
    const __m512 va = _mm512_set1_ps(alpha);
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        add_span(a, b, y, c * RC_CHUNK, rc_min64(n, (c + 1) * RC_CHUNK), va, 0);
}

void RC_FN(rc_add_row_f32)(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                           float alpha, int row_is_input, int nt)
{
    const __m512 va = _mm512_set1_ps(alpha);
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        add_row((const float *)full + i * d, row, (float *)y + i * d, d, va, row_is_input, 0);
}
#endif
