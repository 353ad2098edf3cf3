/* vision family, portable C: roi_align. Also compiled at the avx2 and avx512 levels
 * (vision_avx2.c, vision_avx512.c include this file with RC_LEVEL set), where the compiler
 * vectorizes the channel loop with that level's vectors: the kernel is that loop.
 *
 * Boxes are split over the threads (dynamic chunks: boxes differ in their sample counts); a
 * thread writes only its boxes' outputs, so the result does not depend on the thread count. A
 * box is computed one block of up to BLOCK channels at a time, bin by bin: the bin's samples are
 * accumulated in an fp32 stack buffer (its four bilinear taps each) and averaged once. The
 * sample positions are computed as refcore/ops/vision.py declares (float32, no FMA: `nofma`).
 */
#ifndef RC_LEVEL
#define RC_LEVEL portable
#endif
#include "vision.h"
#include "rc_common.h"

enum { BLOCK = 256 };

#define nofma __attribute__((optimize("fp-contract=off")))

/* Sample i of bin b along one axis: torchvision's start + b * bin + (i + 0.5) * bin / grid. */
static nofma float sample_at(float start, float bin, int64_t b, int64_t i, int64_t grid)
{
    return (start + (float)b * bin) + ((float)i + 0.5f) * bin / (float)grid;
}

/* Box corner start and side along one axis (scaled, shifted by half a pixel when aligned, at
 * least 1 when not). */
static nofma void box_axis(float lo, float hi, float scale, int aligned, float *start, float *side)
{
    float off = aligned ? 0.5f : 0.0f;
    float a = lo * scale - off, b = hi * scale - off;
    float s = b - a;
    *start = a;
    *side = (!aligned && !(s >= 1.0f)) ? 1.0f : s;
}

/* Samples per bin along one axis: ratio, or ceil(side / bins) (at least 0); -1 when the side is
 * not finite or the grid exceeds max_grid. */
static nofma int64_t grid_of(float side, int64_t bins, int64_t ratio, int64_t max_grid)
{
    if (!isfinite(side))
        return -1;
    if (ratio > 0)
        return ratio <= max_grid ? ratio : -1;
    float q = ceilf(side / (float)bins);
    if (!(q <= (float)max_grid))
        return -1;
    return q > 0.0f ? (int64_t)q : 0;
}

/* A sample's two neighbours along an axis of `extent` pixels and the high one's weight;
 * 0 when the position is outside [-1, extent] (or NaN: then nothing is read). */
static inline int tap(float p, int64_t extent, int64_t *lo, int64_t *hi, float *frac)
{
    if (!(p >= -1.0f && p <= (float)extent))
        return 0;
    if (p <= 0.0f)
        p = 0.0f;
    int64_t l = (int64_t)p;
    if (l >= extent - 1) {
        *lo = *hi = extent - 1;
        *frac = 0.0f;
    } else {
        *lo = l;
        *hi = l + 1;
        *frac = p - (float)l;
    }
    return 1;
}

