/* spmm_reduce_backward (specs/sparse.yaml): one body for every ISA level, included
 * by embedding_<level>.c; the feature loop is vectorised by the compiler at the level's flags
 * (omp simd; -O3), the rest is index walking.
 *
 * acc (K, d) fp32: row k = the sum over column k's nonzeros j, in storage order, of
 * w_j * g[row(j)], w_j = vals[j] (/ the row's nonzeros for a mean). Columns are split into
 * blocks [cb[b], cb[b + 1]), one per thread: each block walks every CSR row in order and adds to
 * its own columns only, so g is read front to back, there are no atomics, and a column's terms
 * arrive in storage order whatever the thread count. bf16: out (K, d) gets acc rounded once
 * (RNE); fp32 callers pass out == acc.
 *
 * amax / amin (mode 2 / 3): first each (row, feature)'s winner, arg (rows, d) int64, by torch's
 * rule (refcore.ops.grad.sparse._winners): a running extreme from -inf / +inf taken over by a
 * float32 product vals[j] * dense[col[j], f] strictly beyond it or by a NaN; -1 where none wins.
 * Rows are split over the threads for that pass; then the column blocks add vals[j] * g[i, f]
 * where arg[i, f] == j.
 */
#ifndef RC_SPMM_T_H
#define RC_SPMM_T_H

#include "rc_common.h"

static inline int64_t rc_spmm_t_col(const void *col, int idx64, int64_t j)
{
    return idx64 ? ((const int64_t *)col)[j] : (int64_t)((const int32_t *)col)[j];
}

enum { RC_SPMM_SUM = 0, RC_SPMM_MEAN = 1, RC_SPMM_AMAX = 2, RC_SPMM_AMIN = 3 };
enum { RC_SPMM_T_FEATURES = 256 }; /* the winner pass's running extremes, a stack block */
enum { RC_SPMM_T_ROWS = 64 };      /* rows per dynamically scheduled chunk of that pass */

/* arg[i, f] for rows [r0, r1) (see the header comment) */
static inline __attribute__((always_inline)) void rc_spmm_t_winners(
    const int64_t *crow, const void *col, int idx64, const void *vals, const void *dense,
    int64_t d, int amax, int64_t r0, int64_t r1, int64_t *arg, int bf16)
{
    float best[RC_SPMM_T_FEATURES];
    for (int64_t i = r0; i < r1; i++) {
        int64_t *a = arg + i * d;
        for (int64_t f0 = 0; f0 < d; f0 += RC_SPMM_T_FEATURES) {
            const int64_t n = rc_min64(RC_SPMM_T_FEATURES, d - f0);
            for (int64_t f = 0; f < n; f++) {
                a[f0 + f] = -1;
                best[f] = amax ? -INFINITY : INFINITY;
            }
            for (int64_t j = crow[i]; j < crow[i + 1]; j++) {
                const float v = rc_ld(vals, j, bf16);
                const int64_t r = rc_spmm_t_col(col, idx64, j) * d + f0;
                int64_t *af = a + f0;
#pragma omp simd
                for (int64_t f = 0; f < n; f++) { /* branch-free, so it vectorises */
                    const float t = v * rc_ld(dense, r + f, bf16);
                    const int take = (amax ? t > best[f] : t < best[f]) | (t != t);
                    best[f] = take ? t : best[f];
                    af[f] = take ? j : af[f];
                }
            }
        }
    }
}

