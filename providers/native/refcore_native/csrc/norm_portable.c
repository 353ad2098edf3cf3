/* norm family, portable C (baseline x86-64 / any target): layer_norm, rms_norm.
 *
 * Statistics are reduced in fp32 with 8 partial sums (as torch's CPU kernels accumulate in fp32;
 * the partial sums let the compiler vectorize without reassociation flags), then the variance
 * step is done in double. layer_norm takes two passes over a row that is already in cache (mean,
 * then the centred sum of squares), so its variance does not suffer the cancellation of a
 * one-pass sum / sum of squares; rows too large or too small for fp32 squares are scaled by a
 * power of two first (rc_norm_row.h). Each output is formed in fp32 and rounded once to bf16 (RNE).
 */
#define RC_LEVEL portable

#include "norm.h"
#include "rc_norm_portable.h"

void rc_layer_norm_f32_portable(const void *x, const void *w, const void *b, void *y,
                                int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const float *)x + i * d, w, b, (float *)y + i * d, d, eps, 0);
}

void rc_layer_norm_bf16_portable(const void *x, const void *w, const void *b, void *y,
                                 int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const uint16_t *)x + i * d, w, b, (uint16_t *)y + i * d, d, eps, 1);
}

void rc_rms_norm_f32_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                              double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_rms_norm_row((const float *)x + i * d, w, (float *)y + i * d, d, eps, 0);
}

void rc_rms_norm_bf16_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                               double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rc_rms_norm_row((const uint16_t *)x + i * d, w, (uint16_t *)y + i * d, d, eps, 1);
}

#include "rc_group_norm.h"
#include "rc_channel_affine.h"

RC_GROUP_NORM_FN(f32, 0)
RC_GROUP_NORM_FN(bf16, 1)
RC_CHANNEL_AFFINE_FN(f32, 0)
RC_CHANNEL_AFFINE_FN(bf16, 1)
