/* elementwise family, portable C: gelu (erf, tanh), silu, add (same shape, trailing row).
 *
 * Scalar libm formulas (erfcf, expf; rc_scalar.h) in fp32, one rounding to bf16 at the store.
 * Flat loops are split over the threads in chunks of RC_CHUNK elements.
 */
#include "elementwise.h"
#include "rc_scalar.h"

enum { RC_CHUNK = 16384, GELU = 0, GELU_TANH = 1, SILU = 2 };

static inline float unary(float x, int op)
{
    return op == GELU ? rc_gelu_erf1(x) : op == GELU_TANH ? rc_gelu_tanh1(x) : rc_silu1(x);
}

static inline void unary_chunk(const void *x, void *y, int64_t c, int64_t n, int op, int bf16)
{
    int64_t hi = rc_min64(n, (c + 1) * RC_CHUNK);
    for (int64_t j = c * RC_CHUNK; j < hi; j++)
        rc_st(y, j, unary(rc_ld(x, j, bf16), op), bf16);
}

#define RC_CHUNKS(n) (((n) + RC_CHUNK - 1) / RC_CHUNK)

void rc_gelu_f32_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU, 0);
}

void rc_gelu_bf16_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU, 1);
}

void rc_gelu_tanh_f32_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU_TANH, 0);
}

void rc_gelu_tanh_bf16_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, GELU_TANH, 1);
}

void rc_silu_f32_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, SILU, 0);
}

void rc_silu_bf16_portable(const void *x, void *y, int64_t n, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        unary_chunk(x, y, c, n, SILU, 1);
}

/* fmaf: one rounding, so a + alpha * b cannot overflow in between */
static inline void add_chunk(const void *a, const void *b, void *y, int64_t c, int64_t n,
                             float alpha, int bf16)
{
    int64_t hi = rc_min64(n, (c + 1) * RC_CHUNK);
    for (int64_t j = c * RC_CHUNK; j < hi; j++)
        rc_st(y, j, fmaf(alpha, rc_ld(b, j, bf16), rc_ld(a, j, bf16)), bf16);
}

void rc_add_f32_portable(const void *a, const void *b, void *y, int64_t n, float alpha, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        add_chunk(a, b, y, c, n, alpha, 0);
}

void rc_add_bf16_portable(const void *a, const void *b, void *y, int64_t n, float alpha, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(n); c++)
        add_chunk(a, b, y, c, n, alpha, 1);
}

static inline void add_row(const void *full, const void *row, void *y, int64_t d, float alpha,
                           int row_is_input, int bf16)
{
    for (int64_t j = 0; j < d; j++) {
        float f = rc_ld(full, j, bf16), r = rc_ld(row, j, bf16);
        rc_st(y, j, row_is_input ? fmaf(alpha, f, r) : fmaf(alpha, r, f), bf16);
    }
}

void rc_add_row_f32_portable(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                             float alpha, int row_is_input, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        add_row((const float *)full + i * d, row, (float *)y + i * d, d, alpha, row_is_input, 0);
}

void rc_add_row_bf16_portable(const void *full, const void *row, void *y, int64_t rows, int64_t d,
                              float alpha, int row_is_input, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        add_row((const uint16_t *)full + i * d, row, (uint16_t *)y + i * d, d, alpha,
                row_is_input, 1);
}
