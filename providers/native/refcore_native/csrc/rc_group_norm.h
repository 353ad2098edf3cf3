/* group_norm and group_norm_silu (specs/norm.yaml, specs/fused.yaml) on a level's helpers:
 * rc_row_sum / rc_norm_stats (rc_norm_row.h) and rc_span_affine1 / rc_span_affinev
 * (rc_norm_<level>.h). Included by norm_<level>.c after its level header.
 *
 * x, y: (n, c, hw) in NCHW (cl = 0: each (sample, group) block is one contiguous row of
 * c/g * hw values) or channels-last (cl = 1: (n, hw, c), a block is c/g channels of every pixel).
 * w, b: (c,) in the input's dtype, or NULL. silu: apply x * sigmoid(x) to each output (the
 * fused op). Statistics are layer_norm's (fp32 sums, rows scaled by a power of two when their
 * squares would overflow or underflow, the corrected two-pass variance), so group_norm is right
 * wherever layer_norm is.
 *
 * Channels-last takes three passes over pixel ranges split into `parts` per sample (the caller's
 * thread count, at most hw): per-channel sums and max |x|, per-channel centred sums of squares,
 * the output. `work` is the caller's fp32 scratch of rc_group_norm_work(n, c, parts) floats, so
 * the kernel allocates nothing. A group whose values need scaling, or whose spread is below
 * 2^-15 of its mean, takes its exact sums serially over its (strided) values (rare).
 */
#ifndef RC_GROUP_NORM_H
#define RC_GROUP_NORM_H

/* NCHW: block k = (sample, group) is one contiguous row of d = cg * hw values */
static inline __attribute__((always_inline)) void rc_gn_nchw_block(
    const void *x, const void *w, const void *b, void *y, int64_t k, int64_t g, int64_t cg,
    int64_t hw, double eps, int bf16, int silu)
{
    const int64_t d = cg * hw, es = bf16 ? 2 : 4;
    const char *xb = (const char *)x + k * d * es;
    char *yb = (char *)y + k * d * es;
    float amax, s, mean, rstd;
    const float sum = rc_row_sum(xb, d, 1.0f, &amax, bf16);
    rc_norm_stats(xb, d, sum, amax, eps, bf16, &s, &mean, &rstd);
    for (int64_t i = 0; i < cg; i++) {
        const int64_t ch = (k % g) * cg + i;
        rc_span_affine1(xb + i * hw * es, yb + i * hw * es, hw, s, mean, rstd,
                        w ? rc_ld(w, ch, bf16) : 1.0f, b ? rc_ld(b, ch, bf16) : 0.0f, w != NULL,
                        b != NULL, silu, bf16);
    }
}

/* the pixel range [p0, p1) of part t of a sample's hw pixels split in `parts` */
static inline void rc_gn_part(int64_t hw, int64_t parts, int64_t t, int64_t *p0, int64_t *p1)
{
    *p0 = hw * t / parts;
    *p1 = hw * (t + 1) / parts;
}

/* sum of x*s - cc over group gg of sample nn (channels-last), serially, Neumaier-compensated in
 * double: for the rare groups that need scaling or the constant-group correction */
static inline float rc_gn_group_sum(const void *x, int64_t nn, int64_t gg, int64_t c,
                                    int64_t hw, int64_t cg, float s, float cc, int bf16)
{
    double t = 0.0, comp = 0.0;
    for (int64_t p = 0; p < hw; p++)
        for (int64_t i = 0; i < cg; i++) {
            const int64_t at = (nn * hw + p) * c + gg * cg + i;
            const double v = (double)(rc_ld(x, at, bf16) * s - cc), u = t + v;
            comp += fabs(t) >= fabs(v) ? (t - u) + v : (v - u) + t;
            t = u;
        }
    return (float)(t + comp);
}

/* channels-last pass 1 over part k: per-channel sums (sq = 0) and max |x|, or pass 2: per-channel
 * sums of (x*s - mean)^2 (sq = 1; s, m per channel of the sample) */
