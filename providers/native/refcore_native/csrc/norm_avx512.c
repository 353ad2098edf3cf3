/* norm family, AVX-512: layer_norm, rms_norm (same arithmetic as norm_portable.c).
 *
 * One row per iteration, rows split statically over the threads. Statistics use four 16-lane
 * fp32 accumulators (64 elements per step), the row tail a masked load; the variance step is in
 * double. The row is read from memory once and from cache for the later passes.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include "norm.h"
#include "rc_norm_avx512.h"

void RC_FN(rc_layer_norm_bf16)(const void *x, const void *w, const void *b, void *y,
                               int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const uint16_t *)x + i * d, w, b, (uint16_t *)y + i * d, d, eps, 1);
}

void RC_FN(rc_rms_norm_bf16)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                             double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rc_rms_norm_row((const uint16_t *)x + i * d, w, (uint16_t *)y + i * d, d, eps, 1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
void RC_FN(rc_layer_norm_f32)(const void *x, const void *w, const void *b, void *y,
                              int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_layer_norm_row((const float *)x + i * d, w, b, (float *)y + i * d, d, eps, 0);
}

void RC_FN(rc_rms_norm_f32)(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                            double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rc_rms_norm_row((const float *)x + i * d, w, (float *)y + i * d, d, eps, 0);
}
#endif

#include "rc_group_norm.h"
#include "rc_channel_affine.h"

#ifndef RC_BF16_ONLY
RC_GROUP_NORM_FN(f32, 0)
#endif
RC_GROUP_NORM_FN(bf16, 1)

#ifndef RC_BF16_ONLY
RC_CHANNEL_AFFINE_FN(f32, 0)
#endif
RC_CHANNEL_AFFINE_FN(bf16, 1)
