/* quant family, AVX512-BF16: woq_int4_linear for bf16 inputs with vdpbf16ps (32 bf16 products
 * per instruction, pairwise into 16 fp32 lanes); woq_linear is quant_avx512.c's kernel compiled
 * again (int8 -> bf16 costs as many instructions as int8 -> fp32, so the dot product would save
 * nothing at M = 1, the decode case).
 *
 * The 4-bit codes are exact in bf16 and so are their products with bf16 x: each group's sum of
 * x * q is exact up to its fp32 additions (the instruction rounds to nearest even and treats
 * denormals as zero, far inside the bf16 tolerance), scaled once by the group's scale; the mins
 * join as mn . (the group sums of x, taken once per call in float64) - the form quant.h gives.
 *
 * 32 bytes of a weight row (64 codes) -> 32 words (vpmovzxbw); vpermw on a 32-entry table
 * (entry i: bf16(i & 15)) turns each word into its low nibble's code (the even k) and, shifted
 * right by 4, its high nibble's (the odd k). vdpbf16ps pairs neighbouring words, so x is copied
 * once per call into bf16 rows that pair the same k: per 64 values, (x0, x2), (x4, x6), .. then
 * (x1, x3), (x5, x7), ... Groups are a multiple of 32 values, so each half of the 16 fp32 lanes
 * (32 values) lies in one group and is scaled by its own scale every step. Groups of 16 x odd
 * values go to quant_avx512.c's fp32 kernel.
 */
#define RC_LEVEL avx512_bf16
#define RC_BF16_ONLY
#define RC_INT4_BF16_DOT
#include "quant_avx512.c"

#ifndef __AVX512BF16__
#error "quant_avx512_bf16.c needs -mavx512bf16"
#endif

/* xq row r (k64 = k rounded up to 64 words): per 64 values of x row r, the words x[4i], x[4i+2]
 * (i < 16), then x[4i+1], x[4i+3] (0 past k); xs[r * g + i]: the sum of group i of x row r. */
static void int4_prepare_bf16(const uint16_t *x, uint16_t *xq, float *xs, int64_t m, int64_t k,
                              int64_t k64, int64_t g)
{
    const int64_t gs = k / g;
    for (int64_t r = 0; r < m; r++) {
        const uint16_t *xr = x + r * k;
        uint16_t *q = xq + r * k64;
        for (int64_t j = 0; j < k64; j += 64)
            for (int64_t i = 0; i < 16; i++)
                for (int h = 0; h < 4; h++) { /* h: 0 and 2 into the first half, 1 and 3 next */
                    const int64_t e = j + 4 * i + h;
                    q[j + (h & 1) * 32 + 2 * i + (h >> 1)] = e < k ? xr[e] : 0;
                }
        for (int64_t i = 0; i < g; i++) {
            double t = 0.0;
            for (int64_t j = 0; j < gs; j++)
                t += rc_bf16_to_f32(xr[i * gs + j]);
            xs[r * g + i] = (float)t;
        }
    }
}

/* res[r * NR + c] = sum over groups of scale * (x . q) + mn . xs for r < MR, c < NR. */
RC_AI void i4b_dot(const uint16_t *xq, int64_t k64, const float *xs, const uint8_t *w,
                   const float *s, const float *mn, int64_t k, int64_t g, float *res,
                   const int MR, const int NR)
{
    const __m512i tab = _mm512_set_epi16(
        0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40E0, 0x40C0, 0x40A0,
        0x4080, 0x4040, 0x4000, 0x3F80, 0x0000, 0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120,
        0x4110, 0x4100, 0x40E0, 0x40C0, 0x40A0, 0x4080, 0x4040, 0x4000, 0x3F80, 0x0000);
    const int64_t gs = k / g, half = k / 2, next = next_block(half);
    __m512 acc[MB][NB];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_setzero_ps();
    int64_t ga = 0, ea = gs; /* the group of value j, and where it ends */
    for (int64_t j = 0; j < k; j += 64) {
        while (j >= ea) {
            ga++;
            ea += gs;
        }
        const int full = j + 64 <= k; /* else 32 values (16 bytes) left */
        const int64_t gb = full && j + 32 >= ea ? ga + 1 : ga;
        for (int c = 0; c < NR; c++) {
            const uint8_t *p = w + c * half + j / 2;
            __m256i bytes;
            if (full) {
                if ((j & 64) == 0)
                    prefetch(p, next);
                bytes = _mm256_loadu_si256((const __m256i *)p);
            } else {
                bytes = _mm256_maskz_loadu_epi8(0xFFFF, p);
            }
            const __m512i v = _mm512_cvtepu8_epi16(bytes);
            const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(v, tab);
            const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), tab);
            const __m512 sv = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[c * g + ga]),
                                                   _mm512_set1_ps(s[c * g + gb]));
            for (int r = 0; r < MR; r++) {
                const uint16_t *xr = xq + r * k64 + j;
                __m512 t = _mm512_dpbf16_ps(_mm512_setzero_ps(),
                                            (__m512bh)_mm512_loadu_si512(xr), lo);
                t = _mm512_dpbf16_ps(t, (__m512bh)_mm512_loadu_si512(xr + 32), hi);
                acc[r][c] = _mm512_fmadd_ps(t, sv, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) { /* plus mn . xs over the groups, 16 at a time */
            __m512 t = acc[r][c];
            for (int64_t i = 0; i < g; i += 16) {
                const __mmask16 m = rc_tail16(g - i);
                t = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, mn + c * g + i),
                                    _mm512_maskz_loadu_ps(m, xs + r * g + i), t);
            }
            res[r * NR + c] = _mm512_reduce_add_ps(t);
        }
}

