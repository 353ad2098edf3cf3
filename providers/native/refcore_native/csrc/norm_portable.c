/* norm family, portable C (baseline x86-64 / any target): layer_norm, rms_norm.
 *
 * Statistics are reduced in fp32 with 8 partial sums (as torch's CPU kernels accumulate in fp32;
 * the partial sums let the compiler vectorize without reassociation flags), then the variance
 * step is done in double. layer_norm takes two passes over a row that is already in cache (mean,
 * then the centred sum of squares), so its variance does not suffer the cancellation of a
 * one-pass sum / sum of squares. Each output is formed in fp32 and rounded once to bf16 (RNE).
 */
#include "norm.h"
#include "rc_common.h"

enum { P = 8 };

static inline float row_sum(const void *x, int64_t d, int bf16)
{
    float s[P] = {0};
    int64_t j = 0;
    for (; j + P <= d; j += P)
        for (int k = 0; k < P; k++)
            s[k] += rc_ld(x, j + k, bf16);
    for (; j < d; j++)
        s[0] += rc_ld(x, j, bf16);
    float t = 0.0f;
    for (int k = 0; k < P; k++)
        t += s[k];
    return t;
}

/* sum of (x - c)^2 */
static inline float row_sumsq(const void *x, int64_t d, float c, int bf16)
{
    float s[P] = {0};
    int64_t j = 0;
    for (; j + P <= d; j += P)
        for (int k = 0; k < P; k++) {
            float v = rc_ld(x, j + k, bf16) - c;
            s[k] += v * v;
        }
    for (; j < d; j++) {
        float v = rc_ld(x, j, bf16) - c;
        s[0] += v * v;
    }
    float t = 0.0f;
    for (int k = 0; k < P; k++)
        t += s[k];
    return t;
}

static inline void layer_norm_row(const void *x, const void *w, const void *b, void *y, int64_t d,
                                  double eps, int bf16)
{
    float mean = row_sum(x, d, bf16) / (float)d;
    float var = row_sumsq(x, d, mean, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)var + eps));
    for (int64_t j = 0; j < d; j++) {
        /* (x - mean) * (rstd * w) + b: no cancellation on a constant row (see specs/norm.yaml) */
        float scale = w ? rstd * rc_ld(w, j, bf16) : rstd;
        float v = (rc_ld(x, j, bf16) - mean) * scale;
        rc_st(y, j, b ? v + rc_ld(b, j, bf16) : v, bf16);
    }
}

static inline void rms_norm_row(const void *x, const void *w, void *y, int64_t d, double eps,
                                int bf16)
{
    float ms = row_sumsq(x, d, 0.0f, bf16) / (float)d;
    float rstd = (float)(1.0 / sqrt((double)ms + eps));
    for (int64_t j = 0; j < d; j++) {
        float scale = w ? rstd * rc_ld(w, j, bf16) : rstd;
        rc_st(y, j, rc_ld(x, j, bf16) * scale, bf16);
    }
}

void rc_layer_norm_f32_portable(const void *x, const void *w, const void *b, void *y,
                                int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        layer_norm_row((const float *)x + i * d, w, b, (float *)y + i * d, d, eps, 0);
}

void rc_layer_norm_bf16_portable(const void *x, const void *w, const void *b, void *y,
                                 int64_t rows, int64_t d, double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        layer_norm_row((const uint16_t *)x + i * d, w, b, (uint16_t *)y + i * d, d, eps, 1);
}

void rc_rms_norm_f32_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                              double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 4))
    for (int64_t i = 0; i < rows; i++)
        rms_norm_row((const float *)x + i * d, w, (float *)y + i * d, d, eps, 0);
}

void rc_rms_norm_bf16_portable(const void *x, const void *w, void *y, int64_t rows, int64_t d,
                               double eps, int nt)
{
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * 2))
    for (int64_t i = 0; i < rows; i++)
        rms_norm_row((const uint16_t *)x + i * d, w, (uint16_t *)y + i * d, d, eps, 1);
}
