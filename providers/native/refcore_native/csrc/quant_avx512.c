/* quant family, AVX-512 (F/BW/VL/DQ): woq_linear and woq_int4_linear for small M (decode), fp32
 * and bf16 inputs.
 *
 * Decode is bandwidth-bound: the weight (int8: a quarter of fp32's bytes, 4-bit: an eighth) is
 * streamed once and widened in registers, never written out as floats. Threads take blocks of
 * NB = 4 weight rows (dynamically, ~64 KB at a time); each block is dotted with every group of
 * up to MB = 4 rows of x (the block stays in L1 for the next group), MR x NR 16-lane fp32
 * accumulators in registers, software prefetch RC_PF bytes ahead on each weight row.
 *
 * woq_linear: 16 int8 -> 16 fp32 (vpmovsxbd + vcvtdq2ps); per-group scales multiply each
 * widened vector (a group is a multiple of 8 values: a group of 8 x odd ends with a masked
 * 8-lane step), a per-channel scale multiplies the fp32 sum. x (bf16: widened once per call
 * into an fp32 copy) is read in place.
 *
 * woq_int4_linear: 16 bytes (32 codes) -> 16 dwords (vpmovzxbd); a 16-entry fp32 table per
 * weight row and group, T[q] = q * scale + min (one fma: the weight's value rounded once to fp32,
 * as the oracle's fp32 dequantization), is indexed by vpermps with the dword itself (its low
 * nibble: the even k) and the dword shifted right by 4 (the odd k). x is copied once per call
 * into fp32 rows de-interleaved per 32 values (the 16 even, then the 16 odd ones), so both
 * vectors meet x in order; a group of 16 x odd values ends with an 8-lane step.
 *
 * No avx512_bf16 variant: vdpbf16ps (exact products of bf16 x and the codes as bf16) issues once
 * per cycle here, fma twice, so both make 32 MACs a cycle; measured on the Intel Xeon (AMX)
 * machine a vpermw + vdpbf16ps int4 kernel tied at M = 1 and lost at M >= 2 (commit history).
 *
 * Both: plus the bias, rounded once to y's dtype; an output that comes out inf or NaN is
 * recomputed in float64 (the reference's formula: a finite result whose fp32 partial sums
 * overflowed is then right, and inf * 0 stays NaN).
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include <stdlib.h>

#include "quant.h"
#include "rc_woq.h"
#include "rc_avx512.h"

enum { NB = 4, MB = 4 };
/* bytes ahead on each weight row; one prefetch per 64 bytes streamed */
#ifndef RC_PF
#define RC_PF 512
#endif
#define RC_AI static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------------
 * woq_linear (int8 weight) */

