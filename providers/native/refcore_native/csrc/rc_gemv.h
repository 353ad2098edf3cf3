/* The small-M linear driver shared by linalg_avx512.c and linalg_avx512_bf16.c.
 *
 * y (M, N) = x (M, K) @ w (N, K).T + b. w is streamed once: its N rows are handed to the
 * threads in blocks of RC_NB = 8 rows (dynamically, ~64 KB at a time); for each block every group
 * of up to RC_MB = 4 rows of x (L1/L2 resident) is dotted with the block's rows, MR x NR vector
 * accumulators in registers (NR = 8 for MR <= 2, else two halves of 4: at most 25 of the 32
 * registers), with software prefetch RC_PF bytes ahead on each w row (0: none; on the AMD
 * EPYC project machine 0-512 B measured equal within noise and 1024 B 20-30% slower, single
 * thread, M = 1, cold 32 MB weights: its hardware prefetchers keep 8 streams fed). The includer
 * defines
 *   RC_KSTEP                        elements of K per step (16 fp32 lanes, 32 for vdpbf16ps)
 *   rc_acc_t, RC_ACC_ZERO           accumulator type and zero
 *   RC_XLOAD(p, m) / RC_WLOAD(p, m) operand loads at element pointer p, mask m (tail) or full
 *   RC_MASK(n) / RC_FULL            tail mask for n remaining elements / the all-ones mask
 *   RC_DOT(acc, xv, wv)             acc += x . w lane-wise
 *   RC_HSUM(acc)                    horizontal sum to float
 * and includes this file after them.
 */
#ifndef RC_GEMV_H
#define RC_GEMV_H

#include "rc_gemm_fix.h"

#ifndef RC_PF
#define RC_PF 256
#endif
#define RC_PF_NEXT 16384
enum { RC_MB = 4, RC_NB = 8 };

/* res[r * NR + c] = x[r, :] . w[c, :] for r < MR, c < NR (MR, NR compile-time constants). */
static inline __attribute__((always_inline)) void dot_block(const char *x, const char *w,
                                                            int64_t k, int64_t es, float *res,
                                                            const int MR, const int NR)
{
    rc_acc_t acc[RC_MB][RC_NB];
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            acc[r][c] = RC_ACC_ZERO;
    const int64_t row = k * es;
    /* short rows (a block of RC_NB rows <= RC_PF_NEXT bytes): also prefetch the same place in
     * the next block, which the thread most likely reads next (its chunks are runs of blocks) */
    const int64_t next = RC_NB * row <= RC_PF_NEXT ? RC_NB * row : 0;
    int64_t j = 0;
    for (; j + RC_KSTEP <= k; j += RC_KSTEP) {
        __typeof__(RC_WLOAD(w, RC_FULL)) wv[RC_NB];
        for (int c = 0; c < NR; c++) {
            const char *p = w + c * row + j * es;
            /* a prefetch never faults; the address is formed as an integer (past the end of w
             * near the last step, which pointer arithmetic would not allow) */
            if (RC_PF > 0)
                _mm_prefetch((const char *)((uintptr_t)p + RC_PF), _MM_HINT_T0);
            if (RC_PF > 0 && next)
                _mm_prefetch((const char *)((uintptr_t)p + next), _MM_HINT_T0);
            wv[c] = RC_WLOAD(p, RC_FULL);
        }
        for (int r = 0; r < MR; r++) {
            __typeof__(RC_XLOAD(x, RC_FULL)) xv = RC_XLOAD(x + r * row + j * es, RC_FULL);
            for (int c = 0; c < NR; c++)
                acc[r][c] = RC_DOT(acc[r][c], xv, wv[c]);
        }
    }
    if (j < k) {
        __typeof__(RC_FULL) m = RC_MASK(k - j);
        for (int r = 0; r < MR; r++) {
            __typeof__(RC_XLOAD(x, m)) xv = RC_XLOAD(x + r * row + j * es, m);
            for (int c = 0; c < NR; c++)
                acc[r][c] = RC_DOT(acc[r][c], xv, RC_WLOAD(w + c * row + j * es, m));
        }
    }
    for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++)
            res[r * NR + c] = RC_HSUM(acc[r][c]);
}

/* res[r * NR + c] for a run-time MR in [1, RC_MB] and NR in {1, RC_NB}: a full block of 8 rows
 * at once when MR <= 2, as two halves of 4 otherwise (the accumulators must fit the registers). */
static inline __attribute__((always_inline)) void dot_rows(const char *x, const char *w,
                                                           int64_t k, int64_t es, float *res,
                                                           int64_t mr, const int NR)
{
    if (NR == 1) {
        switch (mr) {
        case 1: dot_block(x, w, k, es, res, 1, 1); break;
        case 2: dot_block(x, w, k, es, res, 2, 1); break;
        case 3: dot_block(x, w, k, es, res, 3, 1); break;
        default: dot_block(x, w, k, es, res, 4, 1); break;
        }
        return;
    }
    float half[2][RC_MB * RC_NB / 2];
    switch (mr) {
    case 1: dot_block(x, w, k, es, res, 1, RC_NB); return;
    case 2: dot_block(x, w, k, es, res, 2, RC_NB); return;
    case 3:
        dot_block(x, w, k, es, half[0], 3, RC_NB / 2);
        dot_block(x, w + RC_NB / 2 * k * es, k, es, half[1], 3, RC_NB / 2);
        break;
    default:
        dot_block(x, w, k, es, half[0], 4, RC_NB / 2);
        dot_block(x, w + RC_NB / 2 * k * es, k, es, half[1], 4, RC_NB / 2);
        break;
    }
    for (int64_t r = 0; r < mr; r++)
        for (int c = 0; c < RC_NB; c++)
            res[r * RC_NB + c] = half[c / (RC_NB / 2)][r * (RC_NB / 2) + c % (RC_NB / 2)];
}

/* Output columns [n0, n0 + RC_NB) (fewer at the end of N), every row of x. */
static inline __attribute__((always_inline)) void linear_block(const void *x, const void *w,
                                                               const void *b, void *y, int64_t m,
                                                               int64_t n, int64_t k, int64_t n0,
                                                               int bf16)
{
    const int64_t es = bf16 ? 2 : 4, nr = rc_min64(RC_NB, n - n0);
    const int64_t nc = nr == RC_NB ? RC_NB : 1; /* columns per dot_rows call */
    float res[RC_MB * RC_NB];
    for (int64_t m0 = 0; m0 < m; m0 += RC_MB) {
        const int64_t mr = rc_min64(RC_MB, m - m0);
        const char *xm = (const char *)x + m0 * k * es;
        for (int64_t c0 = 0; c0 < nr; c0 += nc) {
            const char *wc = (const char *)w + (n0 + c0) * k * es;
            if (nc == RC_NB)
                dot_rows(xm, wc, k, es, res, mr, RC_NB);
            else
                dot_rows(xm, wc, k, es, res, mr, 1);
            for (int64_t c = 0; c < nc; c++) {
                float bias = b ? rc_ld(b, n0 + c0 + c, bf16) : 0.0f;
                for (int64_t r = 0; r < mr; r++) {
                    float v = res[r * nc + c]; /* non-finite: sum and bias in float64 (fix.h) */
                    v = isfinite(v) ? v + bias
                                    : rc_dot_f64(x, m0 + r, w, 0, bf16, n, k, n0 + c0 + c, b);
                    rc_st(y, (m0 + r) * n + n0 + c0 + c, v, bf16);
                }
            }
        }
    }
}

#define RC_NBLOCKS(n) (((n) + RC_NB - 1) / RC_NB)

#endif
