/* attention family, AVX2 + FMA: flash-attention forward with fp32 compute (float32 and bfloat16).
 *
 * The AVX-512 kernel's scheme (attention_avx512.c) on 8 lanes. Per head, keys are packed once
 * (transposed, fp32, [S/64][E][64], zero padded, by 8 x 8 register transposes) and values
 * ([S][Ev rounded up to 8], fp32); tasks run blocks of BQ queries (rc_attn_drive). A task keeps
 * its queries (pre-scaled by scale) and output accumulators in per-thread buffers; for
 * each key block of 64 keys, per group of 4 query rows: scores 4 x 16 at a time by broadcast-FMA
 * (8 accumulators), the masks, the online softmax (rc_attn_avx2.h), then P V 4 rows x 16
 * columns at a time. Causal tasks stop at their last row's diagonal (torch computes and masks
 * the blocks above it); NaN / Inf in the skipped values still reach the output (rc_attn.h).
 *
 * Few query rows (L <= DECODE_L, decode): no packing, keys and values read in place. Per row:
 * scores of 8 keys at a time (8 dot products over E, one transpose-and-add), masks per 64 keys,
 * a two-pass softmax, then P V over the value rows.
 */
#ifndef RC_LEVEL
#define RC_LEVEL avx2
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_attn_avx2.h"
#include "rc_attn_exact.h"

#define BQ 64 /* queries per task */
#define DECODE_L 4

/* keys of batch b transposed into [S_pad / 64][E][64] fp32, zero padded */
static void pack_k(const rc_attn *a, int64_t b, float *kt, int64_t s_pad)
{
    const int64_t ok = a->offs[a->nb + b], ks = a->st[2], kf = a->st[3], E = a->E;
    for (int64_t j0 = 0; j0 < s_pad; j0 += 8) {
        float *dst = kt + (j0 / RC_ATTN_BS) * E * RC_ATTN_BS + j0 % RC_ATTN_BS;
        const int64_t nk = rc_min64(8, a->S - j0); /* keys present, <= 0: padding */
        int64_t d = 0;
        if (kf == 1 && nk == 8) /* 8 contiguous key rows: 8 x 8 blocks through registers */
            for (; d + 8 <= E; d += 8) {
                __m256 r[8];
                for (int t = 0; t < 8; t++)
                    r[t] = rc8_load(a->k, ok + (j0 + t) * ks + d, 8, a->bf16);
                rc8_transpose8(r);
                for (int t = 0; t < 8; t++)
                    _mm256_storeu_ps(dst + (d + t) * RC_ATTN_BS, r[t]);
            }
        for (; d < E; d++)
            for (int64_t t = 0; t < 8; t++)
                dst[d * RC_ATTN_BS + t] = t < nk ? rc_ld(a->k, ok + (j0 + t) * ks + d * kf,
                                                         a->bf16)
                                                 : 0.0f;
    }
}

/* value rows of batch b as fp32 rows of ldv (zero padded), zero rows from S up to rows; causal
 * calls: the last row holding a NaN or Inf into a->vbad[b] (rc_attn.h), checked on the loaded
 * vectors (a separate scan of the values measured ~7% of causal L512 D64 calls) */
static void pack_v(const rc_attn *a, int64_t b, float *vp, int64_t ldv, int64_t rows)
{
    const int64_t ov = a->offs[2 * a->nb + b], vs = a->st[4], vf = a->st[5];
    const __m256i ex = _mm256_set1_epi32(0x7f800000);
    int64_t last = -1;
    for (int64_t j = 0; j < rows; j++) {
        float *dst = vp + j * ldv;
        __m256i bad = _mm256_setzero_si256();
        if (j >= a->S) {
            memset(dst, 0, (size_t)ldv * sizeof(float));
        } else if (vf == 1) {
            for (int64_t c = 0; c < ldv; c += 8) {
                const __m256 x = rc8_load(a->v, ov + j * vs + c, a->Ev - c, a->bf16);
                _mm256_storeu_ps(dst + c, x);
                bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(
                                               _mm256_and_si256(_mm256_castps_si256(x), ex), ex));
            }
        } else {
            for (int64_t c = 0; c < ldv; c++) {
                dst[c] = c < a->Ev ? rc_ld(a->v, ov + j * vs + c * vf, a->bf16) : 0.0f;
                if (!isfinite(dst[c]))
                    bad = ex;
            }
        }
        if (!_mm256_testz_si256(bad, bad))
            last = j;
    }
    if (a->vbad)
        a->vbad[b] = last;
}

