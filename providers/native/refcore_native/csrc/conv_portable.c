/* conv family, portable C: the fallback of every conv kernel, fp32 sums.
 *
 * One output pixel per iteration (split over the threads); each output channel a dot product
 * over the taps inside the input (padding skipped, as zeros) with 8 partial sums over C.
 */
#include "conv.h"
#include "rc_common.h"
#include "rc_scalar.h"

enum { P = 8 };

static void conv(const void *x, const void *wt, const void *b, const void *res, void *y,
                 int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh, int64_t kw,
                 int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho, int64_t wo, int act,
                 int nt, int bf16)
{
    const int64_t es = bf16 ? 2 : 4;
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(o * kh * kw * c * es))
    for (int64_t pix = 0; pix < n * ho * wo; pix++) {
        const int64_t img = pix / (ho * wo), oh = pix / wo % ho, ow = pix % wo;
        for (int64_t oc = 0; oc < o; oc++) {
            float s[P] = {0};
            for (int64_t i = 0; i < kh; i++) {
                const int64_t ih = oh * sh - ph + i;
                if (ih < 0 || ih >= h)
                    continue;
                for (int64_t j = 0; j < kw; j++) {
                    const int64_t iw = ow * sw - pw + j;
                    if (iw < 0 || iw >= w)
                        continue;
                    const int64_t xo = ((img * h + ih) * w + iw) * c, wo_ = ((oc * kh + i) * kw + j) * c;
                    for (int64_t ch = 0; ch < c; ch++)
                        s[ch % P] += rc_ld(x, xo + ch, bf16) * rc_ld(wt, wo_ + ch, bf16);
                }
            }
            float v = b ? rc_ld(b, oc, bf16) : 0.0f;
            for (int q = 0; q < P; q++)
                v += s[q];
            if (res) /* the conv's output rounded before the residual add, as rc_epi1 */
                v = rc_round1(v, bf16) + rc_ld(res, pix * o + oc, bf16);
            /* relu: -inf out as NaN (conv.h) */
            rc_st(y, pix * o + oc, act == 1 ? rc_relu1(v) + (v - v) : v, bf16);
        }
    }
}

int rc_conv2d_f32_portable(const void *x, const void *wt, const void *b, const void *res, void *y,
                           int64_t n, int64_t h, int64_t w, int64_t c, int64_t o, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t ho,
                           int64_t wo, int act, int nt)
{
    conv(x, wt, b, res, y, n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo, act, nt, 0);
    return 0;
}

int rc_conv2d_bf16_portable(const void *x, const void *wt, const void *b, const void *res,
                            void *y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t o,
                            int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                            int64_t ho, int64_t wo, int act, int nt)
{
    conv(x, wt, b, res, y, n, h, w, c, o, kh, kw, sh, sw, ph, pw, ho, wo, act, nt, 1);
    return 0;
}
