/* conv family, AVX2 + FMA (no AVX-512): fp32 and bf16 conv2d on NHWC as an implicit GEMM with
 * a 6 x 16 FMA register block (12 accumulators, two weight vectors and a broadcast of the 16
 * ymm registers), fused epilogue.
 *
 * Both dtypes compute in fp32 on fp32 operands (Zen 3 has no bf16 dot product): a bf16 input
 * is widened once per call into a zero-padded fp32 NHWC copy, the weight (OHWI: (O, kh kw C),
 * exactly a GEMM's (N, K) weight) into K x 16 fp32 panels (rc2_pack_nk); widening is exact, so
 * bf16 differs from fp32 only by its one final rounding. An fp32 input is read in place unless
 * it needs padding. Output rows are GEMM rows as in conv_avx512.c, but a tap is a kernel row:
 * the kw taps x C channels of one kernel row are kw C consecutive floats of the padded input,
 * so K = kh runs of kw C (the 7x7 stem: 7 runs of 21 rather than 49 of 3). With stride 1 the
 * rows of an image are its padded positions (r = oh wp + ow, stride C; positions past wo
 * computed and dropped), so micro blocks stay full across output rows; a stride walks output
 * row by output row. A 16-column panel (K x 64 B: 295 KB at K = 4608) stays in the 512 KB L2
 * of Zen 3 while a thread runs its rows; work items are (panel, image, chunk of rows or one
 * output row), panel outermost. One parallel region packs, pads and multiplies.
 */
#include <stdlib.h>

#include "conv.h"
#include "rc_conv.h"
#include "rc_gemm_avx2.h"

/* CH: micro blocks per work item (the fp32 block buffer holds CH MR rows of NR) */
enum { MR = 6, NR = 16, CH = 8 };
/* bytes of packed weight per work item's panel group (Zen 3: 512 KB L2 per core) */
#ifndef GROUP_BYTES
#define GROUP_BYTES (192 * 1024)
#endif

/* c (rows x 16, ld 16) = sum over kernel rows t of a[toff[t] + r rs + j] x b[(t len + j) 16 + col]
 * for j < len; rows a constant <= MR. Named accumulators (see gemm_avx2.c: gcc 12 kept an array
 * of them in memory as well). */
#define RC_ROW(r)                                                                                  \
    if (rows > r) {                                                                                \
        const __m256 av = _mm256_broadcast_ss(at + r * rs + j);                                    \
        c##r##0 = _mm256_fmadd_ps(av, w0, c##r##0);                                                \
        c##r##1 = _mm256_fmadd_ps(av, w1, c##r##1);                                                \
    }
#define RC_OUT(r)                                                                                  \
    if (rows > r) {                                                                                \
        _mm256_storeu_ps(c + r * NR, c##r##0);                                                     \
        _mm256_storeu_ps(c + r * NR + 8, c##r##1);                                                 \
    }
static inline __attribute__((always_inline)) void micro(const float *a, int64_t rs,
                                                        const int64_t *toff, int64_t taps,
                                                        int64_t len, const float *b, float *c,
                                                        const int rows)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + toff[t], *bt = b + t * len * NR;
        for (int64_t j = 0; j < len; j++) {
            const __m256 w0 = _mm256_loadu_ps(bt + j * NR), w1 = _mm256_loadu_ps(bt + j * NR + 8);
            RC_ROW(0) RC_ROW(1) RC_ROW(2) RC_ROW(3) RC_ROW(4) RC_ROW(5)
        }
    }
    RC_OUT(0) RC_OUT(1) RC_OUT(2) RC_OUT(3) RC_OUT(4) RC_OUT(5)
}
#undef RC_ROW
#undef RC_OUT

static void micro_any(const float *a, int64_t rs, const int64_t *toff, int64_t taps, int64_t len,
                      const float *b, float *c, int64_t rows)
{
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: micro(a, rs, toff, taps, len, b, c, r); break;
        RC_CASE(1) RC_CASE(2) RC_CASE(3) RC_CASE(4) RC_CASE(5)
#undef RC_CASE
    default: micro(a, rs, toff, taps, len, b, c, MR); break;
    }
}