RC_AI __m512 i8_widen(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* lanes of m only (the rest 0; nothing outside them is read) */
RC_AI __m512 i8_widen_m(const int8_t *p, __mmask16 m)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

/* Prefetch RC_PF bytes ahead in the weight row at p and, for short rows (a block of NB rows of
 * at most RC_PF_NEXT bytes: `next` = the block's size, else 0), the same place in the next
 * block, which the thread most likely reads next (its chunks are runs of blocks): rows of 1-2 KB
 * are too short for the in-row prefetch (and the hardware's) to get ahead of the loads. */
#ifndef RC_PF_NEXT
#define RC_PF_NEXT 16384
#endif
RC_AI void prefetch(const void *p, int64_t next)
{
    /* never faults; formed as an integer (past the end of w near the last step) */
    if (RC_PF > 0)
        _mm_prefetch((const char *)((uintptr_t)p + RC_PF), _MM_HINT_T0);
    if (RC_PF_NEXT > 0 && next)
        _mm_prefetch((const char *)((uintptr_t)p + next), _MM_HINT_T0);
}

static inline int64_t next_block(int64_t row_bytes)
{
    return NB * row_bytes <= RC_PF_NEXT ? NB * row_bytes : 0;
}

/* res[r * NR + c] = sum_j x[r, j] * w[c, j] (times the scale of w[c, j]'s group when GR) for
 * r < MR, c < NR (constants); x fp32 rows of k, w int8 rows of k, s the NR rows' g scales.
 * GR = 1: each widened vector times its group's scale (shared by the MR rows); GR = 2 (MR <= 2):
 * each group's sum of x * int8 kept apart and scaled once into the total (one fma per group and
 * row instead of a multiply per vector: cheaper for few rows). */
RC_AI void i8_dot(const float *x, const int8_t *w, const float *s, int64_t k, int64_t g,
                  float *res, const int MR, const int NR, const int GR)
{
    __m512 acc[MB][NB], tot[2][NB];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int r = 0; r < (GR == 2 ? MR : 0); r++)
        for (int c = 0; c < NR; c++)
            tot[r][c] = _mm512_setzero_ps();
    const int64_t gs = k / g, next = next_block(k);
    for (int64_t gi = 0; gi < g; gi++) {
        __m512 sc[NB];
        for (int c = 0; c < NR; c++)
            sc[c] = GR ? _mm512_set1_ps(s[c * g + gi]) : _mm512_setzero_ps();
        const int64_t j1 = (gi + 1) * gs;
        int64_t j = gi * gs;
        for (; j + 16 <= j1; j += 16) {
            __m512 wv[NB];
            for (int c = 0; c < NR; c++) {
                const int8_t *p = w + c * k + j;
                if ((j & 48) == 0)
                    prefetch(p, next);
                wv[c] = i8_widen(p);
                if (GR == 1)
                    wv[c] = _mm512_mul_ps(wv[c], sc[c]);
            }
            for (int r = 0; r < MR; r++) {
                const __m512 xv = _mm512_loadu_ps(x + r * k + j);
                for (int c = 0; c < NR; c++)
                    acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
            }
        }
        if (j < j1) {
            const __mmask16 m = rc_tail16(j1 - j);
            __m512 wv[NB];
            for (int c = 0; c < NR; c++) {
                wv[c] = i8_widen_m(w + c * k + j, m);
                if (GR == 1)
                    wv[c] = _mm512_mul_ps(wv[c], sc[c]);
            }
            for (int r = 0; r < MR; r++) {
                const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * k + j);
                for (int c = 0; c < NR; c++)
                    acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
            }
        }
        for (int r = 0; r < (GR == 2 ? MR : 0); r++)
            for (int c = 0; c < NR; c++) {
                tot[r][c] = _mm512_fmadd_ps(acc[r][c], sc[c], tot[r][c]);
                acc[r][c] = _mm512_setzero_ps();
            }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            res[r * NR + c] = _mm512_reduce_add_ps(GR == 2 ? tot[r % 2][c] : acc[r][c]);
}

/* i8_dot for a run-time mr in [1, MB], NR in {1, NB}, grouped or not */
RC_AI void i8_rows(const float *x, const int8_t *w, const float *s, int64_t k, int64_t g,
                   float *res, int64_t mr, const int NR)
{
    if (g > 1) {
        switch (mr) {
        case 1: i8_dot(x, w, s, k, g, res, 1, NR, 2); break;
        case 2: i8_dot(x, w, s, k, g, res, 2, NR, 2); break;
        case 3: i8_dot(x, w, s, k, g, res, 3, NR, 1); break;
        default: i8_dot(x, w, s, k, g, res, 4, NR, 1); break;
        }
    } else {
        switch (mr) {
        case 1: i8_dot(x, w, s, k, 1, res, 1, NR, 0); break;
        case 2: i8_dot(x, w, s, k, 1, res, 2, NR, 0); break;
        case 3: i8_dot(x, w, s, k, 1, res, 3, NR, 0); break;
        default: i8_dot(x, w, s, k, 1, res, 4, NR, 0); break;
        }
    }
}