RC_AI void i4b_rows(const uint16_t *xq, int64_t k64, const float *xs, const uint8_t *w,
                    const float *s, const float *mn, int64_t k, int64_t g, float *res,
                    int64_t mr, const int NR)
{
    switch (mr) {
    case 1: i4b_dot(xq, k64, xs, w, s, mn, k, g, res, 1, NR); break;
    case 2: i4b_dot(xq, k64, xs, w, s, mn, k, g, res, 2, NR); break;
    case 3: i4b_dot(xq, k64, xs, w, s, mn, k, g, res, 3, NR); break;
    default: i4b_dot(xq, k64, xs, w, s, mn, k, g, res, 4, NR); break;
    }
}

static void i4b_block(const uint16_t *xq, int64_t k64, const float *xs, const void *x,
                      const uint8_t *w, const float *s, const float *mn, const void *b, void *y,
                      int64_t m, int64_t n, int64_t k, int64_t g, int64_t n0)
{
    const int64_t nr = rc_min64(NB, n - n0), nc = nr == NB ? NB : 1;
    float res[MB * NB];
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
        const int64_t mr = rc_min64(MB, m - m0);
        for (int64_t c0 = 0; c0 < nr; c0 += nc) {
            const int64_t col0 = n0 + c0;
            const uint8_t *wc = w + col0 * (k / 2);
            const uint16_t *xm = xq + m0 * k64;
            if (nc == NB)
                i4b_rows(xm, k64, xs + m0 * g, wc, s + col0 * g, mn + col0 * g, k, g, res, mr,
                         NB);
            else
                i4b_rows(xm, k64, xs + m0 * g, wc, s + col0 * g, mn + col0 * g, k, g, res, mr,
                         1);
            for (int64_t c = 0; c < nc; c++) {
                const int64_t col = col0 + c;
                const float bias = b ? rc_ld(b, col, 1) : 0.0f;
                for (int64_t r = 0; r < mr; r++) {
                    float v = res[r * nc + c] + bias;
                    if (!isfinite(v))
                        v = exact4(x, w, s, mn, b, m0 + r, col, k, g, 1);
                    rc_st(y, (m0 + r) * n + col, v, 1);
                }
            }
        }
    }
}

void rc_woq_int4_linear_bf16_avx512_bf16(const void *x, const void *w, const void *s,
                                         const void *mn, const void *b, void *y, int64_t m,
                                         int64_t n, int64_t k, int64_t g, int nt)
{
    if ((k / g) % 32) { /* groups of 16 x odd values: the fp32 kernel */
        woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 1);
        return;
    }
    const int64_t k64 = (k + 63) / 64 * 64;
    uint16_t *xq = malloc((size_t)(m * k64) * sizeof(uint16_t) + (size_t)(m * g) * sizeof(float));
    if (!xq) {
        woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 1);
        return;
    }
    float *xs = (float *)(xq + m * k64); /* k64 * 2 bytes: a multiple of 4 */
    int4_prepare_bf16((const uint16_t *)x, xq, xs, m, k, k64, g);
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k / 2 * NB))
    for (int64_t i = 0; i < (n + NB - 1) / NB; i++)
        i4b_block(xq, k64, xs, x, (const uint8_t *)w, (const float *)s, (const float *)mn, b, y,
                  m, n, k, g, i * NB);
    free(xq);
}