/* Columns [n0, n0 + nr) (nr <= 16) of the output pixels [pix, pix + rows) from the fp32 rows of
 * c (ld 16): y = act(round(c + b) + res), rounded to y's dtype. b and res may be NULL. */
static void epilogue(const float *c, int64_t rows, int64_t nr, const void *b, const void *res,
                     void *y, int64_t pix, int64_t o, int64_t n0, int act, int bf16)
{
    for (int64_t j = 0; j < nr; j += 8) {
        const int64_t left = nr - j;
        const __m256 bv = b ? rc2_load_n(b, n0 + j, left, bf16) : _mm256_setzero_ps();
        for (int64_t r = 0; r < rows; r++) {
            const int64_t at = (pix + r) * o + n0 + j;
            __m256 v = _mm256_add_ps(_mm256_loadu_ps(c + r * NR + j), bv);
            if (res) /* the conv's output rounded before the residual add, as rc_epi1 */
                v = _mm256_add_ps(rc8_round_to(v, bf16), rc2_load_n(res, at, left, bf16));
            if (act != RC_ACT_NONE) /* relu: -inf out as NaN (conv.h) */
                v = _mm256_add_ps(rc2_act(v, act), _mm256_sub_ps(v, v));
            rc2_store_n(y, at, left, v, bf16);
        }
    }
}

/* The epilogue of the flat rows [r0, r0 + cnt) of image img (row r is the output position
 * (r / wp, r % wp); positions r % wp >= wo are dropped): runs of consecutive output pixels.
 * The walk of rc_conv_epilogue_flat (rc_conv.h, AVX-512 only) over this file's epilogue. */
static void epilogue_flat(const rc_conv *g, int64_t wp, int64_t img, int64_t r0, int64_t cnt,
                          const float *c, int64_t nr, const void *b, const void *res, void *y,
                          int64_t n0, int act, int bf16)
{
    for (int64_t r = r0; r < r0 + cnt;) {
        const int64_t oh = r / wp, ow = r % wp;
        if (ow >= g->wo) {
            r += wp - ow;
            continue;
        }
        const int64_t len = rc_min64(g->wo - ow, r0 + cnt - r);
        epilogue(c + (r - r0) * NR, len, nr, b, res, y, (img * g->ho + oh) * g->wo + ow, g->o, n0,
                 act, bf16);
        r += len;
    }
}

/* Padded row r of image img as fp32 (wp pixels of c floats): rc_conv_pad_row for fp32, bf16
 * widened (exactly) on the way. */
static void pad_row(const rc_conv *g, const void *x, float *dst, int64_t img, int64_t r,
                    int64_t wp, int bf16)
{
    const int64_t ih = r - g->ph, c = g->c;
    if (!bf16 || ih < 0 || ih >= g->h) {
        rc_conv_pad_row(g, x, (char *)dst, img, r, wp, c, 4); /* (zeros when ih is outside) */
        return;
    }
    const int64_t left = rc_min64(g->pw, wp), cols = rc_min64(g->w, wp - left);
    const int64_t src = (img * g->h + ih) * g->w * c, cnt = cols * c;
    float *d = dst + left * c;
    memset(dst, 0, (size_t)(left * c * 4));
    for (int64_t j = 0; j < cnt; j += 8)
        rc2_store_n(d, j, cnt - j, rc2_load_n(x, src + j, cnt - j, 1), 0);
    memset(d + cnt, 0, (size_t)((wp - left - cols) * c * 4));
}

