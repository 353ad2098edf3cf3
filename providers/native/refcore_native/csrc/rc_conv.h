/* Helpers of the conv family's vector files (conv_avx2.c, conv_avx512.c, conv_amx.c): the
 * geometry, copies of the NHWC input into a zero-padded buffer or into im2col rows (any level),
 * and the AVX-512 fused epilogue (only where __AVX512F__ is defined; conv_avx2.c has its own).
 * Element size es: 2 (bf16) or 4 (fp32).
 */
#ifndef RC_CONV_H
#define RC_CONV_H

#ifdef __AVX512F__
#include "rc_gemm.h"
#else
#include "rc_common.h"
#endif

/* Geometry of one call (the arguments of conv.h). */
typedef struct {
    int64_t n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo;
} rc_conv;

/* Padded image row r (r < hp) of image img into dst (wp pixels of cp elements): x's pixels at
 * columns [pw, pw + w), zeros elsewhere (padding rows, columns and channels past c). */
static inline void rc_conv_pad_row(const rc_conv *g, const char *x, char *dst, int64_t img,
                                   int64_t r, int64_t wp, int64_t cp, int64_t es)
{
    const int64_t ih = r - g->ph;
    if (ih < 0 || ih >= g->h) {
        memset(dst, 0, (size_t)(wp * cp * es));
        return;
    }
    const char *src = x + (img * g->h + ih) * g->w * g->c * es;
    const int64_t left = rc_min64(g->pw, wp), cols = rc_min64(g->w, wp - left);
    memset(dst, 0, (size_t)(left * cp * es));
    if (cp == g->c) {
        memcpy(dst + left * cp * es, src, (size_t)(cols * cp * es));
    } else {
        for (int64_t j = 0; j < cols; j++) {
            char *d = dst + (left + j) * cp * es;
            memcpy(d, src + j * g->c * es, (size_t)(g->c * es));
            memset(d + g->c * es, 0, (size_t)((cp - g->c) * es));
        }
    }
    memset(dst + (left + cols) * cp * es, 0, (size_t)((wp - left - cols) * cp * es));
}

/* im2col row of output pixel pix (img, oh, ow): the kh x kw taps' c channels each (zeros where
 * a tap falls in the padding), then zeros up to kp elements. */
static inline void rc_conv_im2col_row(const rc_conv *g, const char *x, char *dst, int64_t pix,
                                      int64_t kp, int64_t es)
{
    const int64_t img = pix / (g->ho * g->wo), oh = pix / g->wo % g->ho, ow = pix % g->wo;
    const int64_t cb = g->c * es;
    for (int64_t i = 0; i < g->kh; i++) {
        const int64_t ih = oh * g->sh - g->ph + i;
        for (int64_t j = 0; j < g->kw; j++) {
            const int64_t iw = ow * g->sw - g->pw + j;
            char *d = dst + (i * g->kw + j) * cb;
            if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w)
                memset(d, 0, (size_t)cb);
            else
                memcpy(d, x + ((img * g->h + ih) * g->w + iw) * cb, (size_t)cb);
        }
    }
    const int64_t used = g->kh * g->kw * g->c;
    memset(dst + used * es, 0, (size_t)((kp - used) * es));
}

#ifdef __AVX512F__
/* Columns [n0, n0 + nr) (nr <= 32) of the rows pixels [pix, pix + rows) from the fp32 rows of
 * c (ld ldc floats): y = act(round(c + b) + res), rounded to y's dtype. b and res may be NULL. */
static inline void rc_conv_epilogue(const float *c, int64_t ldc, int64_t rows, int64_t nr,
                                    const void *b, const void *res, void *y, int64_t pix,
                                    int64_t o, int64_t n0, int act, int bf16)
{
    const __mmask16 m0 = rc_tail16(nr), m1 = nr > 16 ? rc_tail16(nr - 16) : 0;
    const __m512 b0 = b ? rc_load_m(b, n0, m0, bf16) : _mm512_setzero_ps();
    const __m512 b1 = b && m1 ? rc_load_m(b, n0 + 16, m1, bf16) : _mm512_setzero_ps();
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; r++) {
        const int64_t at = (pix + r) * o + n0;
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc), b0);
        __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + 16), b1);
        if (res) { /* the conv's output rounded before the residual add, as rc_epi1 */
            v0 = _mm512_add_ps(rc_round_to(v0, bf16), rc_load_m(res, at, m0, bf16));
            v1 = _mm512_add_ps(rc_round_to(v1, bf16), rc_load_m(res, at + 16, m1, bf16));
        }
        if (act == RC_ACT_RELU) { /* -inf out as NaN (conv.h) */
            v0 = _mm512_add_ps(_mm512_max_ps(zero, v0), _mm512_sub_ps(v0, v0));
            v1 = _mm512_add_ps(_mm512_max_ps(zero, v1), _mm512_sub_ps(v1, v1));
        } else if (act != RC_ACT_NONE) {
            v0 = rc_act(v0, act);
            v1 = rc_act(v1, act);
        }
#ifdef __AVX512BF16__
        if (bf16 && nr == 32) {
            _mm512_storeu_si512((uint16_t *)y + at, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
            continue;
        }
#endif
        rc_store_m(y, at, m0, v0, bf16);
        if (m1)
            rc_store_m(y, at + 16, m1, v1, bf16);
    }
}

/* The epilogue of the "flat" rows [r0, r0 + cnt) of image img (row r is the output position
 * (r / wp, r % wp) in a padded image wp wide; positions r % wp >= wo are dropped): runs of
 * consecutive output pixels, from the fp32 rows of c (ld ldc). */
static inline void rc_conv_epilogue_flat(const rc_conv *g, int64_t wp, int64_t img, int64_t r0,
                                         int64_t cnt, const float *c, int64_t ldc, int64_t nr,
                                         const void *b, const void *res, void *y, int64_t n0,
                                         int act, int bf16)
{
    for (int64_t r = r0; r < r0 + cnt;) {
        const int64_t oh = r / wp, ow = r % wp;
        if (ow >= g->wo) {
            r += wp - ow;
            continue;
        }
        const int64_t len = rc_min64(g->wo - ow, r0 + cnt - r);
        rc_conv_epilogue(c + (r - r0) * ldc, ldc, len, nr, b, res, y,
                         (img * g->ho + oh) * g->wo + ow, g->o, n0, act, bf16);
        r += len;
    }
}

#endif /* __AVX512F__ */

#endif
