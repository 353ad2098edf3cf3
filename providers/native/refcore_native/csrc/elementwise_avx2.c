/* elementwise family, AVX2 (+FMA): gelu (erf, tanh), silu, add (same shape, trailing row).
 *
 * The activations are the vector formulas of rc_avx2.h (those of rc_avx512.h on 8 lanes), four
 * 8-lane vectors per iteration (independent chains keep both FMA pipes busy) and a partial tail;
 * flat loops are split over the threads in chunks of RC_CHUNK elements; bf16 is widened exactly
 * and rounded once (RNE) at the store.
 */
#define RC_LEVEL avx2

#include "elementwise.h"
#include "rc_avx2.h"

enum { RC_CHUNK = 16384, GELU = 0, GELU_TANH = 1, SILU = 2 };

RC_INLINE __m256 unary(__m256 x, int op)
{
    return op == GELU ? rc8_gelu_erf(x) : op == GELU_TANH ? rc8_gelu_tanh(x) : rc8_silu(x);
}

RC_INLINE void unary_chunk(const void *x, void *y, int64_t c, int64_t n, int op, int bf16)
{
    int64_t j = c * RC_CHUNK, hi = rc_min64(n, (c + 1) * RC_CHUNK);
    for (; j + 32 <= hi; j += 32) {
        __m256 v0 = rc8_load(x, j, bf16), v1 = rc8_load(x, j + 8, bf16);
        __m256 v2 = rc8_load(x, j + 16, bf16), v3 = rc8_load(x, j + 24, bf16);
        v0 = unary(v0, op);
        v1 = unary(v1, op);
        v2 = unary(v2, op);
        v3 = unary(v3, op);
        rc8_store(y, j, v0, bf16);
        rc8_store(y, j + 8, v1, bf16);
        rc8_store(y, j + 16, v2, bf16);
        rc8_store(y, j + 24, v3, bf16);
    }
    for (; j + 8 <= hi; j += 8)
        rc8_store(y, j, unary(rc8_load(x, j, bf16), op), bf16);
    if (j < hi)
        rc8_store_n(y, j, hi - j, unary(rc8_load_n(x, j, hi - j, bf16), op), bf16);
}

#define RC_CHUNKS(n) (((n) + RC_CHUNK - 1) / RC_CHUNK)

/* y[j] = a[j] + alpha * b[j] over [lo, hi) with one rounding (FMA) */
RC_INLINE void add_span(const void *a, const void *b, void *y, int64_t lo, int64_t hi,
                        __m256 alpha, int bf16)
{
    int64_t j = lo;
    for (; j + 16 <= hi; j += 16) {
        __m256 v0 = _mm256_fmadd_ps(alpha, rc8_load(b, j, bf16), rc8_load(a, j, bf16));
        __m256 v1 = _mm256_fmadd_ps(alpha, rc8_load(b, j + 8, bf16), rc8_load(a, j + 8, bf16));
        rc8_store(y, j, v0, bf16);
        rc8_store(y, j + 8, v1, bf16);
    }
    for (; j + 8 <= hi; j += 8)
        rc8_store(y, j, _mm256_fmadd_ps(alpha, rc8_load(b, j, bf16), rc8_load(a, j, bf16)), bf16);
    if (j < hi) {
        int64_t k = hi - j;
        __m256 v = _mm256_fmadd_ps(alpha, rc8_load_n(b, j, k, bf16), rc8_load_n(a, j, k, bf16));
        rc8_store_n(y, j, k, v, bf16);
    }
}

/* One row of the full operand against the broadcast row (both start at element 0 here). */
RC_INLINE void add_row(const void *full, const void *row, void *y, int64_t d, __m256 alpha,
                       int row_is_input, int bf16)
{
    if (row_is_input)
        add_span(row, full, y, 0, d, alpha, bf16);
    else
        add_span(full, row, y, 0, d, alpha, bf16);
}

/* The exported functions write their parallel loops out: gcc outlines an OpenMP region before
 * inlining, so a region inside a shared helper would test `op` and `bf16` for every vector. */
#define RC_UNARY(name, tag, op, bf16)                                                              \
    void RC_FN(rc_##name##_##tag)(const void *x, void *y, int64_t n, int nt)                       \
    {                                                                                              \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t c = 0; c < RC_CHUNKS(n); c++)                                                 \
            unary_chunk(x, y, c, n, op, bf16);                                                     \
    }

#define RC_ADD(tag, bf16)                                                                          \
    void RC_FN(rc_add_##tag)(const void *a, const void *b, void *y, int64_t n, float alpha,        \
                             int nt)                                                               \
    {                                                                                              \
        const __m256 va = _mm256_set1_ps(alpha);                                                   \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t c = 0; c < RC_CHUNKS(n); c++)                                                 \
            add_span(a, b, y, c * RC_CHUNK, rc_min64(n, (c + 1) * RC_CHUNK), va, bf16);            \
    }                                                                                              \
    void RC_FN(rc_add_row_##tag)(const void *full, const void *row, void *y, int64_t rows,         \
                                 int64_t d, float alpha, int row_is_input, int nt)                 \
    {                                                                                              \
        const __m256 va = _mm256_set1_ps(alpha);                                                   \
        const int64_t esz = bf16 ? 2 : 4;                                                          \
        RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * esz))                                            \
        for (int64_t i = 0; i < rows; i++)                                                         \
            add_row((const char *)full + i * d * esz, row, (char *)y + i * d * esz, d, va,         \
                    row_is_input, bf16);                                                           \
    }

RC_UNARY(gelu, f32, GELU, 0)
RC_UNARY(gelu, bf16, GELU, 1)
RC_UNARY(gelu_tanh, f32, GELU_TANH, 0)
RC_UNARY(gelu_tanh, bf16, GELU_TANH, 1)
RC_UNARY(silu, f32, SILU, 0)
RC_UNARY(silu, bf16, SILU, 1)
RC_ADD(f32, 0)
RC_ADD(bf16, 1)