static inline __attribute__((always_inline)) void rc_gn_nhwc_reduce(
    const void *x, float *acc, float *mx, const float *s, const float *m, int64_t k,
    int64_t parts, int64_t hw, int64_t c, int sq, int bf16)
{
    const int64_t nn = k / parts;
    int64_t p0, p1;
    rc_gn_part(hw, parts, k % parts, &p0, &p1);
    for (int64_t ch = 0; ch < c; ch++)
        acc[ch] = 0.0f;
    if (!sq)
        for (int64_t ch = 0; ch < c; ch++)
            mx[ch] = 0.0f;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t row = (nn * hw + p) * c;
        if (sq) {
            for (int64_t ch = 0; ch < c; ch++) {
                const float t = rc_ld(x, row + ch, bf16) * s[ch] - m[ch];
                acc[ch] += t * t;
            }
        } else {
            for (int64_t ch = 0; ch < c; ch++) {
                const float v = rc_ld(x, row + ch, bf16), a = fabsf(v);
                acc[ch] += v;
                mx[ch] = a > mx[ch] || a != a ? a : mx[ch]; /* NaN wins: scale 1 */
            }
        }
    }
}

/* channels-last, serial between the passes: each group's s and mean (after pass 1) */
static inline void rc_gn_nhwc_means(const void *x, const float *psum, const float *pmax,
                                    float *cs, float *cm, int64_t n, int64_t c, int64_t hw,
                                    int64_t g, int64_t parts, int bf16)
{
    const int64_t cg = c / g, d = cg * hw;
    for (int64_t nn = 0; nn < n; nn++)
        for (int64_t gg = 0; gg < g; gg++) {
            float sum = 0.0f, amax = 0.0f;
            for (int64_t t = 0; t < parts; t++)
                for (int64_t i = 0; i < cg; i++) {
                    const int64_t at = (nn * parts + t) * c + gg * cg + i;
                    sum += psum[at];
                    amax = pmax[at] > amax || pmax[at] != pmax[at] ? pmax[at] : amax;
                }
            const float s = rc_norm_scale(amax);
            if (s != 1.0f)
                sum = rc_gn_group_sum(x, nn, gg, c, hw, cg, s, 0.0f, bf16);
            for (int64_t i = 0; i < cg; i++) {
                cs[nn * c + gg * cg + i] = s;
                cm[nn * c + gg * cg + i] = sum / (float)d;
            }
        }
}

/* channels-last, serial after pass 2: each group's corrected mean and rstd */
static inline void rc_gn_nhwc_rstd(const void *x, const float *psq, const float *cs, float *cm,
                                   float *cr, int64_t n, int64_t c, int64_t hw, int64_t g,
                                   int64_t parts, double eps, int bf16)
{
    const int64_t cg = c / g, d = cg * hw;
    for (int64_t nn = 0; nn < n; nn++)
        for (int64_t gg = 0; gg < g; gg++) {
            const int64_t c0 = nn * c + gg * cg;
            float var = 0.0f, mean = cm[c0];
            const float s = cs[c0];
            for (int64_t t = 0; t < parts; t++)
                for (int64_t i = 0; i < cg; i++)
                    var += psq[(nn * parts + t) * c + gg * cg + i];
            var /= (float)d;
            if (var <= mean * mean * 0x1p-30f) { /* a (nearly) constant group: see rc_row_csum */
                const float dm = rc_gn_group_sum(x, nn, gg, c, hw, cg, s, mean, bf16) / (float)d;
                mean += dm;
                var = var - dm * dm > 0.0f ? var - dm * dm : 0.0f;
            }
            const float r = rc_norm_rstd(var, eps, s);
            for (int64_t i = 0; i < cg; i++) {
                cm[c0 + i] = mean;
                cr[c0 + i] = r;
            }
        }
}