static int conv(const void *x, const void *wt, const void *b, const void *res, void *y,
                const rc_conv *g, int act, int nt, int bf16)
{
    const int64_t n = g->n, c = g->c, o = g->o, kh = g->kh, kw = g->kw, ho = g->ho, wo = g->wo;
    const int64_t len = kw * c, k = kh * len, panels = (o + NR - 1) / NR;
    /* the input extent the windows span; fp32 x is read in place when it needs no padding */
    const int64_t hs = (ho - 1) * g->sh + kh, ws = (wo - 1) * g->sw + kw;
    const int pad = g->ph || g->pw || hs > g->h || ws > g->w, copy = pad || bf16;
    const int64_t hp = pad ? hs : g->h, wp = pad ? ws : g->w;
    const size_t wbytes = (size_t)(panels * k * NR * 4), tbytes = (size_t)(kh * 8);
    const size_t xbytes = copy ? (size_t)(n * hp * wp * c * 4) : 0;
    char *buf = aligned_alloc(64, (wbytes + tbytes + xbytes + 63) / 64 * 64);
    if (!buf)
        return -1; /* out of memory: the caller raises MemoryError */
    float *wpk = (float *)buf;
    int64_t *toff = (int64_t *)(buf + wbytes);
    const float *src = copy ? (const float *)(buf + wbytes + tbytes) : x;
    for (int64_t i = 0; i < kh; i++)
        toff[i] = i * wp * c;
    const int flat = g->sh == 1 && g->sw == 1;
    const int64_t rows = (ho - 1) * wp + wo, chunks = (rows + CH * MR - 1) / (CH * MR);
    const int64_t per = flat ? chunks : ho; /* items per (panel group, image) */
    /* panels per group: a group's weight stays in L2 while a chunk of rows runs against each of
     * its panels in turn, so the input is streamed once per group, not once per panel */
    const int64_t fit = GROUP_BYTES / (k * NR * 4), gp = rc_min64(panels, fit > 1 ? fit : 1);
    const int64_t groups = (panels + gp - 1) / gp;
    RC_PRAGMA(omp parallel num_threads(rc_threads(nt)) if (nt != 1))
    {
        RC_PRAGMA(omp for schedule(dynamic, 1) nowait)
        for (int64_t p = 0; p < panels; p++)
            rc2_pack_nk(wt, bf16, o, k, p * NR, NR, wpk + p * k * NR);
        if (copy) { /* its barrier also waits for the packing */
            RC_PRAGMA(omp for schedule(dynamic, 8))
            for (int64_t r = 0; r < n * hp; r++)
                pad_row(g, x, (float *)src + r * wp * c, r / hp, r % hp, wp, bf16);
        } else {
            RC_PRAGMA(omp barrier)
        }
        float cb[CH * MR * NR] __attribute__((aligned(32)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < groups * n * per; item++) {
            const int64_t q = item / (n * per), img = item / per % n, i = item % per;
            const float *image = src + img * hp * wp * c;
            for (int64_t p = q * gp; p < rc_min64(panels, (q + 1) * gp); p++) {
                const int64_t n0 = p * NR, nr = rc_min64(NR, o - n0);
                const float *bp = wpk + p * k * NR;
                if (flat) {
                    const int64_t r0 = i * CH * MR, cnt = rc_min64(CH * MR, rows - r0);
                    for (int64_t r = 0; r < cnt; r += MR)
                        micro_any(image + (r0 + r) * c, c, toff, kh, len, bp, cb + r * NR,
                                  rc_min64(MR, cnt - r));
                    epilogue_flat(g, wp, img, r0, cnt, cb, nr, b, res, y, n0, act, bf16);
                    continue;
                }
                const float *row = image + i * g->sh * wp * c;
                const int64_t rs = g->sw * c;
                for (int64_t o0 = 0; o0 < wo; o0 += CH * MR) {
                    const int64_t seg = rc_min64(CH * MR, wo - o0);
                    for (int64_t r = 0; r < seg; r += MR)
                        micro_any(row + (o0 + r) * rs, rs, toff, kh, len, bp, cb + r * NR,
                                  rc_min64(MR, seg - r));
                    epilogue(cb, seg, nr, b, res, y, (img * ho + i) * wo + o0, o, n0, act, bf16);
                }
            }
        }
    }
    free(buf);
    return 0;
}

int rc_conv2d_f32_avx2(const void *x, const void *wt, const void *b, const void *res, void *y,
                       int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                       int64_t wo, int act, int nt)
{
    const rc_conv g = {n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo};
    return conv(x, wt, b, res, y, &g, act, nt, 0);
}

int rc_conv2d_bf16_avx2(const void *x, const void *wt, const void *b, const void *res, void *y,
                        int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                        int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                        int64_t wo, int act, int nt)
{
    const rc_conv g = {n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo};
    return conv(x, wt, b, res, y, &g, act, nt, 1);
}