/* rows [i0, i0 + nq) of the query, times scale2 (= scale here), into q (rows E apart), zero rows up to n */
static void load_q(const rc_attn *a, int64_t b, int64_t i0, int64_t nq, int64_t n, float *q)
{
    const int64_t oq = a->offs[b], qs = a->st[0], qf = a->st[1], E = a->E;
    const __m256 sc = _mm256_set1_ps(a->scale2);
    for (int64_t r = 0; r < n; r++) {
        float *dst = q + r * E;
        int64_t d = 0;
        if (r < nq && qf == 1)
            for (; d + 8 <= E; d += 8)
                _mm256_storeu_ps(dst + d,
                                 _mm256_mul_ps(rc8_load(a->q, oq + (i0 + r) * qs + d, 8, a->bf16),
                                               sc));
        for (; d < E; d++)
            dst[d] = r < nq ? rc_ld(a->q, oq + (i0 + r) * qs + d * qf, a->bf16) * a->scale2 : 0.0f;
    }
}

/* s (4 x 64, rows 64 apart) = q (4 x E, rows E apart) . kt (E x 64) + bias (64 keys, shared
 * by the rows; NULL: none): 16 keys at a time */
static inline void qk_4x64(const float *q, int64_t E, const float *kt, const float *bias,
                           float *s)
{
    for (int c = 0; c < RC_ATTN_BS; c += 16) {
        __m256 acc[4][2];
        for (int r = 0; r < 4; r++)
            acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        const float *kp = kt + c;
        for (int64_t d = 0; d < E; d++, kp += RC_ATTN_BS) {
            const __m256 k0 = _mm256_loadu_ps(kp), k1 = _mm256_loadu_ps(kp + 8);
            for (int r = 0; r < 4; r++) {
                const __m256 qv = _mm256_broadcast_ss(q + r * E + d);
                acc[r][0] = _mm256_fmadd_ps(qv, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qv, k1, acc[r][1]);
            }
        }
        if (bias)
            for (int r = 0; r < 4; r++) {
                acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_loadu_ps(bias + c));
                acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_loadu_ps(bias + c + 8));
            }
        for (int r = 0; r < 4; r++) {
            _mm256_storeu_ps(s + r * RC_ATTN_BS + c, acc[r][0]);
            _mm256_storeu_ps(s + r * RC_ATTN_BS + c + 8, acc[r][1]);
        }
    }
}