/* channels-last pass 3 over part k: the outputs */
static inline __attribute__((always_inline)) void rc_gn_nhwc_out(
    const void *x, void *y, const float *cs, const float *cm, const float *cr, const float *w32,
    const float *b32, int64_t k, int64_t parts, int64_t hw, int64_t c, int bf16, int silu)
{
    const int64_t nn = k / parts, es = bf16 ? 2 : 4;
    int64_t p0, p1;
    rc_gn_part(hw, parts, k % parts, &p0, &p1);
    for (int64_t p = p0; p < p1; p++) {
        const int64_t row = (nn * hw + p) * c;
        rc_span_affinev((const char *)x + row * es, (char *)y + row * es, c, cs + nn * c,
                        cm + nn * c, cr + nn * c, w32, b32, silu, bf16);
    }
}

/* The exported kernel of one dtype. Every parallel loop is written out here with BF16 and the
 * SiLU flag as literals at each call, so the loop bodies are specialised (OpenMP outlines a
 * region before inlining: a flag passed down as a variable would stay one, and branch per value).
 * work (channels-last): partial sums and max |x| (n*parts*c each), per (sample, channel) s,
 * mean, rstd (n*c each), fp32 weight and bias (c each). */
#define RC_GROUP_NORM_FN(tag, BF16)                                                                \
    void RC_FN(rc_group_norm_##tag)(const void *x, const void *w, const void *b, void *y,          \
                                    int64_t n, int64_t c, int64_t hw, int64_t g, int cl,           \
                                    int silu, double eps, int64_t parts, void *work, int nt)       \
    {                                                                                              \
        const int64_t cg = c / g;                                                                  \
        if (!cl) {                                                                                 \
            RC_PARALLEL_FOR(nt, rc_rows_per_chunk(cg * hw * (BF16 ? 2 : 4)))                       \
            for (int64_t k = 0; k < n * g; k++) {                                                  \
                if (silu)                                                                          \
                    rc_gn_nchw_block(x, w, b, y, k, g, cg, hw, eps, BF16, 1);                      \
                else                                                                               \
                    rc_gn_nchw_block(x, w, b, y, k, g, cg, hw, eps, BF16, 0);                      \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        float *psum = (float *)work, *pmax = psum + n * parts * c, *cs = pmax + n * parts * c;     \
        float *cm = cs + n * c, *cr = cm + n * c, *w32 = cr + n * c, *b32 = w32 + c;               \
        for (int64_t ch = 0; ch < c; ch++) {                                                       \
            w32[ch] = w ? rc_ld(w, ch, BF16) : 1.0f;                                               \
            b32[ch] = b ? rc_ld(b, ch, BF16) : 0.0f;                                               \
        }                                                                                          \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t k = 0; k < n * parts; k++)                                                    \
            rc_gn_nhwc_reduce(x, psum + k * c, pmax + k * c, NULL, NULL, k, parts, hw, c, 0,       \
                              BF16);                                                               \
        rc_gn_nhwc_means(x, psum, pmax, cs, cm, n, c, hw, g, parts, BF16);                         \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t k = 0; k < n * parts; k++)                                                    \
            rc_gn_nhwc_reduce(x, psum + k * c, NULL, cs + (k / parts) * c, cm + (k / parts) * c,   \
                              k, parts, hw, c, 1, BF16);                                           \
        rc_gn_nhwc_rstd(x, psum, cs, cm, cr, n, c, hw, g, parts, eps, BF16);                       \
        const float *wv = w ? w32 : NULL, *bv = b ? b32 : NULL;                                    \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t k = 0; k < n * parts; k++) {                                                  \
            if (silu)                                                                              \
                rc_gn_nhwc_out(x, y, cs, cm, cr, wv, bv, k, parts, hw, c, BF16, 1);                \
            else                                                                                   \
                rc_gn_nhwc_out(x, y, cs, cm, cr, wv, bv, k, parts, hw, c, BF16, 0);                \
        }                                                                                          \
    }

#endif
