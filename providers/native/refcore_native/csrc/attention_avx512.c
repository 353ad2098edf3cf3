/* attention family, AVX-512: flash-attention forward with fp32 compute (float32 and bfloat16).
 *
 * Per head, keys are packed once (transposed, fp32, [S/64][E][64], zero padded) and values
 * ([S][Ev rounded up to 16], fp32) into a buffer shared by the threads; heads are packed in
 * groups so that buffer stays within PACK_BUDGET. Tasks are (head, block of BQ queries), largest
 * causal blocks first, dynamically scheduled. A task keeps its queries (pre-scaled by
 * scale * log2 e, fp32) and its output accumulators in per-thread buffers; for each key block,
 * per group of 4 query rows: scores 4 x 64 by broadcast-FMA in 16 registers, mask, online
 * softmax, then P V by broadcast-FMA into 4 x 64 output registers. Causal tasks stop at their
 * last row's diagonal (key blocks above it are never computed: torch computes and masks them).
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx512
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_attn_avx512.h"

#define BQ 64                     /* queries per task */
#define PACK_BUDGET (8l << 20)    /* bytes of packed keys and values per head group */

typedef struct {
    float *q, *o, *s, *m, *l; /* (BQ, E), (BQ, ldv), (4, 64), (BQ,), (BQ, 16) */
} scratch;

/* keys of batch b transposed into [S_pad / 64][E][64] fp32, zero padded */
static void pack_k(const rc_attn *a, int64_t b, float *kt, int64_t s_pad)
{
    const int64_t ok = a->offs[a->nb + b], ks = a->st[2], kf = a->st[3], E = a->E;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32(RC_ATTN_BS));
    for (int64_t j = 0; j < s_pad; j++) {
        float *dst = kt + (j / RC_ATTN_BS) * E * RC_ATTN_BS + j % RC_ATTN_BS;
        if (kf == 1 && j < a->S) { /* a contiguous key row: 16 features per load and scatter */
            for (int64_t d = 0; d < E; d += 16) {
                const __mmask16 mk = rc_tail16(E - d);
                _mm512_mask_i32scatter_ps(dst + d * RC_ATTN_BS, mk, idx,
                                          rc_load_m(a->k, ok + j * ks + d, mk, a->bf16), 4);
            }
            continue;
        }
        for (int64_t d = 0; d < E; d++)
            dst[d * RC_ATTN_BS] = j < a->S ? rc_ld(a->k, ok + j * ks + d * kf, a->bf16) : 0.0f;
    }
}

/* rows [i0, i0 + nq) of the query, times scale2, into q (rows E apart), zero rows up to n */
static void load_q(const rc_attn *a, int64_t b, int64_t i0, int64_t nq, int64_t n, float *q)
{
    const int64_t oq = a->offs[b], qs = a->st[0], qf = a->st[1], E = a->E;
    const __m512 sc = _mm512_set1_ps(a->scale2);
    for (int64_t r = 0; r < n; r++) {
        float *dst = q + r * E;
        if (r >= nq) {
            memset(dst, 0, (size_t)E * sizeof(float));
        } else if (qf == 1) {
            for (int64_t d = 0; d < E; d += 16) {
                const __mmask16 mk = rc_tail16(E - d);
                __m512 v = rc_load_m(a->q, oq + (i0 + r) * qs + d, mk, a->bf16);
                _mm512_mask_storeu_ps(dst + d, mk, _mm512_mul_ps(v, sc));
            }
        } else {
            for (int64_t d = 0; d < E; d++)
                dst[d] = rc_ld(a->q, oq + (i0 + r) * qs + d * qf, a->bf16) * a->scale2;
        }
    }
}

/* Scores of 4 query rows (q: 4 x E, pre-scaled) against 64 keys (kt: E x 64) by broadcast-FMA
 * in 16 registers; masked when needed (through p), then the online softmax step: p (4 x 64)
 * holds the probabilities, m, lv, alpha as in rc_attn_softmax4. */