static inline __attribute__((always_inline)) void rc_spmm_t_block(
    const void *g, int64_t d, const int64_t *crow, int64_t rows, const void *col, int idx64,
    const void *vals, int mean, const int64_t *arg, int64_t c0, int64_t c1, float *acc,
    void *out, int bf16)
{
    memset(acc + c0 * d, 0, (size_t)((c1 - c0) * d) * sizeof(float));
    for (int64_t i = 0; i < rows; i++) {
        const int64_t lo = crow[i], hi = crow[i + 1];
        const float cnt = (float)(hi - lo);
        for (int64_t j = lo; j < hi; j++) {
            const int64_t k = rc_spmm_t_col(col, idx64, j);
            if (k < c0 || k >= c1)
                continue;
            float w = rc_ld(vals, j, bf16);
            if (mean)
                w = w / cnt;
            float *a = acc + k * d;
            if (arg) {
                /* amax / amin: the winners' terms only. Adding +0 elsewhere is exact: a sum that
                 * starts at +0 is never -0 (+0 + -0 = +0), and +0 leaves every other value. */
                const int64_t *ai = arg + i * d;
#pragma omp simd
                for (int64_t f = 0; f < d; f++)
                    a[f] += ai[f] == j ? w * rc_ld(g, i * d + f, bf16) : 0.0f;
            } else if (bf16) {
                const uint16_t *gi = (const uint16_t *)g + i * d;
#pragma omp simd
                for (int64_t f = 0; f < d; f++)
                    a[f] += w * rc_bf16_to_f32(gi[f]);
            } else {
                const float *gi = (const float *)g + i * d;
#pragma omp simd
                for (int64_t f = 0; f < d; f++)
                    a[f] += w * gi[f];
            }
        }
    }
    if (bf16)
        for (int64_t e = c0 * d; e < c1 * d; e++)
            ((uint16_t *)out)[e] = rc_f32_to_bf16(acc[e]);
}

#define RC_SPMM_T_ARGS                                                                             \
    const void *g, int64_t d, const void *crow, int64_t rows, const void *col, int idx64,          \
        const void *vals, const void *dense, int mode, const void *cbounds, int64_t nblocks,       \
        void *arg, void *acc, void *out, int nt

/* The parallel loops call noinline specialisations per dtype (gcc outlines an OpenMP region
 * before inlining, so `bf16` would not be a constant inside it). */
#define RC_SPMM_T_DEFINE(name, bf16)                                                               \
    static __attribute__((noinline)) void name##_block(                                           \
        const void *g, int64_t d, const int64_t *crow, int64_t rows, const void *col, int idx64,  \
        const void *vals, int mean, const int64_t *arg, int64_t c0, int64_t c1, float *acc,        \
        void *out)                                                                                 \
    {                                                                                              \
        rc_spmm_t_block(g, d, crow, rows, col, idx64, vals, mean, arg, c0, c1, acc, out, bf16);   \
    }                                                                                              \
    static __attribute__((noinline)) void name##_winners(                                         \
        const int64_t *crow, const void *col, int idx64, const void *vals, const void *dense,      \
        int64_t d, int amax, int64_t r0, int64_t r1, int64_t *arg)                                 \
    {                                                                                              \
        rc_spmm_t_winners(crow, col, idx64, vals, dense, d, amax, r0, r1, arg, bf16);              \
    }                                                                                              \
    void RC_FN(name)(RC_SPMM_T_ARGS)                                                               \
    {                                                                                              \
        const int64_t *cb = (const int64_t *)cbounds, *cr = (const int64_t *)crow;                 \
        const int extreme = mode == RC_SPMM_AMAX || mode == RC_SPMM_AMIN;                         \
        if (extreme) {                                                                             \
            const int64_t chunk = RC_SPMM_T_ROWS;                                              \
            RC_PARALLEL_FOR(nt, 1)                                                                 \
            for (int64_t r0 = 0; r0 < rows; r0 += chunk)                                           \
                name##_winners(cr, col, idx64, vals, dense, d, mode == RC_SPMM_AMAX, r0,           \
                               rc_min64(rows, r0 + chunk), (int64_t *)arg);                        \
        }                                                                                          \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t b = 0; b < nblocks; b++)                                                      \
            name##_block(g, d, cr, rows, col, idx64, vals, mode == RC_SPMM_MEAN,                   \
                         extreme ? (const int64_t *)arg : NULL, cb[b], cb[b + 1], (float *)acc,    \
                         out);                                                                     \
    }

#endif