/* o (4 rows ldv apart, 8 NV columns) = o * alpha + p (4 x jn, rows 64 apart) . v (jn rows) */
static inline __attribute__((always_inline)) void pv_4xn(const float *p, int64_t jn,
                                                         const float *v, int64_t ldv, float *o,
                                                         const float *alpha, const int NV)
{
    __m256 acc[4][2];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            acc[r][c] = _mm256_mul_ps(_mm256_loadu_ps(o + r * ldv + 8 * c),
                                      _mm256_set1_ps(alpha[r]));
    for (int64_t j = 0; j < jn; j++, v += ldv) {
        __m256 vv[2];
        for (int c = 0; c < NV; c++)
            vv[c] = _mm256_loadu_ps(v + 8 * c);
        for (int r = 0; r < 4; r++) {
            const __m256 pv = _mm256_broadcast_ss(p + r * RC_ATTN_BS + j);
            for (int c = 0; c < NV; c++)
                acc[r][c] = _mm256_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < NV; c++)
            _mm256_storeu_ps(o + r * ldv + 8 * c, acc[r][c]);
}

static void pv_4(const float *p, int64_t jn, const float *v, int64_t ldv, float *o,
                 const float *alpha)
{
    int64_t c0 = 0;
    for (; c0 + 16 <= ldv; c0 += 16)
        pv_4xn(p, jn, v + c0, ldv, o + c0, alpha, 2);
    if (c0 < ldv)
        pv_4xn(p, jn, v + c0, ldv, o + c0, alpha, 1);
}

typedef struct {
    float *q, *o, *s, *m, *l, *bias; /* (BQ, E), (BQ, ldv), (4, 64), (BQ,), (BQ, 8), (64,) */
} scratch;

static void task(const rc_attn *a, int64_t b, int64_t i0, const float *kt, const float *vp,
                 int64_t ldv, const scratch *w)
{
    const int64_t E = a->E, nq = rc_min64(BQ, a->L - i0), ng = (nq + 3) / 4;
    load_q(a, b, i0, nq, 4 * ng, w->q);
    memset(w->o, 0, (size_t)(4 * ng * ldv) * sizeof(float));
    for (int64_t r = 0; r < 4 * ng; r++)
        w->m[r] = -INFINITY;
    memset(w->l, 0, (size_t)(32 * ng) * sizeof(float));
    const int64_t kend = rc_attn_key_end(a, i0, nq);
    for (int64_t j0 = 0; j0 < kend; j0 += RC_ATTN_BS) {
        const float *ktb = kt + j0 * E, *vb = vp + j0 * ldv;
        /* one mask row for every query row (a float mask broadcast over them, or only keys past
         * S): added as a bias to the scores; else (bool, per-row, causal) the masks per row */
        const int shared = (a->mask_kind == 2 && a->st[6] == 0) ||
                           (!a->mask_kind && j0 + RC_ATTN_BS > a->S);
        if (shared) {
            for (int c = 0; c < RC_ATTN_BS; c++)
                w->bias[c] = j0 + c < a->S ? 0.0f : -INFINITY;
            if (a->mask_kind) /* no causal with a mask: row 0's mask is every row's */
                rc8_attn_mask_row(a, b, 0, j0, w->bias);
        }
        for (int64_t g = 0; g < ng; g++) {
            const int64_t r0 = 4 * g, rows = rc_min64(4, nq - r0);
            const int64_t jn = rc_min64(RC_ATTN_BS, rc_attn_key_end(a, i0 + r0, rows) - j0);
            if (jn <= 0)
                continue; /* causal: this group's keys end before j0 */
            float alpha[4];
            /* row masks: a per-row mask, or a causal diagonal (row i0 + r0 sees fewest) */
            const int diag = a->causal && i0 + r0 + 1 < j0 + RC_ATTN_BS;
            qk_4x64(w->q + r0 * E, E, ktb, shared && !diag ? w->bias : NULL, w->s);
            if (diag || (a->mask_kind && !shared))
                for (int r = 0; r < 4; r++)
                    rc8_attn_mask_row(a, b, i0 + r0 + r, j0, w->s + r * RC_ATTN_BS);
            rc8_attn_softmax4(w->s, w->m + r0, w->l + 8 * r0, alpha);
            pv_4(w->s, jn, vb, ldv, w->o + r0 * ldv, alpha);
        }
    }
    for (int64_t r = 0; r < nq; r++)
        rc8_attn_store_row(a, b * a->L + i0 + r, w->o + r * ldv,
                           rc8_hsum(_mm256_loadu_ps(w->l + 8 * r)));
    rc_attn_poison_rows(a, b, i0, nq);
}

static void pack(const rc_attn *a, int64_t b, void *packed)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 8);
    pack_k(a, b, packed, s_pad);
    pack_v(a, b, (float *)packed + s_pad * a->E, ldv, s_pad);
    /* the first query blocks' rows into L2 while the tasks start: rows of a model's (B, L, H, E)
     * layout lie H * E apart (missed loads of the query were ~15% of a MiniLM task) */
    const int64_t es = a->bf16 ? 2 : 4, row = a->E * es;
    if (a->st[1] == 1)
        for (int64_t i = 0; i < rc_min64(a->L, 2 * BQ); i++)
            for (int64_t o = 0; o < row; o += 64)
                _mm_prefetch((const char *)a->q + (a->offs[b] + i * a->st[0]) * es + o,
                             _MM_HINT_T1);
}

static void run_task(const rc_attn *a, int64_t b, int64_t i0, const void *packed, void *buf)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 8);
    scratch w;
    w.q = buf;
    w.o = w.q + BQ * a->E;
    w.s = w.o + BQ * ldv;
    w.m = w.s + 4 * RC_ATTN_BS;
    w.l = w.m + BQ;
    w.bias = w.l + 8 * BQ;
    task(a, b, i0, packed, (const float *)packed + s_pad * a->E, ldv, &w);
}

static int flash(const rc_attn *a, int nt)
{
    const int64_t s_pad = rc_round_up(a->S, RC_ATTN_BS), ldv = rc_round_up(a->Ev, 8);
    const rc_attn_impl im = {
        .bq = BQ,
        .head_bytes = (size_t)(s_pad * (a->E + ldv)) * sizeof(float),
        .scratch_bytes = (size_t)(BQ * (a->E + ldv) + 5 * RC_ATTN_BS + 9 * BQ) * sizeof(float),
        .pack = pack,
        .task = run_task,
        .pack_sets_vbad = 1,
    };
    return rc_attn_drive(a, &im, nt);
}

