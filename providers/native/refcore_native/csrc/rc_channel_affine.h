/* channel_affine (specs/fused.yaml): y = x * scale[c] + shift[c], the product rounded to fp32
 * before the add as torch's mul then add (for bf16 the product is kept in fp32 and the sum
 * rounded once: one rounding fewer than torch, within the fused op's tolerance). On the level's
 * rc_span_affine1 / rc_span_affinev (rc_norm_<level>.h) with s = 1, c = 0 (x * 1 - 0 is x
 * exactly), rstd = scale, no weight, bias = shift. Included by norm_<level>.c.
 *
 * x, y: (n, c, hw) in NCHW (cl = 0) or channels-last (cl = 1: (n, hw, c)); scale, shift: (c,)
 * fp32 (the wrapper widens bf16 ones exactly). work: 2 * c fp32 of scratch (channels-last: the
 * ones and zeros the vector helper reads).
 */
#ifndef RC_CHANNEL_AFFINE_H
#define RC_CHANNEL_AFFINE_H

#define RC_CHANNEL_AFFINE_FN(tag, BF16)                                                            \
    void RC_FN(rc_channel_affine_##tag)(const void *x, const void *scale_, const void *shift_,     \
                                        void *y, int64_t n, int64_t c, int64_t hw, int cl,         \
                                        void *work, int nt)                                        \
    {                                                                                              \
        const int64_t es = BF16 ? 2 : 4;                                                           \
        const float *scale = (const float *)scale_, *shift = (const float *)shift_;                \
        if (!cl) {                                                                                 \
            RC_PARALLEL_FOR(nt, rc_rows_per_chunk(hw * es))                                        \
            for (int64_t k = 0; k < n * c; k++)                                                    \
                rc_span_affine1((const char *)x + k * hw * es, (char *)y + k * hw * es, hw, 1.0f,  \
                                0.0f, scale[k % c], 1.0f, shift[k % c], 0, 1, 0, BF16);            \
            return;                                                                                \
        }                                                                                          \
        float *ones = (float *)work, *zeros = ones + c;                                            \
        for (int64_t j = 0; j < c; j++) {                                                          \
            ones[j] = 1.0f;                                                                        \
            zeros[j] = 0.0f;                                                                       \
        }                                                                                          \
        RC_PARALLEL_FOR(nt, rc_rows_per_chunk(c * es))                                             \
        for (int64_t p = 0; p < n * hw; p++)                                                       \
            rc_span_affinev((const char *)x + p * c * es, (char *)y + p * c * es, c, ones, zeros,  \
                            scale, NULL, shift, 0, BF16);                                          \
    }

#endif
