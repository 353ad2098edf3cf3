/* embedding family, AVX-512: embedding_bag (same arithmetic as embedding_portable.c).
 *
 * Bags are split over the threads (dynamic chunks): each thread writes only its bags' output
 * rows, so there are no atomics and the result does not depend on the thread count. A bag is
 * pooled one column block (up to 128 columns, 8 zmm accumulators) at a time, rows added in index
 * order in fp32 (as torch does), the block's last vector a masked load/store; bf16 rows are
 * widened exactly and the pooled value rounded once. Rows of a large table are random DRAM
 * reads: the row `ahead` positions further on is prefetched (across bag boundaries).
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include "embedding.h"
#include "rc_avx512.h"
#include "rc_gather_scatter.h"
#include "rc_spmm_t.h"

enum { SUM = 0, MEAN = 1, MAX = 2, MIN = 3, BLOCK = 8, BAGS_PER_CHUNK = 32 };

static inline int64_t idx_at(const void *idx, int idx64, int64_t p)
{
    return idx64 ? ((const int64_t *)idx)[p] : (int64_t)((const int32_t *)idx)[p];
}

/* The 8 accumulators are named variables (an array of them is spilled to the stack by gcc). A
 * full block (128 columns) uses plain loads: 8 masks would not fit the 7 usable mask registers. */
#define RC_EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define RC_DECL(k)                                                                                 \
    const __mmask16 m##k = k < nv ? rc_tail16(width - 16 * k) : 0;                                \
    __m512 a##k = init;
