/* conv family, AMX: bf16 conv2d on NHWC as an implicit GEMM on tiles (TDPBF16PS), fp32
 * accumulation, fused epilogue (bias, residual, relu), one rounding.
 *
 * GEMM rows are output pixels, columns output channels, K = taps x channels. An A tile is 16
 * rows at a fixed stride, 32 bf16 of K each, so it is read straight from an NHWC buffer:
 * - direct (1x1, stride 1, no padding, C % 32 == 0): x itself, rows = pixels; the last partial
 *   32-row block comes from a zero-padded copy.
 * - flat (stride 1, any kernel, padding): x copied once into a zero-padded NHWC buffer of
 *   (ho + kh - 1) x (wo + kw - 1) pixels, channels padded to cp = 32k. Row r of an image is
 *   the padded position (r / wp, r % wp), tap (i, j) reads pixel r + i wp + j: one offset per
 *   tap, all rows of an image at stride cp. Positions r % wp >= wo are computed and dropped
 *   (3.5% of the rows at 56 x 56, 25% at 7 x 7).
 * - im2col (stride > 1): the kh x kw x C window of each output pixel copied into a row of
 *   kp = 32k elements (ResNet's 3 strided 3x3s, the 1x1 downsamples and the 7x7 stem).
 * The weight (OHWI) is packed once per call into VNNI-2 tiles (rc_transpose16), one tap's
 * channels per run of K tiles (zeros past C). Tiles: C 0-3 (32 x 32 fp32 block), A 4-5,
 * B 6-7, as in gemm_amx.c. Work items are (image, chunk of MC 32-row blocks, panel group);
 * K in chunks of KC steps with the fp32 sums parked in a per-thread buffer (see gemm_amx.c).
 */
#include <stdlib.h>

#include "conv.h"
#include "rc_conv.h"

#ifndef __AMX_BF16__
#error "conv_amx.c needs -mamx-tile -mamx-bf16"
#endif

#ifndef RC_CONV_KC
#define RC_CONV_KC 18
#endif
enum { KC = RC_CONV_KC, MC = 8, DIRECT = 0, FLAT = 1, IM2COL = 2 };

/* Palette 1, tiles 0-7 of 16 rows x 64 bytes; a constant (see attention_amx.c). */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) TILE_CONFIG = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* Where the A tiles of a call are: segment (image) s, row r, K step q at
 * a + s * seg + r * lda + toff[q / kc] + (q % kc) * 32 elements. */
typedef struct {
    const uint16_t *a;
    int64_t seg, lda, kc, rows; /* rows per segment */
    const int64_t *toff;
} rc_asrc;

/* c (32 x 32 fp32, ld 32) (+)= A rows [a0, a0 + 32) @ B over K steps [q0, q1); two weight
 * tiles (b1 != NULL) or one. */