static inline void qk_softmax_4x64(const rc_attn *a, int64_t b, int64_t i, int64_t j0,
                                   int masked, const float *q, const float *kt, float *p,
                                   float *m, float *lv, float *alpha)
{
    const int64_t E = a->E;
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int64_t d = 0; d < E; d++) {
        __m512 kv[4];
        for (int c = 0; c < 4; c++)
            kv[c] = _mm512_loadu_ps(kt + d * RC_ATTN_BS + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512 qv = _mm512_set1_ps(q[r * E + d]);
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    if (masked) {
        for (int r = 0; r < 4; r++) {
            for (int c = 0; c < 4; c++)
                _mm512_storeu_ps(p + r * RC_ATTN_BS + 16 * c, acc[r][c]);
            rc_attn_mask_row(a, b, i + r, j0, p + r * RC_ATTN_BS);
            for (int c = 0; c < 4; c++)
                acc[r][c] = _mm512_loadu_ps(p + r * RC_ATTN_BS + 16 * c);
        }
    }
    rc_attn_softmax4(acc, p, m, lv, alpha);
}

/* o (4, 16 * NV) = o * alpha + p (4, jn) . v (jn, 16 * NV), v rows ldv apart */
static inline __attribute__((always_inline)) void pv_4xn(const float *p, int64_t jn,
                                                         const float *v, int64_t ldv, float *o,
                                                         int64_t ldo, const float *alpha,
                                                         const int NV)
{
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + 16 * c),
                                      _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < jn; j++) {
        __m512 vv[4];
        for (int c = 0; c < NV; c++)
            vv[c] = _mm512_loadu_ps(v + j * ldv + 16 * c);
        for (int r = 0; r < 4; r++) {
            const __m512 pv = _mm512_set1_ps(p[r * RC_ATTN_BS + j]);
            for (int c = 0; c < NV; c++)
                acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            _mm512_storeu_ps(o + r * ldo + 16 * c, acc[r][c]);
}

static void pv_4(const float *p, int64_t jn, const float *v, int64_t ldv, float *o,
                 const float *alpha)
{
    for (int64_t c0 = 0; c0 < ldv; c0 += 64) {
        switch ((ldv - c0) >= 64 ? 4 : (ldv - c0) / 16) {
        case 4: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 4); break;
        case 3: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 3); break;
        case 2: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 2); break;
        default: pv_4xn(p, jn, v + c0, ldv, o + c0, ldv, alpha, 1); break;
        }
    }
}

static void task(const rc_attn *a, int64_t b, int64_t i0, const float *kt, const float *vp,
                 int64_t ldv, const scratch *w)
{
    const int64_t E = a->E, nq = rc_min64(BQ, a->L - i0), ng = (nq + 3) / 4;
    load_q(a, b, i0, nq, 4 * ng, w->q);
    memset(w->o, 0, (size_t)(4 * ng * ldv) * sizeof(float));
    for (int64_t r = 0; r < 4 * ng; r++)
        w->m[r] = -INFINITY;
    memset(w->l, 0, (size_t)(64 * ng) * sizeof(float));
    const int64_t kend = rc_attn_key_end(a, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += RC_ATTN_BS) {
        const float *ktb = kt + j0 * E, *vb = vp + j0 * ldv;
        for (int64_t g = 0; g < ng; g++) {
            const int64_t r0 = 4 * g, rows = rc_min64(4, nq - r0);
            const int64_t jn = rc_min64(RC_ATTN_BS, rc_attn_key_end(a, i0 + r0, rows) - j0);
            if (jn <= 0)
                continue; /* causal: this group's keys end before j0 */
            float alpha[4];
            /* masks needed: a mask, keys past S, or a causal diagonal (row i0 + r0 sees fewest) */
            const int masked = a->mask_kind || j0 + RC_ATTN_BS > a->S ||
                               (a->causal && i0 + r0 + 1 < j0 + RC_ATTN_BS);
            qk_softmax_4x64(a, b, i0 + r0, j0, masked, w->q + r0 * E, ktb, w->s, w->m + r0,
                            w->l + 16 * r0, alpha);
            pv_4(w->s, jn, vb, ldv, w->o + r0 * ldv, alpha);
        }
    }
    rc_attn_store(a, b, i0, nq, w->o, ldv, w->l);
}

