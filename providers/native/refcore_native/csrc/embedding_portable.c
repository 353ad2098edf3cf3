/* embedding family, portable C: embedding (row copy), embedding_bag.
 *
 * embedding_bag: bags split over the threads (dynamic chunks, each thread writes only its bags'
 * rows); a bag is pooled one column block (up to 128 columns) at a time in an fp32 stack buffer,
 * rows added in index order (as torch does), the first row starting the pool; bf16 rows widened
 * exactly and the result rounded once (RNE). `ahead` rows are prefetched where the compiler
 * offers __builtin_prefetch.
 */
#define RC_LEVEL portable

#include "embedding.h"
#include "rc_common.h"
#include "rc_gather_scatter.h"
#include "rc_spmm_t.h"

enum { SUM = 0, MEAN = 1, MAX = 2, MIN = 3, BLOCK = 128, BAGS_PER_CHUNK = 32 };
enum { ROWS_PER_CHUNK = 256 };

static inline int64_t idx_at(const void *idx, int idx64, int64_t p)
{
    return idx64 ? ((const int64_t *)idx)[p] : (int64_t)((const int32_t *)idx)[p];
}

static inline void prefetch(const char *p, int64_t bytes)
{
    for (int64_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(p + o, 0, 3);
}

void rc_embedding_rows_portable(const void *w, int64_t row_bytes, const void *idx, int idx64,
                                int64_t n, void *out, int ahead, int nt)
{
    RC_PARALLEL_FOR(nt, ROWS_PER_CHUNK)
    for (int64_t i = 0; i < n; i++) {
        if (ahead && i + ahead < n)
            prefetch((const char *)w + idx_at(idx, idx64, i + ahead) * row_bytes, row_bytes);
        memcpy((char *)out + i * row_bytes,
               (const char *)w + idx_at(idx, idx64, i) * row_bytes, (size_t)row_bytes);
    }
}

/* One bag [s, e), columns [c0, c0 + width), width <= BLOCK; out is the bag's output row. */
static inline void pool_block(const void *w, int64_t d, const void *idx, int idx64, int64_t s,
                              int64_t e, int64_t n, const void *psw, void *out, int64_t c0,
                              int64_t width, int ahead, int mode, int bf16)
{
    const int64_t esz = bf16 ? 2 : 4;
    float acc[BLOCK];
    for (int64_t j = 0; j < width; j++)
        acc[j] = 0.0f;
    for (int64_t p = s; p < e; p++) {
        if (ahead && p + ahead < n)
            prefetch((const char *)w + (idx_at(idx, idx64, p + ahead) * d + c0) * esz,
                     width * esz);
        const int64_t r = idx_at(idx, idx64, p) * d + c0;
        const float sc = psw ? rc_ld(psw, p, bf16) : 1.0f;
        for (int64_t j = 0; j < width; j++) {
            float x = rc_ld(w, r + j, bf16);
            if (psw)
                x *= sc;
            if (p == s)
                acc[j] = x;
            else
                acc[j] = mode == MAX   ? (x > acc[j] || x != x ? x : acc[j])
                         : mode == MIN ? (x < acc[j] || x != x ? x : acc[j])
                                       : acc[j] + x;
        }
    }
    const float cnt = (float)(e > s ? e - s : 1);
    for (int64_t j = 0; j < width; j++)
        rc_st(out, c0 + j, mode == MEAN ? acc[j] / cnt : acc[j], bf16);
}

static inline void pool_bags(const void *w, int64_t d, const void *idx, int idx64,
                             const int64_t *bounds, int64_t nb, const void *psw, int mode,
                             void *out, int ahead, int nt, int bf16)
{
    const int64_t n = bounds[nb], esz = bf16 ? 2 : 4;
    RC_PARALLEL_FOR(nt, BAGS_PER_CHUNK)
    for (int64_t b = 0; b < nb; b++)
        for (int64_t c0 = 0; c0 < d; c0 += BLOCK)
            pool_block(w, d, idx, idx64, bounds[b], bounds[b + 1], n, psw,
                       (char *)out + b * d * esz, c0, rc_min64(d - c0, BLOCK), ahead, mode, bf16);
}

void rc_embedding_bag_f32_portable(const void *w, int64_t d, const void *idx, int idx64,
                                   const void *bounds, int64_t nbags, const void *psw, int mode,
                                   void *out, int ahead, int nt)
{
    pool_bags(w, d, idx, idx64, (const int64_t *)bounds, nbags, psw, mode, out, ahead, nt, 0);
}

void rc_embedding_bag_bf16_portable(const void *w, int64_t d, const void *idx, int idx64,
                                    const void *bounds, int64_t nbags, const void *psw, int mode,
                                    void *out, int ahead, int nt)
{
    pool_bags(w, d, idx, idx64, (const int64_t *)bounds, nbags, psw, mode, out, ahead, nt, 1);
}

RC_SPMM_T_DEFINE(rc_spmm_reduce_backward_f32, 0)
RC_SPMM_T_DEFINE(rc_spmm_reduce_backward_bf16, 1)
RC_GS_DEFINE(rc_gather_scatter_f32, 0)
RC_GS_DEFINE(rc_gather_scatter_bf16, 1)