static inline void block(const uint16_t *a0, const rc_asrc *s, const uint16_t *b0,
                         const uint16_t *b1, int64_t q0, int64_t q1, float *c, int first)
{
    const int64_t ld = s->lda * 2, hi = 16 * s->lda;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, 128);
        _tile_loadd(1, c + 16, 128);
        _tile_loadd(2, c + 16 * 32, 128);
        _tile_loadd(3, c + 16 * 32 + 16, 128);
    }
    for (int64_t q = q0; q < q1; q++) {
        const uint16_t *a = a0 + s->toff[q / s->kc] + (q % s->kc) * TK;
        _tile_loadd(4, a, ld);
        _tile_loadd(6, b0 + q * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, a + hi, ld);
        _tile_dpbf16ps(2, 5, 6);
        if (b1) {
            _tile_loadd(7, b1 + q * TILE, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
}

/* The epilogue of rows [r0, r0 + 32) of segment s (fp32 block c, ld 32), columns [n0, n0 + nr):
 * runs of rows that are consecutive output pixels; flat rows past wo in their padded row are
 * dropped, as are rows past the segment's. */
static void block_out(const rc_conv *g, int mode, int64_t wp, int64_t s, int64_t r0, int64_t rows,
                      const float *c, int64_t nr, const void *b, const void *res, void *y,
                      int64_t n0, int act)
{
    const int64_t end = rc_min64(r0 + 32, rows);
    if (mode != FLAT) {
        if (end > r0)
            rc_conv_epilogue(c, 32, end - r0, nr, b, res, y, r0, g->o, n0, act, 1);
        return;
    }
    rc_conv_epilogue_flat(g, wp, s, r0, end - r0, c, 32, nr, b, res, y, n0, act, 1);
}

/* n bf16 from src to dst, 32 at a time (masked): the runs are short (42 B in ResNet's stem),
 * where a memcpy call per run cost more than the copy. */
static inline void copy_run(uint16_t *dst, const uint16_t *src, int64_t n)
{
    for (int64_t j = 0; j < n; j += 32) {
        const __mmask32 m = rc_tail32(n - j);
        _mm512_mask_storeu_epi16(dst + j, m, _mm512_maskz_loadu_epi16(m, src + j));
    }
}

/* im2col rows [r0, r0 + 32 cnt) of the output pixels into dst (ld lda): row r holds the kh
 * runs of kw x c elements of its window in the padded input xp (hs x ws pixels per image), then
 * zeros; rows past the last pixel are zeros. */
static void im2col_rows(const rc_conv *g, const uint16_t *xp, int64_t hs, int64_t ws,
                        int64_t r0, int64_t cnt, int64_t lda, uint16_t *dst)
{
    const int64_t run = g->kw * g->c, used = g->kh * run, m = g->n * g->ho * g->wo;
    for (int64_t r = r0; r < r0 + 32 * cnt; r++) {
        uint16_t *d = dst + (r - r0) * lda;
        if (r >= m) {
            memset(d, 0, (size_t)(lda * 2));
            continue;
        }
        const int64_t img = r / (g->ho * g->wo), oh = r / g->wo % g->ho, ow = r % g->wo;
        const uint16_t *src = xp + ((img * hs + oh * g->sh) * ws + ow * g->sw) * g->c;
        for (int64_t i = 0; i < g->kh; i++)
            copy_run(d + i * run, src + i * ws * g->c, run);
        for (int64_t j = used; j < lda; j += 32)
            _mm512_mask_storeu_epi16(d + j, rc_tail32(lda - j), _mm512_setzero_si512());
    }
}

/* Tile (nb, q) of the weight: 16 output channels from 16 nb, K step q = (tap, chunk). */
static void pack_tiles(const uint16_t *wt, int64_t o, int64_t taps, int64_t ct, int64_t kc,
                       int64_t nb, uint16_t *dst)
{
    const int64_t rows = rc_min64(TN, o - nb * TN), ld = taps * ct;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t kb = 0; kb < kc; kb++)
            rc_transpose16((const char *)(wt + nb * TN * ld + t * ct + kb * TK), ld * 2, rows,
                           rc_tail32(ct - kb * TK), (char *)(dst + (t * kc + kb) * TILE), 64, 16);
}

int rc_conv2d_bf16_amx(const void *x, const void *wt, const void *b, const void *res, void *y,
                       int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                       int64_t wo, int act, int nt)
{
    const rc_conv g = {n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo};
    const int mode = sh != 1 || sw != 1 ? IM2COL
                     : kh == 1 && kw == 1 && !ph && !pw && c % TK == 0 ? DIRECT
                                                                       : FLAT;
    /* K per tap (ct, kc chunks of 32) and the taps; im2col is one tap of kh kw c */
    const int64_t taps = mode == IM2COL ? 1 : kh * kw, ct = mode == IM2COL ? kh * kw * c : c;
    const int64_t kc = (ct + TK - 1) / TK, steps = taps * kc, lda = kc * TK;
    /* flat: the padded image (hp x wp pixels of lda channels); im2col: the input extent the
     * windows span (hs x ws pixels of c channels), padded only where the windows leave x */
    const int64_t hp = ho + kh - 1, wp = wo + kw - 1;
    const int64_t hs = (ho - 1) * sh + kh, ws = (wo - 1) * sw + kw;
    const int im_pad = mode == IM2COL && (ph || pw || hs > h || ws > w);
    const int64_t segs = mode == FLAT ? n : 1;
    const int64_t rows = mode == FLAT ? (ho - 1) * wp + wo : n * ho * wo;
    const int64_t seg = mode == FLAT ? hp * wp * lda : 0;
    const int64_t ntiles = (o + TN - 1) / TN, npanels = (ntiles + 1) / 2;
    const int64_t mbs = (rows + 31) / 32, chunks = (mbs + MC - 1) / MC;
    const int threads = rc_threads(nt);
    const int64_t gsize = segs * chunks >= 2 * threads ? npanels : 1;
    const int64_t groups = (npanels + gsize - 1) / gsize;
    /* shared A source: flat, the padded input + 32 pixels of slack (blocks past the rows read
     * it); direct, the last partial 32-row block; im2col, the padded input. Then per-thread
     * im2col chunks. */
    const int64_t apix = mode == FLAT ? n * hp * wp + 32 : mode == DIRECT ? 32 : im_pad ? n * hs * ws : 0;
    const int64_t achan = mode == IM2COL ? c : lda, tchunk = mode == IM2COL ? MC * 32 * lda : 0;
    const size_t wbytes = (size_t)(ntiles * steps * TILE * 2), tbytes = (size_t)(taps * 8 + 56);
    const size_t abytes = (size_t)(apix * achan * 2 + 62) / 64 * 64;
    const size_t cbytes = (size_t)(threads * tchunk * 2);
    /* aligned_alloc takes a multiple of the alignment (ASan returns NULL otherwise) */
    char *buf = aligned_alloc(64, (wbytes + tbytes + abytes + cbytes + 63) / 64 * 64);
    if (!buf)
        return -1; /* out of memory: the caller raises MemoryError */
    uint16_t *wtiles = (uint16_t *)buf, *abuf = (uint16_t *)(buf + wbytes + tbytes);
    uint16_t *chunk_bufs = (uint16_t *)(buf + wbytes + tbytes + abytes);
    int64_t *toff = (int64_t *)(buf + wbytes);
    for (int64_t i = 0; i < kh && mode != IM2COL; i++)
        for (int64_t j = 0; j < kw; j++)
            toff[i * kw + j] = (i * wp + j) * lda;
    if (mode == IM2COL)
        toff[0] = 0;
    const uint16_t *xp = im_pad ? abuf : x; /* im2col's source */
    const int64_t xh = im_pad ? hs : h, xw = im_pad ? ws : w;
    const rc_asrc src = {mode == DIRECT ? x : abuf, seg, lda, kc, rows, toff};
    const int64_t tail0 = rows / 32 * 32; /* direct: rows from here come from abuf */
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        _tile_loadconfig(&TILE_CONFIG);
        RC_PRAGMA(omp for schedule(dynamic, 1) nowait)
        for (int64_t nb = 0; nb < ntiles; nb++)
            pack_tiles(wt, o, taps, ct, kc, nb, wtiles + nb * steps * TILE);
        if (mode == FLAT || im_pad) {
            const int64_t ih = mode == FLAT ? hp : hs, iw = mode == FLAT ? wp : ws;
            RC_PRAGMA(omp for schedule(dynamic, 8) nowait)
            for (int64_t r = 0; r < n * ih; r++)
                rc_conv_pad_row(&g, x, (char *)(abuf + r * iw * achan), r / ih, r % ih, iw, achan, 2);
        }
        RC_PRAGMA(omp single nowait)
        {
            if (mode == FLAT)
                memset(abuf + (apix - 32) * lda, 0, (size_t)(32 * lda * 2));
            if (mode == DIRECT) {
                memset(abuf, 0, (size_t)(32 * lda * 2));
                if (tail0 < rows)
                    memcpy(abuf, (const uint16_t *)x + tail0 * lda, (size_t)((rows - tail0) * lda * 2));
            }
        }
        RC_PRAGMA(omp barrier)
        uint16_t *mine = chunk_bufs + omp_get_thread_num() * tchunk;
        int64_t have = -1; /* im2col: the chunk whose rows mine holds */
        float cb[MC * 32 * 32] __attribute__((aligned(64)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < segs * chunks * groups; item++) {
            const int64_t s = item / (chunks * groups), ch = item / groups % chunks;
            const int64_t gi = item % groups, mc = ch * MC, mce = rc_min64(mbs, mc + MC);
            const int64_t cnt = rc_min64(npanels, gi * gsize + gsize) - gi * gsize;
            if (mode == IM2COL && have != ch) {
                im2col_rows(&g, xp, xh, xw, mc * 32, mce - mc, lda, mine);
                have = ch;
            }
            if (steps <= KC) {
                /* one K chunk: block by block, every panel of the group against the block's
                 * rows (in L1), each epilogue while its sums are in L1; the block's output rows
                 * are written whole */
                for (int64_t mb = mc; mb < mce; mb++) {
                    const uint16_t *a0 = src.a + s * seg + mb * 32 * lda;
                    if (mode == DIRECT && mb * 32 >= tail0)
                        a0 = abuf;
                    else if (mode == IM2COL)
                        a0 = mine + (mb - mc) * 32 * lda;
                    for (int64_t jp = 0; jp < cnt; jp++) {
                        const int64_t p = gi * gsize + jp, two = 2 * p + 1 < ntiles;
                        const uint16_t *b0 = wtiles + 2 * p * steps * TILE;
                        block(a0, &src, b0, two ? b0 + steps * TILE : NULL, 0, steps, cb, 1);
                        block_out(&g, mode, wp, s, mb * 32, rows, cb, rc_min64(32, o - p * 32), b,
                                  res, y, p * 32, act);
                    }
                }
                continue;
            }
            for (int64_t jp = 0; jp < cnt; jp++) {
                const int64_t p = gi * gsize + jp, two = 2 * p + 1 < ntiles;
                const uint16_t *b0 = wtiles + 2 * p * steps * TILE;
                const uint16_t *b1 = two ? b0 + steps * TILE : NULL;
                const int64_t n0 = p * 32, nr = rc_min64(32, o - n0);
                for (int64_t q0 = 0; q0 < steps; q0 += KC) {
                    const int64_t q1 = rc_min64(steps, q0 + KC);
                    for (int64_t mb = mc; mb < mce; mb++) {
                        const uint16_t *a0 = src.a + s * seg + mb * 32 * lda;
                        if (mode == DIRECT && mb * 32 >= tail0)
                            a0 = abuf;
                        else if (mode == IM2COL)
                            a0 = mine + (mb - mc) * 32 * lda;
                        block(a0, &src, b0, b1, q0, q1, cb + (mb - mc) * 1024, q0 == 0);
                    }
                }
                for (int64_t mb = mc; mb < mce; mb++)
                    block_out(&g, mode, wp, s, mb * 32, rows, cb + (mb - mc) * 1024, nr, b, res, y,
                              n0, act);
            }
        }
        _tile_release();
    }
    free(buf);
    return 0;
}
