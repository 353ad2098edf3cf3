/* Shared by every vector level of the attention kernels (AVX2, AVX-512, AMX), plain C: the
 * call's description, the work driver (heads packed, blocks of queries over the threads), and
 * the propagation of non-finite values the kernels never multiply.
 *
 * Non-finite values: the reference computes probs @ value over every key, so a NaN or Inf in
 * value row j reaches column c of every query row, as NaN where the row's weight is 0 (masked
 * out, above the causal diagonal: 0 * inf is NaN). The kernels multiply every key of the blocks
 * they visit (masked ones with p = 0), but skip whole blocks above a causal diagonal (and the
 * decode path's keys past it): those rows' columns are set to NaN afterwards when a skipped value
 * row holds a non-finite element (rc_attn_poison_row). The common case costs one scan of the
 * values per head (rc_attn_last_bad_v, vectorised by the compiler). A key at a masked-out
 * position never enters the scores (the reference's np.where), so keys need nothing here.
 */
#ifndef RC_ATTN_H
#define RC_ATTN_H

#include <stdlib.h>

#include "rc_common.h"

#define RC_ATTN_BS 64 /* keys per block */
#define RC_LOG2E 1.44269504088896341f
/* Lazy rescaling: the running max moves only when a block's max exceeds it by more than this
 * (log2 units), so alpha is exactly 1 for most blocks; probabilities stay below 2^8. */
#define RC_ATTN_SLACK 8.0f

typedef struct {
    const void *q, *k, *v, *mask;
    void *out;
    const int64_t *offs, *st; /* see attention.h */
    int64_t nb, L, S, E, Ev;
    int mask_kind, causal, bf16;
    float scale2;  /* scale * log2(e); scale at avx2 (attention_avx2.c keeps natural units) */
    int64_t *vbad; /* causal flash calls: per batch index the last value row holding a
                    * non-finite element, -1 if none (set by rc_attn_drive), else NULL */
} rc_attn;

static inline int64_t rc_round_up(int64_t n, int64_t m)
{
    return (n + m - 1) / m * m;
}

/* Last key (exclusive) that rows [i0, i0 + n) may attend. */
static inline int64_t rc_attn_key_end(const rc_attn *a, int64_t i0, int64_t n)
{
    return a->causal ? rc_min64(a->S, i0 + n) : a->S;
}

/* Element offset of output row `row` (= b * L + i) in out (attention.h's strides). */
static inline int64_t rc_attn_out_row(const rc_attn *a, int64_t row)
{
    return a->offs[4 * a->nb + row / a->L] + row % a->L * a->st[8];
}

/* Whether value row j of batch b holds a NaN or an Inf (all exponent bits set). The largest
 * masked bit pattern decides, a max reduction the compiler vectorises for dense rows. */
static inline int rc_attn_v_row_bad(const rc_attn *a, int64_t b, int64_t j)
{
    const int64_t o = a->offs[2 * a->nb + b] + j * a->st[4], vf = a->st[5], Ev = a->Ev;
    if (a->bf16) {
        const uint16_t *p = (const uint16_t *)a->v + o;
        uint16_t top = 0;
        if (vf == 1)
            for (int64_t c = 0; c < Ev; c++)
                top = (uint16_t)(p[c] & 0x7f80u) > top ? (uint16_t)(p[c] & 0x7f80u) : top;
        else
            for (int64_t c = 0; c < Ev; c++)
                top = (uint16_t)(p[c * vf] & 0x7f80u) > top ? (uint16_t)(p[c * vf] & 0x7f80u)
                                                             : top;
        return top == 0x7f80u;
    }
    const uint32_t *p = (const uint32_t *)a->v + o;
    uint32_t top = 0;
    if (vf == 1)
        for (int64_t c = 0; c < Ev; c++)
            top = (p[c] & 0x7f800000u) > top ? (p[c] & 0x7f800000u) : top;
    else
        for (int64_t c = 0; c < Ev; c++)
            top = (p[c * vf] & 0x7f800000u) > top ? (p[c * vf] & 0x7f800000u) : top;
    return top == 0x7f800000u;
}

/* The last value row of batch b at or after j0 holding a non-finite element, or -1. */
static inline int64_t rc_attn_last_bad_v(const rc_attn *a, int64_t b, int64_t j0)
{
    int64_t last = -1;
    for (int64_t j = j0; j < a->S; j++) /* forward: a backward walk defeats the prefetchers */
        last = rc_attn_v_row_bad(a, b, j) ? j : last;
    return last;
}

/* Output row `row` (batch b) whose kernel skipped value rows [j0, S): each column where one of
 * them is non-finite becomes NaN (the reference's 0 * v terms). last_bad: the last non-finite
 * row of the batch (rc_attn_last_bad_v), so the common case is one compare. */
static inline void rc_attn_poison_row(const rc_attn *a, int64_t b, int64_t row, int64_t j0,
                                      int64_t last_bad)
{
    if (last_bad < j0)
        return;
    const int64_t ov = a->offs[2 * a->nb + b], o = rc_attn_out_row(a, row);
    for (int64_t c = 0; c < a->Ev; c++)
        for (int64_t j = j0; j <= last_bad; j++)
            if (!isfinite(rc_ld(a->v, ov + j * a->st[4] + c * a->st[5], a->bf16))) {
                rc_st(a->out, o + c, NAN, a->bf16);
                break;
            }
}