static inline float load(const void *x, int64_t i, int bf16)
{
    return bf16 ? rc_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* acc[j] += weights of the four taps of one sample, channels [0, nc) at channel stride sc.
 * Not contracted into FMAs (`nofma`): two taps of equal weight on +-3e38 pixels cancel exactly
 * only when both products are rounded; an FMA kept one exact and left its rounding error, 1e29
 * where the reference and torch give 0 (found by refcore.fuzz on the AVX2 build). */
static nofma void accumulate(float *restrict acc, const void *x, int64_t p1, int64_t p2,
                              int64_t p3, int64_t p4, float w1, float w2, float w3, float w4,
                              int64_t nc, int64_t sc, int bf16)
{
    if (sc == 1 && !bf16) {
        const float *f = (const float *)x;
        for (int64_t j = 0; j < nc; j++)
            acc[j] += w1 * f[p1 + j] + w2 * f[p2 + j] + w3 * f[p3 + j] + w4 * f[p4 + j];
    } else if (sc == 1) {
        const uint16_t *u = (const uint16_t *)x;
        for (int64_t j = 0; j < nc; j++)
            acc[j] += w1 * rc_bf16_to_f32(u[p1 + j]) + w2 * rc_bf16_to_f32(u[p2 + j]) +
                      w3 * rc_bf16_to_f32(u[p3 + j]) + w4 * rc_bf16_to_f32(u[p4 + j]);
    } else {
        for (int64_t j = 0; j < nc; j++)
            acc[j] += w1 * load(x, p1 + j * sc, bf16) + w2 * load(x, p2 + j * sc, bf16) +
                      w3 * load(x, p3 + j * sc, bf16) + w4 * load(x, p4 + j * sc, bf16);
    }
}

static int64_t roi_align(const void *x, int64_t n, int64_t c, int64_t h, int64_t w, int64_t sn,
                         int64_t sc, int64_t sh, int64_t sw, const void *boxes, int64_t k,
                         int64_t oh, int64_t ow, float scale, int64_t ratio, int aligned,
                         int64_t max_grid, void *y, int64_t yk, int64_t yc, int64_t yh,
                         int64_t yw, int nt, int bf16)
{
    int64_t bad = 0; /* 1 + the first bad box, any thread's (all are checked first) */
    for (int64_t r = 0; r < k && !bad; r++) {
        const float *b = (const float *)boxes + 5 * r;
        float sx, sy, bw, bh;
        box_axis(b[1], b[3], scale, aligned, &sx, &bw);
        box_axis(b[2], b[4], scale, aligned, &sy, &bh);
        /* every corner finite: a NaN x2 made the side NaN, which !(s >= 1) turned into 1 */
        if (!(b[0] >= 0.0f && b[0] < (float)n && b[0] == (float)(int64_t)b[0]) ||
            !isfinite(b[1]) || !isfinite(b[2]) || !isfinite(b[3]) || !isfinite(b[4]) ||
            !isfinite(sx) || !isfinite(sy) || grid_of(bh, oh, ratio, max_grid) < 0 ||
            grid_of(bw, ow, ratio, max_grid) < 0)
            bad = r + 1;
    }
    if (bad)
        return bad;
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t r = 0; r < k; r++) {
        const float *b = (const float *)boxes + 5 * r;
        float sx, sy, bw, bh;
        box_axis(b[1], b[3], scale, aligned, &sx, &bw);
        box_axis(b[2], b[4], scale, aligned, &sy, &bh);
        int64_t gh = grid_of(bh, oh, ratio, max_grid), gw = grid_of(bw, ow, ratio, max_grid);
        float binh = bh / (float)oh, binw = bw / (float)ow;
        float inv = 1.0f / (float)(gh * gw > 1 ? gh * gw : 1);
        int64_t base = (int64_t)b[0] * sn;
        float acc[BLOCK];
        for (int64_t c0 = 0; c0 < c; c0 += BLOCK) {
            int64_t nc = rc_min64(BLOCK, c - c0);
            for (int64_t ph = 0; ph < oh; ph++)
                for (int64_t pw = 0; pw < ow; pw++) {
                    for (int64_t j = 0; j < nc; j++)
                        acc[j] = 0.0f;
                    for (int64_t iy = 0; iy < gh; iy++) {
                        int64_t yl, yh2;
                        float ly;
                        if (!tap(sample_at(sy, binh, ph, iy, gh), h, &yl, &yh2, &ly))
                            continue;
                        for (int64_t ix = 0; ix < gw; ix++) {
                            int64_t xl, xh;
                            float lx;
                            if (!tap(sample_at(sx, binw, pw, ix, gw), w, &xl, &xh, &lx))
                                continue;
                            float hy = 1.0f - ly, hx = 1.0f - lx;
                            int64_t o = base + c0 * sc;
                            accumulate(acc, x, o + yl * sh + xl * sw, o + yl * sh + xh * sw,
                                       o + yh2 * sh + xl * sw, o + yh2 * sh + xh * sw, hy * hx,
                                       hy * lx, ly * hx, ly * lx, nc, sc, bf16);
                        }
                    }
                    int64_t out = r * yk + c0 * yc + ph * yh + pw * yw;
                    for (int64_t j = 0; j < nc; j++)
                        rc_st(y, out + j * yc, acc[j] * inv, bf16);
                }
        }
    }
    return 0;
}

int64_t RC_FN(rc_roi_align_f32)(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                float scale, int64_t ratio, int aligned, int64_t max_grid,
                                void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt)
{
    return roi_align(x, n, c, h, w, sn, sc, sh, sw, boxes, k, oh, ow, scale, ratio, aligned,
                     max_grid, y, yk, yc, yh, yw, nt, 0);
}

int64_t RC_FN(rc_roi_align_bf16)(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                 int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                 const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                 float scale, int64_t ratio, int aligned, int64_t max_grid,
                                 void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt)
{
    return roi_align(x, n, c, h, w, sn, sc, sh, sw, boxes, k, oh, ow, scale, ratio, aligned,
                     max_grid, y, yk, yc, yh, yw, nt, 1);
}
