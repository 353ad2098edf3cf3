/* gather_scatter (specs/sparse.yaml): one body for every ISA level, included by
 * embedding_<level>.c; the feature loops are vectorised by the compiler at the level's flags
 * (omp simd; -O3), the rest is index walking.
 *
 * out (dim_size, d): row i = reduce over the edges j with dst[j] == i of w[j] * x[src[j]]
 * (w[j] = 1 without weights), in fp32: acc (dim_size, d) fp32 (== out for fp32 callers). The
 * target nodes are split into blocks [nb[b], nb[b + 1]), one per thread: each block walks every
 * edge in order and takes only those into its own nodes, so there is no sort and no atomics,
 * and a node's terms arrive in edge order whatever the thread count. The edge walk goes a chunk
 * at a time: the chunk's edges into the block are first listed (branch-free: about half of them
 * are the block's, a branch per edge would mispredict), then their rows are reduced, with the
 * x row and the acc row of the listed edge `ahead` places on prefetched (0: none).
 *
 * sum / mean: acc starts at 0 and adds w * x in edge order; mean divides by the node's edge
 * count. amax / amin (torch's rule): a running extreme from -inf / +inf taken over by a float32
 * product strictly beyond it or by a NaN (so NaN propagates; a node whose products are all -inf
 * has amax -inf). A node without edges is 0 for every reduce; bf16 rounds acc once (RNE).
 * count (dim_size int64) counts each node's edges for mean / amax / amin (NULL for sum).
 */
#ifndef RC_GATHER_SCATTER_H
#define RC_GATHER_SCATTER_H

#include "rc_common.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { RC_GS_SUM = 0, RC_GS_MEAN = 1, RC_GS_AMAX = 2, RC_GS_AMIN = 3 };
enum { RC_GS_CHUNK = 1024 }; /* edges listed per step (a stack block of their positions) */

/* The positions j in [0, m) with dc[j] in [n0, n0 + span), in order, into sel; returns how many.
 * Branch-free: about half the edges are the block's, a branch per edge would mispredict. */
static inline int64_t rc_gs_list(const int64_t *dc, int64_t m, int64_t n0, uint64_t span,
                                 int32_t *sel)
{
    int64_t n = 0, j = 0;
#if defined(__AVX512F__)
    /* 16 at a time: two unsigned range compares, the positions compressed in a register (a
     * compress straight to memory is slow on Zen 4) and stored whole; n + 16 <= j + 16 <= m */
    const __m512i lo = _mm512_set1_epi64(n0), sp = _mm512_set1_epi64((long long)span);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i pos = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; j + 16 <= m; j += 16) {
        const __m512i a = _mm512_sub_epi64(_mm512_loadu_si512((const void *)(dc + j)), lo);
        const __m512i b = _mm512_sub_epi64(_mm512_loadu_si512((const void *)(dc + j + 8)), lo);
        const __mmask16 in = (__mmask16)(_mm512_cmplt_epu64_mask(a, sp) |
                                          ((unsigned)_mm512_cmplt_epu64_mask(b, sp) << 8));
        _mm512_storeu_si512((void *)(sel + n), _mm512_maskz_compress_epi32(in, pos));
        n += __builtin_popcount(in);
        pos = _mm512_add_epi32(pos, step);
    }
#endif
    for (; j < m; j++) {
        sel[n] = (int32_t)j;
        n += (uint64_t)(dc[j] - n0) < span;
    }
    return n;
}

static inline void rc_gs_prefetch(const char *p, int64_t bytes, int write)
{
    for (int64_t o = 0; o < bytes; o += 64) {
        if (write)
            __builtin_prefetch(p + o, 1, 3);
        else
            __builtin_prefetch(p + o, 0, 3);
    }
}

/* the rows edge j reads (x[src[j]]) and updates (acc[dst[j]]) */
static inline __attribute__((always_inline)) void rc_gs_fetch(
    const void *x, int64_t d, const int64_t *src, const int64_t *dst, const float *acc,
    int64_t j, int bf16)
{
    const int64_t esz = bf16 ? 2 : 4;
    rc_gs_prefetch((const char *)x + src[j] * d * esz, d * esz, 0);
    rc_gs_prefetch((const char *)(acc + dst[j] * d), d * (int64_t)sizeof(float), 1);
}

