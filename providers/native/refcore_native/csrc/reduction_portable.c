/* reduction family, portable C: softmax and log_softmax over contiguous rows.
 *
 * Three passes over a row in cache: max, sum of exp(x - max), output. As in the reference, a row
 * holding NaN or +inf, or all -inf, gives NaN throughout (x - max is NaN somewhere, so is the
 * sum); -inf entries get probability 0 and log-probability -inf (x - max - log(sum) is formed
 * without an exp, so it stays exact there).
 */
#include "rc_common.h"
#include "reduction.h"

static inline float row_max(const void *x, int64_t d, int bf16)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < d; j++) {
        float v = rc_ld(x, j, bf16);
        m = v > m ? v : m; /* a NaN is skipped here but poisons the sum below */
    }
    return m;
}

static inline double row_sumexp(const void *x, int64_t d, float mx, int bf16)
{
    double s = 0.0;
    for (int64_t j = 0; j < d; j++)
        s += expf(rc_ld(x, j, bf16) - mx);
    return s;
}

static inline void softmax_row(const void *x, void *y, int64_t d, int bf16)
{
    float mx = row_max(x, d, bf16);
    float inv = (float)(1.0 / row_sumexp(x, d, mx, bf16));
    for (int64_t j = 0; j < d; j++)
        rc_st(y, j, expf(rc_ld(x, j, bf16) - mx) * inv, bf16);
}

static inline void log_softmax_row(const void *x, void *y, int64_t d, int bf16)
{
    float mx = row_max(x, d, bf16);
    float lse = (float)log(row_sumexp(x, d, mx, bf16));
    for (int64_t j = 0; j < d; j++)
        rc_st(y, j, (rc_ld(x, j, bf16) - mx) - lse, bf16);
}

void rc_softmax_f32_portable(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        softmax_row((const float *)x + i * d, (float *)y + i * d, d, 0);
}

void rc_softmax_bf16_portable(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        softmax_row((const uint16_t *)x + i * d, (uint16_t *)y + i * d, d, 1);
}

void rc_log_softmax_f32_portable(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        log_softmax_row((const float *)x + i * d, (float *)y + i * d, d, 0);
}

void rc_log_softmax_bf16_portable(const void *x, void *y, int64_t rows, int64_t d, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        log_softmax_row((const uint16_t *)x + i * d, (uint16_t *)y + i * d, d, 1);
}