/* rc_attn_poison_row for rows [i0, i0 + n) of batch b of a flash kernel (causal calls). */
static inline void rc_attn_poison_rows(const rc_attn *a, int64_t b, int64_t i0, int64_t n)
{
    if (!a->causal || !a->vbad)
        return;
    for (int64_t r = 0; r < n; r++)
        rc_attn_poison_row(a, b, b * a->L + i0 + r, i0 + r + 1, a->vbad[b]);
}

/* How a level runs one head's work: the driver below calls pack once per head (into a buffer of
 * head_bytes), then task for each block of bq queries (with the thread's scratch_bytes). */
typedef struct {
    int64_t bq;
    size_t head_bytes, scratch_bytes;
    void (*pack)(const rc_attn *a, int64_t b, void *packed);
    void (*task)(const rc_attn *a, int64_t b, int64_t i0, const void *packed, void *scratch);
    void (*enter)(void); /* per thread before its first task (AMX: tile config), or NULL */
    void (*leave)(void);
    int pack_sets_vbad; /* pack itself records a->vbad[b] (when a->vbad), from what it read */
} rc_attn_impl;

#define RC_ATTN_PACK_BUDGET ((size_t)8 << 20) /* bytes of heads packed for all threads at once */

/* Buffers start on a cache line: a tile or vector row that straddles two lines costs two
 * accesses (unaligned scratch made the AMX score tiles 4x slower than in isolation). */
static inline void *rc_attn_alloc(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

/* For causal calls the head's last non-finite value row, then the pack (which finds the values
 * in cache) */
static inline void rc_attn_pack_head(const rc_attn *a, const rc_attn_impl *im, int64_t b,
                                     void *packed)
{
    if (a->vbad && !im->pack_sets_vbad)
        a->vbad[b] = rc_attn_last_bad_v(a, b, 0);
    im->pack(a, b, packed);
}

/* Many heads (>= 4 per thread, or one thread): one task per head, which packs into the thread's
 * own buffer and runs all its query blocks. One work-sharing loop, no barrier before the end: on
 * the shared machine a descheduled thread delays nobody (a pack barrier cost 8x there).
 * Few heads: heads packed (in groups within RC_ATTN_PACK_BUDGET) into a shared buffer, then
 * tasks (head, query block), largest causal blocks first, dynamically scheduled.
 * Returns -1 when a buffer could not be allocated. */
static int rc_attn_drive(const rc_attn *a0, const rc_attn_impl *im, int nt)
{
    rc_attn call = *a0;
    const rc_attn *a = &call;
    call.vbad = a0->causal ? malloc((size_t)a0->nb * sizeof(int64_t)) : NULL;
    const int64_t nqb = (a->L + im->bq - 1) / im->bq;
    const int nthr = nt == 1 ? 1 : rc_threads(nt);
    const int per_head = nthr == 1 || a->nb >= 4 * (int64_t)nthr;
    const size_t hb = (im->head_bytes + 63) / 64 * 64, sb = (im->scratch_bytes + 63) / 64 * 64;
    const size_t fit = RC_ATTN_PACK_BUDGET / hb;
    const int64_t group = per_head ? 1 : rc_min64(a->nb, fit > 0 ? (int64_t)fit : 1);
    char *shared = per_head ? NULL : rc_attn_alloc((size_t)group * hb);
    /* a failure leaves every thread without scratch: no task runs */
    int failed = (!per_head && shared == NULL) || (a->causal && !call.vbad);
#pragma omp parallel num_threads(nthr) if (nthr != 1)
    {
        char *buf = failed ? NULL : rc_attn_alloc(sb + (per_head ? hb : 0));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        if (buf && im->enter)
            im->enter();
        if (per_head) {
            char *own = buf + sb;
#pragma omp for schedule(dynamic, 1)
            for (int64_t b = 0; b < a->nb; b++) {
                if (!buf)
                    continue;
                rc_attn_pack_head(a, im, b, own);
                for (int64_t qb = 0; qb < nqb; qb++)
                    im->task(a, b, qb * im->bq, own, buf);
            }
        }
        for (int64_t g0 = 0; g0 < a->nb && shared; g0 += group) {
            const int64_t gn = rc_min64(group, a->nb - g0);
#pragma omp for schedule(dynamic, 1)
            for (int64_t h = 0; h < gn; h++)
                rc_attn_pack_head(a, im, g0 + h, shared + h * hb);
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < gn * nqb; t++) {
                const int64_t h = t / nqb, qb = nqb - 1 - t % nqb; /* causal: big tasks first */
                if (buf)
                    im->task(a, g0 + h, qb * im->bq, shared + h * hb, buf);
            }
        }
        if (buf && im->leave)
            im->leave();
        free(buf);
    }
    free(shared);
    free(call.vbad);
    return failed ? -1 : 0;
}

#endif