/* Output columns [n0, n0 + NB) (fewer at the end of N) for every row of x (xf: fp32). */
static void i8_block(const float *xf, const void *x, const int8_t *w, const float *s,
                     const void *b, void *y, int64_t m, int64_t n, int64_t k, int64_t g,
                     int64_t n0, int bf16)
{
    const int64_t nr = rc_min64(NB, n - n0), nc = nr == NB ? NB : 1;
    float res[MB * NB];
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
        const int64_t mr = rc_min64(MB, m - m0);
        for (int64_t c0 = 0; c0 < nr; c0 += nc) {
            const int64_t col0 = n0 + c0;
            if (nc == NB)
                i8_rows(xf + m0 * k, w + col0 * k, s + col0 * g, k, g, res, mr, NB);
            else
                i8_rows(xf + m0 * k, w + col0 * k, s + col0 * g, k, g, res, mr, 1);
            for (int64_t c = 0; c < nc; c++) {
                const int64_t col = col0 + c;
                const float sc = g > 1 ? 1.0f : s[col], bias = b ? rc_ld(b, col, bf16) : 0.0f;
                for (int64_t r = 0; r < mr; r++) {
                    float v = res[r * nc + c] * sc + bias;
                    if (!isfinite(v))
                        v = rc_woq_exact8(x, w, s, b, m0 + r, col, k, g, bf16);
                    rc_st(y, (m0 + r) * n + col, v, bf16);
                }
            }
        }
    }
}

RC_WOQ_LINEAR(static, woq_linear, i8_block, NB)

void RC_FN(rc_woq_linear_f32)(const void *x, const void *w, const void *s, const void *b,
                              void *y, int64_t m, int64_t n, int64_t k, int64_t g, int nt)
{
    woq_linear(x, w, s, b, y, m, n, k, g, nt, 0);
}

void RC_FN(rc_woq_linear_bf16)(const void *x, const void *w, const void *s, const void *b,
                               void *y, int64_t m, int64_t n, int64_t k, int64_t g, int nt)
{
    woq_linear(x, w, s, b, y, m, n, k, g, nt, 1);
}

/* ---------------------------------------------------------------------------------------------
 * woq_int4_linear (4-bit codes, a scale and a min per group of a multiple of 16 values) */

/* xd row r (k32 = k rounded up to 32 values): per 32 values of x row r, its 16 even then its 16
 * odd ones, fp32 (0 past k). */
static void int4_prepare(const void *x, float *xd, int64_t m, int64_t k, int64_t k32, int bf16)
{
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < k32; j += 32)
            for (int64_t i = 0; i < 16; i++) {
                const int64_t e = j + 2 * i;
                xd[r * k32 + j + i] = e < k ? rc_ld(x, r * k + e, bf16) : 0.0f;
                xd[r * k32 + j + 16 + i] = e + 1 < k ? rc_ld(x, r * k + e + 1, bf16) : 0.0f;
            }
}

/* res[r * NR + c] = sum_j x[r, j] * W[c, j] with W[c, j] = fp32(q * scale + min) of j's group;
 * xd de-interleaved rows of k32, w rows of k / 2 bytes, s and mn the NR rows' g values. */
RC_AI void i4_dot(const float *xd, int64_t k32, const uint8_t *w, const float *s,
                  const float *mn, int64_t k, int64_t g, float *res, const int MR, const int NR)
{
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int64_t gs = k / g, half = k / 2, next = next_block(half);
    __m512 acc[MB][NB];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < g; gi++) {
        __m512 t[NB]; /* each row's table of the group: t[q] = q * scale + min */
        for (int c = 0; c < NR; c++)
            t[c] = _mm512_fmadd_ps(iota, _mm512_set1_ps(s[c * g + gi]),
                                   _mm512_set1_ps(mn[c * g + gi]));
        const int64_t j1 = (gi + 1) * gs;
        int64_t j = gi * gs;
        while (j < j1) {
            if ((j & 31) == 0 && j + 32 <= j1) { /* 32 values: 16 bytes a row */
                for (int c = 0; c < NR; c++) {
                    const uint8_t *p = w + c * half + j / 2;
                    if ((j & 96) == 0)
                        prefetch(p, next);
                    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
                    const __m512 lo = _mm512_permutexvar_ps(d, t[c]);
                    const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), t[c]);
                    for (int r = 0; r < MR; r++) {
                        const float *xr = xd + r * k32 + j;
                        acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr), lo, acc[r][c]);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16), hi, acc[r][c]);
                    }
                }
                j += 32;
            } else { /* 16 values (8 bytes a row): lanes 0..7 of the even and the odd vector */
                const int64_t blk = j & ~(int64_t)31, off = (j & 31) / 2;
                for (int c = 0; c < NR; c++) {
                    const uint8_t *p = w + c * half + j / 2;
                    const __m512i d =
                        _mm512_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
                    const __m512 lo = _mm512_maskz_permutexvar_ps(0xFF, d, t[c]);
                    const __m512 hi =
                        _mm512_maskz_permutexvar_ps(0xFF, _mm512_srli_epi32(d, 4), t[c]);
                    for (int r = 0; r < MR; r++) {
                        const float *xr = xd + r * k32 + blk + off;
                        acc[r][c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(0xFF, xr), lo,
                                                    acc[r][c]);
                        acc[r][c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(0xFF, xr + 16), hi,
                                                    acc[r][c]);
                    }
                }
                j += 16;
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            res[r * NR + c] = _mm512_reduce_add_ps(acc[r][c]);
}