/* Decode: scores (natural units) of query row q (E fp32, pre-scaled) against keys [j0, j0 + nk)
 * of batch b (nk <= 8, all < S) into s[0, nk): nk dot products, one transpose-and-add. Every key
 * is summed in the same order, the last nk < 8 keys too: equal keys must get equal scores (a
 * scalar sum for the tail keys differed by an ulp, times a scale of 1e20 a different softmax;
 * found by refcore.fuzz with a stride-0 key). */
static inline __attribute__((always_inline)) void dec_scores8(const rc_attn *a, int64_t b,
                                                              const float *q, int64_t j0,
                                                              int64_t nk, float *s,
                                                              const int bf16)
{
    const int64_t ok = a->offs[a->nb + b] + j0 * a->st[2], ks = a->st[2], kf = a->st[3], E = a->E;
    if (kf != 1) {
        for (int t = 0; t < nk; t++) {
            float sum = 0.0f;
            for (int64_t d = 0; d < E; d++)
                sum += q[d] * rc_ld(a->k, ok + t * ks + d * kf, a->bf16);
            s[t] = sum;
        }
        return;
    }
    __m256 acc[8];
    for (int t = 0; t < 8; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t d = 0; d < E; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d); /* q is zero padded to a multiple of 8 */
        for (int t = 0; t < 8; t++)
            if (t < nk) /* a constant 8 in the common call: no test left */
                acc[t] = _mm256_fmadd_ps(qv, rc8_load(a->k, ok + t * ks + d, E - d, bf16), acc[t]);
    }
    float all[8];
    _mm256_storeu_ps(all, rc8_sum8(acc));
    for (int t = 0; t < nk; t++)
        s[t] = all[t];
}

/* o[c0, c0 + 8 NV) = sum over keys j < n of p[j] * value row j of batch b (dense columns,
 * cols of them from c0): two keys in flight */
static inline __attribute__((always_inline)) void dec_pv(const rc_attn *a, int64_t b,
                                                         const float *p, int64_t n, int64_t c0,
                                                         float *o, const int NV, const int bf16)
{
    const int64_t vs = a->st[4], cols = a->Ev - c0;
    const int64_t ov = a->offs[2 * a->nb + b] + c0;
    __m256 acc0[4], acc1[4];
    for (int c = 0; c < NV; c++)
        acc0[c] = acc1[c] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const __m256 p0 = _mm256_broadcast_ss(p + j), p1 = _mm256_broadcast_ss(p + j + 1);
        for (int c = 0; c < NV; c++) {
            acc0[c] = _mm256_fmadd_ps(p0, rc8_load(a->v, ov + j * vs + 8 * c, cols - 8 * c, bf16),
                                      acc0[c]);
            acc1[c] = _mm256_fmadd_ps(p1, rc8_load(a->v, ov + (j + 1) * vs + 8 * c,
                                                   cols - 8 * c, bf16),
                                      acc1[c]);
        }
    }
    if (j < n) {
        const __m256 p0 = _mm256_broadcast_ss(p + j);
        for (int c = 0; c < NV; c++)
            acc0[c] = _mm256_fmadd_ps(p0, rc8_load(a->v, ov + j * vs + 8 * c, cols - 8 * c, bf16),
                                      acc0[c]);
    }
    for (int c = 0; c < NV; c++)
        _mm256_storeu_ps(o + c0 + 8 * c, _mm256_add_ps(acc0[c], acc1[c]));
}

static inline __attribute__((always_inline)) void dec_pv_cols(const rc_attn *a, int64_t b,
                                                              const float *p, int64_t n,
                                                              float *o, const int bf16)
{
    for (int64_t c0 = 0; c0 < a->Ev; c0 += 32) {
        switch (a->Ev - c0 >= 32 ? 4 : (a->Ev - c0 + 7) / 8) {
        case 4: dec_pv(a, b, p, n, c0, o, 4, bf16); break;
        case 3: dec_pv(a, b, p, n, c0, o, 3, bf16); break;
        case 2: dec_pv(a, b, p, n, c0, o, 2, bf16); break;
        default: dec_pv(a, b, p, n, c0, o, 1, bf16); break;
        }
    }
}