/* Nodes [n0, n1): the whole reduction of their rows (see the header comment). */
static inline __attribute__((always_inline)) void rc_gs_block(
    const void *x, int64_t d, const int64_t *src, const int64_t *dst, int64_t ne, const void *w,
    int64_t n0, int64_t n1, int64_t *count, float *acc, void *out, int ahead, int mode, int bf16)
{
    const int extreme = mode == RC_GS_AMAX || mode == RC_GS_AMIN;
    const float init = mode == RC_GS_AMAX ? -INFINITY : mode == RC_GS_AMIN ? INFINITY : 0.0f;
    const int counted = mode != RC_GS_SUM;
    const uint64_t span = (uint64_t)(n1 - n0);
    float *a0 = acc + n0 * d;
    for (int64_t e = 0; e < (n1 - n0) * d; e++)
        a0[e] = init;
    if (counted)
        memset(count + n0, 0, (size_t)(n1 - n0) * sizeof(int64_t));
    int32_t sel[RC_GS_CHUNK];
    for (int64_t j0 = 0; j0 < ne; j0 += RC_GS_CHUNK) {
        const int64_t m = rc_min64(RC_GS_CHUNK, ne - j0);
        const int64_t n = rc_gs_list(dst + j0, m, n0, span, sel); /* the edges into [n0, n1) */
        if (ahead)
            for (int64_t i = 0; i < rc_min64(ahead, n); i++)
                rc_gs_fetch(x, d, src, dst, acc, j0 + sel[i], bf16);
        for (int64_t i = 0; i < n; i++) {
            const int64_t j = j0 + sel[i];
            if (ahead && i + ahead < n)
                rc_gs_fetch(x, d, src, dst, acc, j0 + sel[i + ahead], bf16);
            const int64_t k = dst[j], r = src[j] * d;
            const float wj = w ? rc_ld(w, j, bf16) : 1.0f;
            float *a = acc + k * d;
            if (counted)
                count[k]++;
            if (extreme) {
                const int amax = mode == RC_GS_AMAX;
#pragma omp simd
                for (int64_t f = 0; f < d; f++) { /* branch-free, so it vectorises */
                    const float t = wj * rc_ld(x, r + f, bf16);
                    const int take = (amax ? t > a[f] : t < a[f]) | (t != t);
                    a[f] = take ? t : a[f];
                }
            } else if (bf16) {
                const uint16_t *xr = (const uint16_t *)x + r;
#pragma omp simd
                for (int64_t f = 0; f < d; f++)
                    a[f] += wj * rc_bf16_to_f32(xr[f]);
            } else {
                const float *xr = (const float *)x + r;
#pragma omp simd
                for (int64_t f = 0; f < d; f++)
                    a[f] += wj * xr[f];
            }
        }
    }
    /* finalise the block's nodes: no edges -> 0, mean -> / count, bf16 -> rounded once */
    for (int64_t k = n0; k < n1; k++) {
        float *a = acc + k * d;
        const int64_t c = counted ? count[k] : 1;
        if (c == 0) {
            if (bf16)
                memset((uint16_t *)out + k * d, 0, (size_t)d * sizeof(uint16_t));
            else
                memset(a, 0, (size_t)d * sizeof(float));
            continue;
        }
        if (mode == RC_GS_MEAN) {
            const float cnt = (float)c;
#pragma omp simd
            for (int64_t f = 0; f < d; f++)
                a[f] = a[f] / cnt;
        }
        if (bf16) {
            uint16_t *o = (uint16_t *)out + k * d;
#pragma omp simd
            for (int64_t f = 0; f < d; f++)
                o[f] = rc_f32_to_bf16(a[f]);
        }
    }
}

#define RC_GS_ARGS                                                                                 \
    const void *x, int64_t d, const void *src, const void *dst, int64_t ne, const void *w,         \
        int mode, const void *nbounds, int64_t nblocks, void *count, void *acc, void *out,         \
        int ahead, int nt

/* The parallel loop calls a noinline specialisation per dtype, which picks the one per mode
 * (gcc outlines an OpenMP region before inlining, so `bf16` / `mode` would not be constants
 * inside it). */
#define RC_GS_DEFINE(name, bf16)                                                                   \
    static __attribute__((noinline)) void name##_block(                                           \
        const void *x, int64_t d, const int64_t *src, const int64_t *dst, int64_t ne,              \
        const void *w, int mode, int64_t n0, int64_t n1, int64_t *count, float *acc, void *out,    \
        int ahead)                                                                                 \
    {                                                                                              \
        switch (mode) {                                                                            \
        case RC_GS_SUM:                                                                            \
            rc_gs_block(x, d, src, dst, ne, w, n0, n1, count, acc, out, ahead, RC_GS_SUM, bf16);  \
            break;                                                                                 \
        case RC_GS_MEAN:                                                                           \
            rc_gs_block(x, d, src, dst, ne, w, n0, n1, count, acc, out, ahead, RC_GS_MEAN, bf16); \
            break;                                                                                 \
        case RC_GS_AMAX:                                                                           \
            rc_gs_block(x, d, src, dst, ne, w, n0, n1, count, acc, out, ahead, RC_GS_AMAX, bf16); \
            break;                                                                                 \
        default:                                                                                   \
            rc_gs_block(x, d, src, dst, ne, w, n0, n1, count, acc, out, ahead, RC_GS_AMIN, bf16); \
        }                                                                                          \
    }                                                                                              \
    void RC_FN(name)(RC_GS_ARGS)                                                                   \
    {                                                                                              \
        const int64_t *nb = (const int64_t *)nbounds;                                              \
        RC_PARALLEL_FOR(nt, 1)                                                                     \
        for (int64_t b = 0; b < nblocks; b++)                                                      \
            name##_block(x, d, (const int64_t *)src, (const int64_t *)dst, ne, w, mode, nb[b],     \
                         nb[b + 1], (int64_t *)count, (float *)acc, out, ahead);                   \
    }

#endif