RC_AI void i4_rows(const float *xd, int64_t k32, const uint8_t *w, const float *s,
                   const float *mn, int64_t k, int64_t g, float *res, int64_t mr, const int NR)
{
    switch (mr) {
    case 1: i4_dot(xd, k32, w, s, mn, k, g, res, 1, NR); break;
    case 2: i4_dot(xd, k32, w, s, mn, k, g, res, 2, NR); break;
    case 3: i4_dot(xd, k32, w, s, mn, k, g, res, 3, NR); break;
    default: i4_dot(xd, k32, w, s, mn, k, g, res, 4, NR); break;
    }
}

static void i4_block(const float *xd, int64_t k32, const void *x, const uint8_t *w,
                     const float *s, const float *mn, const void *b, void *y, int64_t m,
                     int64_t n, int64_t k, int64_t g, int64_t n0, int bf16)
{
    const int64_t nr = rc_min64(NB, n - n0), nc = nr == NB ? NB : 1;
    float res[MB * NB];
    for (int64_t m0 = 0; m0 < m; m0 += MB) {
        const int64_t mr = rc_min64(MB, m - m0);
        for (int64_t c0 = 0; c0 < nr; c0 += nc) {
            const int64_t col0 = n0 + c0;
            const uint8_t *wc = w + col0 * (k / 2);
            if (nc == NB)
                i4_rows(xd + m0 * k32, k32, wc, s + col0 * g, mn + col0 * g, k, g, res, mr, NB);
            else
                i4_rows(xd + m0 * k32, k32, wc, s + col0 * g, mn + col0 * g, k, g, res, mr, 1);
            for (int64_t c = 0; c < nc; c++) {
                const int64_t col = col0 + c;
                const float bias = b ? rc_ld(b, col, bf16) : 0.0f;
                for (int64_t r = 0; r < mr; r++) {
                    float v = res[r * nc + c] + bias;
                    if (!isfinite(v))
                        v = rc_woq_exact4(x, w, s, mn, b, m0 + r, col, k, g, bf16);
                    rc_st(y, (m0 + r) * n + col, v, bf16);
                }
            }
        }
    }
}

static void woq_int4_linear(const void *x, const void *w, const void *s, const void *mn,
                            const void *b, void *y, int64_t m, int64_t n, int64_t k, int64_t g,
                            int nt, int bf16)
{
    const int64_t k32 = (k + 31) / 32 * 32;
    float *xd = malloc((size_t)(m * k32 + 1) * sizeof(float));
    if (!xd) { /* out of memory: the float64 formula needs no copy */
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < n; c++)
                rc_st(y, r * n + c, rc_woq_exact4(x, w, s, mn, b, r, c, k, g, bf16), bf16);
        return;
    }
    int4_prepare(x, xd, m, k, k32, bf16);
    RC_PARALLEL_FOR(nt, rc_rows_per_chunk(k / 2 * NB))
    for (int64_t i = 0; i < (n + NB - 1) / NB; i++)
        i4_block(xd, k32, x, (const uint8_t *)w, (const float *)s, (const float *)mn, b, y, m,
                 n, k, g, i * NB, bf16);
    free(xd);
}

void RC_FN(rc_woq_int4_linear_f32)(const void *x, const void *w, const void *s, const void *mn,
                                   const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                   int64_t g, int nt)
{
    woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 0);
}

void RC_FN(rc_woq_int4_linear_bf16)(const void *x, const void *w, const void *s, const void *mn,
                                    const void *b, void *y, int64_t m, int64_t n, int64_t k,
                                    int64_t g, int nt)
{
    woq_int4_linear(x, w, s, mn, b, y, m, n, k, g, nt, 1);
}
