/* conv family, AVX-512: fp32 conv2d on NHWC as an implicit GEMM, MR x 32 FMA register block.
 *
 * Output rows are GEMM rows: the MR (<= 12) consecutive output pixels of one output row read
 * input pixels at a fixed stride (sw x C floats) from the padded input, so the microkernel
 * walks K = kh x kw taps x C channels reading the input in place, each tap an offset. The
 * weight (OHWI: (O, kh kw C) row-major, exactly a GEMM's (N, K) weight) is packed once per call
 * into avx512_f32_panel32 panels (rc_pack_panel32). With padding the input is first copied
 * into a zero-padded NHWC buffer. With stride 1 the rows of an image are its padded positions
 * (see the driver), so micro blocks stay full across output rows. Work items are (32-column
 * panel, image, chunk of rows or one output row), panel outermost so a thread's consecutive
 * items share the panel (L2); one parallel region does the packing, the padding and the
 * products.
 */
#include <stdlib.h>

#include "conv.h"
#include "rc_conv.h"

/* CH: micro blocks per work item of the flat (stride 1) walk */
enum { MR = 12, NR = 32, CH = 8 };

/* c (rows x 32) = sum over taps t of a[toff[t] + r rs + j] x b[(t c + j) 32 + col]. */
static inline __attribute__((always_inline)) void micro(const float *a, int64_t rs,
                                                        const int64_t *toff, int64_t taps,
                                                        int64_t c, const float *b, float *out,
                                                        const int rows)
{
    __m512 acc[MR][2];
    for (int r = 0; r < rows; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + toff[t], *bt = b + t * c * NR;
        for (int64_t j = 0; j < c; j++) {
            const __m512 b0 = _mm512_loadu_ps(bt + j * NR), b1 = _mm512_loadu_ps(bt + j * NR + 16);
            for (int r = 0; r < rows; r++) {
                const __m512 av = _mm512_set1_ps(at[r * rs + j]);
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(out + r * NR, acc[r][0]);
        _mm512_storeu_ps(out + r * NR + 16, acc[r][1]);
    }
}

static void micro_any(const float *a, int64_t rs, const int64_t *toff, int64_t taps, int64_t c,
                      const float *b, float *out, int64_t rows)
{
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: micro(a, rs, toff, taps, c, b, out, r); break;
        RC_CASE(1) RC_CASE(2) RC_CASE(3) RC_CASE(4) RC_CASE(5) RC_CASE(6)
        RC_CASE(7) RC_CASE(8) RC_CASE(9) RC_CASE(10) RC_CASE(11)
#undef RC_CASE
    default: micro(a, rs, toff, taps, c, b, out, MR); break;
    }
}

/* The same over two panels (64 columns) with MR2 rows: 4 weight vectors and MR2 broadcasts per
 * 4 x MR2 FMAs instead of 2 and 12 per 24; out0 / out1 the two panels' rows (ld 32). */
enum { MR2 = 6 };
static inline __attribute__((always_inline)) void micro2(const float *a, int64_t rs,
                                                         const int64_t *toff, int64_t taps,
                                                         int64_t c, const float *b0,
                                                         const float *b1, float *out0,
                                                         float *out1, const int rows)
{
    __m512 acc[MR2][4];
    for (int r = 0; r < rows; r++)
        acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    for (int64_t t = 0; t < taps; t++) {
        const float *at = a + toff[t], *p0 = b0 + t * c * NR, *p1 = b1 + t * c * NR;
        for (int64_t j = 0; j < c; j++) {
            const __m512 w0 = _mm512_loadu_ps(p0 + j * NR), w1 = _mm512_loadu_ps(p0 + j * NR + 16);
            const __m512 w2 = _mm512_loadu_ps(p1 + j * NR), w3 = _mm512_loadu_ps(p1 + j * NR + 16);
            for (int r = 0; r < rows; r++) {
                const __m512 av = _mm512_set1_ps(at[r * rs + j]);
                acc[r][0] = _mm512_fmadd_ps(av, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, w1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(av, w2, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(av, w3, acc[r][3]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(out0 + r * NR, acc[r][0]);
        _mm512_storeu_ps(out0 + r * NR + 16, acc[r][1]);
        _mm512_storeu_ps(out1 + r * NR, acc[r][2]);
        _mm512_storeu_ps(out1 + r * NR + 16, acc[r][3]);
    }
}

static void micro2_any(const float *a, int64_t rs, const int64_t *toff, int64_t taps, int64_t c,
                       const float *b0, const float *b1, float *out0, float *out1, int64_t rows)
{
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: micro2(a, rs, toff, taps, c, b0, b1, out0, out1, r); break;
        RC_CASE(1) RC_CASE(2) RC_CASE(3) RC_CASE(4) RC_CASE(5)
#undef RC_CASE
    default: micro2(a, rs, toff, taps, c, b0, b1, out0, out1, MR2); break;
    }
}

int rc_conv2d_f32_avx512(const void *x, const void *wt, const void *b, const void *res, void *y,
                         int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                         int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                         int64_t wo, int act, int nt)
{
    const rc_conv g = {n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo};
    const int64_t taps = kh * kw, k = taps * c, panels = (o + NR - 1) / NR;
    /* the input extent the windows span; x is read in place when it needs no padding */
    const int64_t hs = (ho - 1) * sh + kh, ws = (wo - 1) * sw + kw;
    const int pad = ph || pw || hs > h || ws > w;
    const int64_t hp = pad ? hs : h, wp = pad ? ws : w;
    const size_t wbytes = (size_t)(panels * k * NR * 4), tbytes = (size_t)(taps * 8);
    const size_t xbytes = pad ? (size_t)(n * hp * wp * c * 4) : 0;
    char *buf = aligned_alloc(64, (wbytes + tbytes + xbytes + 63) / 64 * 64);
    if (!buf)
        return -1; /* out of memory: the caller raises MemoryError */
    float *wp_ = (float *)buf;
    int64_t *toff = (int64_t *)(buf + wbytes);
    const float *src = pad ? (const float *)(buf + wbytes + tbytes) : x;
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++)
            toff[i * kw + j] = (i * wp + j) * c;
    /* stride 1: the rows of an image are its padded positions r = oh wp + ow, all at stride c
     * (positions past wo computed and dropped), so the micro blocks run full across output
     * rows; a stride walks output row by output row */
    const int flat = sh == 1 && sw == 1;
    const int64_t rows = (ho - 1) * wp + wo, chunks = (rows + CH * MR - 1) / (CH * MR);
    RC_PRAGMA(omp parallel num_threads(rc_threads(nt)) if (nt != 1))
    {
        RC_PRAGMA(omp for schedule(dynamic, 1) nowait)
        for (int64_t p = 0; p < panels; p++)
            rc_pack_panel32(wt, o, k, p, wp_ + p * k * NR);
        if (pad) {
            RC_PRAGMA(omp for schedule(dynamic, 8))
            for (int64_t r = 0; r < n * hp; r++)
                rc_conv_pad_row(&g, x, (char *)src + r * wp * c * 4, r / hp, r % hp, wp, c, 4);
        } else {
            RC_PRAGMA(omp barrier)
        }
        float cb[2 * CH * MR * NR] __attribute__((aligned(64)));
        if (flat) {
            /* items of two panels (the last may have one) */
            const int64_t pairs = (panels + 1) / 2;
            RC_PRAGMA(omp for schedule(dynamic, 1))
            for (int64_t item = 0; item < pairs * n * chunks; item++) {
                const int64_t q = item / (n * chunks), img = item / chunks % n;
                const int64_t r0 = item % chunks * CH * MR, cnt = rc_min64(CH * MR, rows - r0);
                const float *a = src + img * hp * wp * c + r0 * c, *b0 = wp_ + 2 * q * k * NR;
                float *c0 = cb, *c1 = cb + CH * MR * NR;
                if (2 * q + 1 < panels) {
                    for (int64_t r = 0; r < cnt; r += MR2)
                        micro2_any(a + r * c, c, toff, taps, c, b0, b0 + k * NR, c0 + r * NR,
                                   c1 + r * NR, rc_min64(MR2, cnt - r));
                } else {
                    for (int64_t r = 0; r < cnt; r += MR)
                        micro_any(a + r * c, c, toff, taps, c, b0, c0 + r * NR,
                                  rc_min64(MR, cnt - r));
                }
                for (int64_t h2 = 0; h2 < 2 && 2 * q + h2 < panels; h2++) {
                    const int64_t n0 = (2 * q + h2) * NR, nr = rc_min64(NR, o - n0);
                    rc_conv_epilogue_flat(&g, wp, img, r0, cnt, h2 ? c1 : c0, NR, nr, b, res, y,
                                          n0, act, 0);
                }
            }
        } else {
            const int64_t pairs = (panels + 1) / 2;
            RC_PRAGMA(omp for schedule(dynamic, 1))
            for (int64_t item = 0; item < pairs * n * ho; item++) {
                const int64_t q = item / (n * ho), img = item / ho % n, oh = item % ho;
                const float *row = src + (img * hp + oh * sh) * wp * c, *b0 = wp_ + 2 * q * k * NR;
                const int two = 2 * q + 1 < panels;
                float *c0 = cb, *c1 = cb + CH * MR * NR;
                for (int64_t o0 = 0; o0 < wo; o0 += CH * MR) { /* cb holds CH MR rows */
                    const int64_t seg = rc_min64(CH * MR, wo - o0);
                    const float *a = row + o0 * sw * c;
                    for (int64_t ow = 0; ow < seg; ow += MR2) {
                        const int64_t mr = rc_min64(MR2, seg - ow);
                        if (two)
                            micro2_any(a + ow * sw * c, sw * c, toff, taps, c, b0, b0 + k * NR,
                                       c0 + ow * NR, c1 + ow * NR, mr);
                        else
                            micro_any(a + ow * sw * c, sw * c, toff, taps, c, b0, c0 + ow * NR,
                                      mr);
                    }
                    for (int64_t h2 = 0; h2 <= two; h2++) {
                        const int64_t n0 = (2 * q + h2) * NR, nr = rc_min64(NR, o - n0);
                        rc_conv_epilogue(h2 ? c1 : c0, NR, seg, nr, b, res, y,
                                         (img * ho + oh) * wo + o0, o, n0, act, 0);
                    }
                }
            }
        }
    }
    free(buf);
    return 0;
}