/* One decode row (b, i): scratch q (E rounded up to 8), s (S rounded up to 64), o (Ev + 32). */
static inline __attribute__((always_inline)) void dec_row(const rc_attn *a, int64_t b, int64_t i,
                                                          float *q, float *s, float *o,
                                                          const int bf16)
{
    const int64_t E = a->E, oq = a->offs[b] + i * a->st[0], n = rc_attn_key_end(a, i, 1);
    for (int64_t d = 0; d < rc_round_up(E, 8); d++)
        q[d] = d < E ? rc_ld(a->q, oq + d * a->st[1], a->bf16) * a->scale2 : 0.0f;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j0 = 0; j0 < n; j0 += RC_ATTN_BS) {
        float *sb = s + j0;
        for (int64_t t = 0; t < RC_ATTN_BS; t += 8) {
            if (j0 + t + 8 <= n) {
                dec_scores8(a, b, q, j0 + t, 8, sb + t, bf16);
                continue;
            }
            for (int64_t u = t; u < t + 8; u++) /* past n: -inf (masked below) */
                sb[u] = -INFINITY;
            if (j0 + t < n)
                dec_scores8(a, b, q, j0 + t, n - j0 - t, sb + t, bf16);
        }
        if (a->mask_kind || j0 + RC_ATTN_BS > n)
            rc8_attn_mask_row(a, b, i, j0, sb);
        for (int c = 0; c < RC_ATTN_BS; c += 8)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(sb + c));
    }
    const float top = rc8_hmax(mx);
    const __m256 shift = _mm256_set1_ps(top == -INFINITY ? 0.0f : top);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; t += 8) {
        const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(s + t), shift);
        const __m256 e = rc8_exp2_neg(_mm256_mul_ps(d, _mm256_set1_ps(RC_LOG2E)));
        _mm256_storeu_ps(s + t, e); /* lanes past n: -inf scores, 0 probabilities */
        sum = _mm256_add_ps(sum, e);
    }
    if (a->st[5] != 1) { /* strided value columns: one element at a time */
        const int64_t ov = a->offs[2 * a->nb + b];
        for (int64_t c = 0; c < a->Ev; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < n; j++)
                acc += s[j] * rc_ld(a->v, ov + j * a->st[4] + c * a->st[5], a->bf16);
            o[c] = acc;
        }
    } else {
        dec_pv_cols(a, b, s, n, o, bf16);
    }
    rc8_attn_store_row(a, b * a->L + i, o, rc8_hsum(sum));
    if (a->causal && i + 1 < a->S) /* the value rows past the diagonal, never read */
        rc_attn_poison_row(a, b, b * a->L + i, i + 1, rc_attn_last_bad_v(a, b, i + 1));
}

/* The decode path: one task per query row. Returns -1 when scratch memory ran out. */
static int decode(const rc_attn *a, int nt)
{
    const int64_t rows = a->nb * a->L;
    const int nthr = nt == 1 || rows == 1 ? 1 : rc_threads(nt);
    const int64_t eq = rc_round_up(a->E, 8), ns = rc_round_up(a->S, RC_ATTN_BS);
    const size_t sb = (size_t)(eq + ns + a->Ev + 32) * sizeof(float);
    int failed = 0;
#pragma omp parallel num_threads(nthr) if (nthr != 1)
    {
        float *buf = rc_attn_alloc(sb);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < rows; r++)
            if (buf && a->bf16)
                dec_row(a, r / a->L, r % a->L, buf, buf + eq, buf + eq + ns, 1);
            else if (buf)
                dec_row(a, r / a->L, r % a->L, buf, buf + eq, buf + eq + ns, 0);
        free(buf);
    }
    return failed ? -1 : 0;
}

static int run(const void *q, const void *k, const void *v, const void *mask, void *out,
               const void *offs, const void *st, int64_t nb, int64_t L, int64_t S, int64_t E,
               int64_t Ev, int mask_kind, int causal, double scale, int nt, int bf16)
{
    /* Scores stay in natural units until the row max is subtracted (scale2 = scale, not
     * scale * log2(e) as at the AVX-512 levels): scaled first, a finite score or mask value past
     * FLT_MAX / log2(e) ~ 2.4e38 overflowed, -3e38 became -inf (a fully masked row, 0 out) and
     * +-3e38 gave inf - inf = NaN, where the reference and torch give a softmax (found by
     * refcore.fuzz). One multiply per score more. */
    if (!rc_attn_scores_fit(q, k, offs, st, nb, L, S, E, scale, bf16, nt) || /* exact.h */
        !rc_attn_values_fit(v, offs, st, nb, S, Ev, bf16, nt))
        return rc_attn_exact(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal,
                             scale, nt, bf16);
    const rc_attn a = {q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, bf16,
                       (float)scale, NULL};
    if ((L <= DECODE_L ? decode(&a, nt) : flash(&a, nt)) != 0)
        return -1;
    return rc_attn_fix_rows(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale,
                            bf16);
}

int RC_FN(rc_scaled_dot_product_attention_f32)(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 0);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    return run(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 1);
}