static float *alloc_scratch(const rc_attn *a, int64_t ldv, int64_t extra, scratch *w)
{
    float *buf = malloc((size_t)(BQ * (a->E + ldv) + 4 * RC_ATTN_BS + 17 * BQ + extra) *
                        sizeof(float));
    if (buf) {
        w->q = buf;
        w->o = w->q + BQ * a->E;
        w->s = w->o + BQ * ldv;
        w->m = w->s + 4 * RC_ATTN_BS;
        w->l = w->m + BQ;
    }
    return buf;
}

/* Many heads: one task per head (packs its keys and values into the thread's own buffer, then
 * runs its query blocks). One work-sharing loop, no barrier but the last: on a shared machine a
 * descheduled thread then delays nobody until the end. */
static int sdpa_heads(const rc_attn *a, int nt, int64_t s_pad, int64_t ldv, int64_t head)
{
    const int64_t nqb = (a->L + BQ - 1) / BQ;
    int failed = 0;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        scratch w = {0};
        float *buf = alloc_scratch(a, ldv, head, &w);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        float *pk = buf ? w.l + 16 * BQ : NULL;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < a->nb; b++) {
            if (!buf)
                continue;
            pack_k(a, b, pk, s_pad);
            rc_attn_pack_v_f32(a, b, pk + s_pad * a->E, ldv, s_pad);
            for (int64_t qb = 0; qb < nqb; qb++)
                task(a, b, qb * BQ, pk, pk + s_pad * a->E, ldv, &w);
        }
        free(buf);
    }
    return failed ? -1 : 0;
}

/* Few heads: heads packed (in groups within PACK_BUDGET) into a buffer shared by the threads,
 * then tasks (head, query block), largest causal blocks first. */
static int sdpa_blocks(const rc_attn *a, int nt, int64_t s_pad, int64_t ldv, int64_t head)
{
    const int64_t nqb = (a->L + BQ - 1) / BQ;
    const int64_t fit = PACK_BUDGET / (4 * head);
    const int64_t group = rc_min64(a->nb, fit > 0 ? fit : 1);
    float *pack = malloc((size_t)(group * head) * sizeof(float));
    int failed = pack == NULL;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        scratch w = {0};
        float *buf = alloc_scratch(a, ldv, 0, &w);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t g0 = 0; g0 < a->nb && pack; g0 += group) {
            const int64_t gn = rc_min64(group, a->nb - g0);
#pragma omp for schedule(dynamic, 1)
            for (int64_t h = 0; h < gn; h++) {
                pack_k(a, g0 + h, pack + h * head, s_pad);
                rc_attn_pack_v_f32(a, g0 + h, pack + h * head + s_pad * a->E, ldv, s_pad);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < gn * nqb; t++) {
                const int64_t h = t / nqb, qb = nqb - 1 - t % nqb; /* causal: big tasks first */
                if (buf)
                    task(a, g0 + h, qb * BQ, pack + h * head, pack + h * head + s_pad * a->E, ldv,
                         &w);
            }
        }
        free(buf);
    }
    free(pack);
    return failed ? -1 : 0;
}

static int sdpa(const rc_attn *a, int nt)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 16);
    const int64_t head = s_pad * (a->E + ldv);
    if (nt == 1 || a->nb >= 4 * (int64_t)rc_threads(nt))
        return sdpa_heads(a, nt, s_pad, ldv, head);
    return sdpa_blocks(a, nt, s_pad, ldv, head);
}

static int run(const void *q, const void *k, const void *v, const void *mask, void *out,
               const void *offs, const void *st, int64_t nb, int64_t L, int64_t S, int64_t E,
               int64_t Ev, int mask_kind, int causal, double scale, int nt, int bf16)
{
    const rc_attn a = {q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, bf16,
                       (float)(scale * 1.4426950408889634)};
    return sdpa(&a, nt);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 1);
}

#ifndef RC_BF16_ONLY /* the avx512_bf16 level changes only the bf16 kernel */
int RC_FN(rc_scaled_dot_product_attention_f32)(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 0);
}
#endif