#define RC_POOL(k)                                                                                 \
    if (k < nv) {                                                                                  \
        __m512 x = full ? rc_load(row, 16 * k, bf16) : rc_load_m(row, 16 * k, m##k, bf16);        \
        if (weighted)                                                                              \
            x = _mm512_mul_ps(x, sc);                                                              \
        a##k = mode == MAX   ? max_nan(a##k, x)                                                    \
               : mode == MIN ? min_nan(a##k, x)                                                    \
                             : _mm512_add_ps(a##k, x);                                             \
    }
#define RC_STORE(k)                                                                                \
    if (k < nv)                                                                                    \
        rc_store_m(out, c0 + 16 * k, m##k, fin(a##k, cnt, mode, e > s), bf16);

/* max(a, x) with NaN sticky in either operand, as np.max (vmaxps alone returns x when either is
 * NaN, so a NaN pooled so far would be replaced by the next row) */
static inline __attribute__((always_inline)) __m512 max_nan(__m512 a, __m512 x)
{
    return _mm512_mask_mov_ps(_mm512_max_ps(a, x), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

/* min(a, x), NaN sticky as in max_nan */
static inline __attribute__((always_inline)) __m512 min_nan(__m512 a, __m512 x)
{
    return _mm512_mask_mov_ps(_mm512_min_ps(a, x), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
}

/* the pooled value: mean divides by the count; an empty bag is 0 in every mode (torch) */
static inline __attribute__((always_inline)) __m512 fin(__m512 a, __m512 cnt, int mode, int any)
{
    if (!any)
        return _mm512_setzero_ps();
    return mode == MEAN ? _mm512_div_ps(a, cnt) : a;
}

/* One bag [s, e), columns [c0, c0 + width), width <= 16 * BLOCK (== when `full`); out is the
 * bag's output row. Every argument after `ahead` is a constant at each call site, so each
 * specialisation has no branch on them in its row loop. Sums start at 0, max at -inf, min
 * at +inf; `weighted` scales each row by its weight before it is pooled, in every mode. */
static inline __attribute__((always_inline)) void pool_block(
    const void *w, int64_t d, const void *idx, int64_t s, int64_t e, int64_t n, const void *psw,
    void *out, int64_t c0, int64_t width, int ahead, int mode, int weighted, int idx64, int full,
    int bf16)
{
    const int64_t esz = bf16 ? 2 : 4;
    if (full)
        width = 16 * BLOCK;
    const char *base = (const char *)w + c0 * esz;
    const int nv = (int)((width + 15) / 16);
    const __m512 init = _mm512_set1_ps(mode == MAX ? -INFINITY : mode == MIN ? INFINITY : 0.0f);
    RC_EACH(RC_DECL)
    for (int64_t p = s; p < e; p++) {
        if (ahead && p + ahead < n) {
            const char *f = base + idx_at(idx, idx64, p + ahead) * d * esz;
            for (int64_t o = 0; o < width * esz; o += 64)
                _mm_prefetch(f + o, _MM_HINT_T0);
        }
        const char *row = base + idx_at(idx, idx64, p) * d * esz;
        const __m512 sc = weighted ? _mm512_set1_ps(rc_ld(psw, p, bf16)) : _mm512_setzero_ps();
        RC_EACH(RC_POOL)
    }
    const __m512 cnt = _mm512_set1_ps((float)(e - s));
    RC_EACH(RC_STORE)
}

/* Bags [b0, b1) with every pooling parameter a constant; n = len(idx) = bounds[bags]. */
static inline __attribute__((always_inline)) void pool_range(
    const void *w, int64_t d, const void *idx, int64_t n, const int64_t *bounds, const void *psw,
    void *out, int ahead, int64_t b0, int64_t b1, int mode, int weighted, int idx64, int bf16)
{
    const int64_t esz = bf16 ? 2 : 4, wide = 16 * BLOCK;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t s = bounds[b], e = bounds[b + 1];
        char *o = (char *)out + b * d * esz;
        int64_t c0 = 0;
        for (; c0 + wide <= d; c0 += wide)
            pool_block(w, d, idx, s, e, n, psw, o, c0, wide, ahead, mode, weighted, idx64, 1,
                       bf16);
        if (c0 < d)
            pool_block(w, d, idx, s, e, n, psw, o, c0, d - c0, ahead, mode, weighted, idx64, 0,
                       bf16);
    }
}

/* kind: 2 * mode + weighted (rows scaled by psw) */

/* One chunk of bags: the switch picks the specialisation once per chunk. (The parallel loop
 * cannot hold the specialisations itself: gcc outlines an OpenMP region before inlining, so an
 * always_inline function's region would see its "constant" parameters as variables.) */
static inline __attribute__((always_inline)) void pool_chunk(
    const void *w, int64_t d, const void *idx, int idx64, int64_t n, const int64_t *bounds,
    const void *psw, void *out, int ahead, int64_t b0, int64_t b1, int kind, int bf16)
{
#define RC_CASE(k, mode, weighted)                                                                 \
    case k:                                                                                        \
        if (idx64)                                                                                 \
            pool_range(w, d, idx, n, bounds, psw, out, ahead, b0, b1, mode, weighted, 1, bf16);    \
        else                                                                                       \
            pool_range(w, d, idx, n, bounds, psw, out, ahead, b0, b1, mode, weighted, 0, bf16);    \
        break;
    switch (kind) {
        RC_CASE(2 * SUM, SUM, 0)
        RC_CASE(2 * SUM + 1, SUM, 1)
        RC_CASE(2 * MEAN, MEAN, 0)
        RC_CASE(2 * MEAN + 1, MEAN, 1)
        RC_CASE(2 * MAX, MAX, 0)
        RC_CASE(2 * MAX + 1, MAX, 1)
        RC_CASE(2 * MIN, MIN, 0)
        RC_CASE(2 * MIN + 1, MIN, 1)
    }
#undef RC_CASE
}

#define RC_CHUNK_ARGS                                                                              \
    const void *w, int64_t d, const void *idx, int idx64, int64_t n, const int64_t *bounds,        \
        const void *psw, void *out, int ahead, int64_t b0, int64_t b1, int kind

static __attribute__((noinline)) void chunk_bf16(RC_CHUNK_ARGS)
{
    pool_chunk(w, d, idx, idx64, n, bounds, psw, out, ahead, b0, b1, kind, 1);
}

static inline int kind_of(int mode, const void *psw)
{
    return 2 * mode + (psw != NULL);
}

#define RC_CHUNKS(nb) (((nb) + BAGS_PER_CHUNK - 1) / BAGS_PER_CHUNK)

void RC_FN(rc_embedding_bag_bf16)(const void *w, int64_t d, const void *idx, int idx64,
                                  const void *bounds, int64_t nbags, const void *psw, int mode,
                                  void *out, int ahead, int nt)
{
    const int64_t *bd = (const int64_t *)bounds;
    const int kind = kind_of(mode, psw);
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(nbags); c++)
        chunk_bf16(w, d, idx, idx64, bd[nbags], bd, psw, out, ahead, c * BAGS_PER_CHUNK,
                   rc_min64(nbags, (c + 1) * BAGS_PER_CHUNK), kind);
}

RC_SPMM_T_DEFINE(rc_spmm_reduce_backward_bf16, 1)
RC_GS_DEFINE(rc_gather_scatter_bf16, 1)

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernels */
RC_SPMM_T_DEFINE(rc_spmm_reduce_backward_f32, 0)
RC_GS_DEFINE(rc_gather_scatter_f32, 0)

static __attribute__((noinline)) void chunk_f32(RC_CHUNK_ARGS)
{
    pool_chunk(w, d, idx, idx64, n, bounds, psw, out, ahead, b0, b1, kind, 0);
}

void RC_FN(rc_embedding_bag_f32)(const void *w, int64_t d, const void *idx, int idx64,
                                 const void *bounds, int64_t nbags, const void *psw, int mode,
                                 void *out, int ahead, int nt)
{
    const int64_t *bd = (const int64_t *)bounds;
    const int kind = kind_of(mode, psw);
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < RC_CHUNKS(nbags); c++)
        chunk_f32(w, d, idx, idx64, bd[nbags], bd, psw, out, ahead, c * BAGS_PER_CHUNK,
                  rc_min64(nbags, (c + 1) * BAGS_PER_CHUNK), kind);
}
#endif
