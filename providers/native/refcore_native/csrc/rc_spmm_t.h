/* spmm_reduce_backward, sum / mean (specs/sparse.yaml): one body for every ISA level, included
 * by embedding_<level>.c; the feature loop is vectorised by the compiler at the level's flags
 * (omp simd; -O3), the rest is index walking.
 *
 * acc (K, d) fp32: row k = the sum over column k's nonzeros j, in storage order, of
 * w_j * g[row(j)], w_j = vals[j] (/ the row's nonzeros for a mean). Columns are split into
 * blocks [cb[b], cb[b + 1]), one per thread: each block walks every CSR row in order and adds to
 * its own columns only, so g is read front to back, there are no atomics, and a column's terms
 * arrive in storage order whatever the thread count. bf16: out (K, d) gets acc rounded once
 * (RNE); fp32 callers pass out == acc.
 */
#ifndef RC_SPMM_T_H
#define RC_SPMM_T_H

#include "rc_common.h"

static inline int64_t rc_spmm_t_col(const void *col, int idx64, int64_t j)
{
    return idx64 ? ((const int64_t *)col)[j] : (int64_t)((const int32_t *)col)[j];
}

static inline __attribute__((always_inline)) void rc_spmm_t_block(
    const void *g, int64_t d, const int64_t *crow, int64_t rows, const void *col, int idx64,
    const void *vals, int mean, int64_t c0, int64_t c1, float *acc, void *out, int bf16)
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
            if (bf16) {
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
        const void *vals, int mean, const void *cbounds, int64_t nblocks, void *acc, void *out,    \
        int nt

/* The parallel loop calls a noinline specialisation per dtype (gcc outlines an OpenMP region
 * before inlining, so `bf16` would not be a constant inside it). */
#define RC_SPMM_T_DEFINE(name, bf16)                                                               \
    static __attribute__((noinline)) void name##_block(                                           \
        const void *g, int64_t d, const int64_t *crow, int64_t rows, const void *col, int idx64,  \
        const void *vals, int mean, int64_t c0, int64_t c1, float *acc, void *out)                 \
    {                                                                                              \
        rc_spmm_t_block(g, d, crow, rows, col, idx64, vals, mean, c0, c1, acc, out, bf16);        \
    }                                                                                              \
    void RC_FN(name)(RC_SPMM_T_ARGS)                                                               \
    {                                                                                              \
        const int64_t *cb = (const int64_t *)cbounds;                                              \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t b = 0; b < nblocks; b++)                                                      \
            name##_block(g, d, (const int64_t *)crow, rows, col, idx64, vals, mean, cb[b],         \
                         cb[b + 1], (float *)acc, out);                                            \
    }

#endif
