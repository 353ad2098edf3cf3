/* norm family, AVX2 (+FMA): layer_norm, rms_norm (same arithmetic as norm_portable.c).
 *
 * One row per iteration, rows handed out in chunks of ~64 KB over the threads; the row helpers
 * (rc_norm_avx2.h, rc_norm_row.h) read a row from memory once and from cache for the later
 * passes. bf16 is widened exactly and each output rounded once (RNE).
 */
#define RC_LEVEL avx2

#include "norm.h"
#include "rc_norm_avx2.h"

void RC_FN(rc_layer_norm_f32)(const void *x, const void *w, const void *b, void *y,
                              int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const float *)x + i * d, w, b, (float *)y + i * d, d, eps, 0);
}

void RC_FN(rc_layer_norm_bf16)(const void *x, const void *w, const void *b, void *y,
                               int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const uint16_t *)x + i * d, w, b, (uint16_t *)y + i * d, d, eps, 1);
}

void RC_FN(rc_rms_norm_f32)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                            double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_rms_norm_row((const float *)x + i * d, w, (float *)y + i * d, d, eps, 0);
}

void RC_FN(rc_rms_norm_bf16)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
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
