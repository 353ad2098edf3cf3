/* Attention for a few query rows (LLM decode: one new token against a KV cache), shared by the
 * AVX-512 and AMX attention kernels for calls with few query rows (each level's DECODE_L).
 *
 * The flash kernels pack each head's keys (transposed) and values before using them; with one
 * query row that packing costs more than the attention itself (every key is read once either
 * way). Here the keys and values are read in place, like a GEMV: per query row, scores of 16 keys
 * at a time (16 dot products over E, 16 accumulators reduced by one transpose-and-add tree), the
 * row's scores in a scratch buffer, masked by rc_attn_mask_row per block of 64 keys, a two-pass
 * softmax (max, then 2^(s - max) and its sum), then P V as broadcast-FMA over the value rows.
 * bf16: scores by vdpbf16ps where the level has it (bf16 products are exact in fp32), else and
 * for the values each 32-element load split into its even and odd elements as fp32 lanes.
 * A task is (head, query row, key split): with fewer rows than 2 per thread (one sequence, few
 * heads) the keys are split into ranges of multiples of RC_ATTN_BS keys, each range's partial
 * (max, sum, unnormalised output) combined after the parallel loop (flash-decoding), so no core
 * idles on a long cache.
 */
#ifndef RC_ATTN_DECODE_H
#define RC_ATTN_DECODE_H

#include "rc_attn_avx512.h"
#include "rc_transpose.h"

#define RC_ATTN_SPLIT_MIN 256 /* keys per split at least (each costs a partial and a merge) */

/* Lane t = the sum of the lanes of s[t]: a 16 x 16 transpose-and-add in 15 steps. */
static inline __m512 rc_attn_sum16(__m512 s[16])
{
    __m512 h[8], q[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: x, y, x, y partials of s[2i], s[2i+1] */
        h[i] = _mm512_add_ps(_mm512_unpacklo_ps(s[2 * i], s[2 * i + 1]),
                             _mm512_unpackhi_ps(s[2 * i], s[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: partials of s[4i .. 4i + 3] */
        const __m512d a = _mm512_castps_pd(h[2 * i]), b = _mm512_castps_pd(h[2 * i + 1]);
        q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], 0x88),
                                   _mm512_shuffle_f32x4(q[0], q[1], 0xdd));
    const __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], 0x88),
                                   _mm512_shuffle_f32x4(q[2], q[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w, z, 0x88), _mm512_shuffle_f32x4(w, z, 0xdd));
}

/* The query row as the score loops read it: fp32 pre-scaled by scale2 (float32 data), or the
 * raw bf16 bits zero padded to a multiple of 32 (bfloat16 data: the scale goes on the scores). */
static inline void rc_attn_dec_query(const rc_attn *a, int64_t b, int64_t i, float *q,
                                     const int bf16)
{
    const int64_t oq = a->offs[b] + i * a->st[0], qf = a->st[1], E = a->E;
    if (!bf16) {
        for (int64_t d = 0; d < E; d++)
            q[d] = ((const float *)a->q)[oq + d * qf] * a->scale2;
        return;
    }
    uint16_t *qb = (uint16_t *)q;
    for (int64_t d = 0; d < rc_round_up(E, 32); d++)
        qb[d] = d < E ? ((const uint16_t *)a->q)[oq + d * qf] : 0;
}

/* bf16 pairs of a 32-element load as two fp32 vectors: the even and the odd elements */
static inline __m512 rc_bf16_even(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static inline __m512 rc_bf16_odd(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* Scores (log2 domain) of query q (as rc_attn_dec_query) against 16 contiguous key rows from
 * element k0, rows ks apart. bf16: vdpbf16ps where the level has it (products of bf16 values
 * are exact in fp32), else each 32-element load split into even and odd fp32 lanes (two
 * integer ops instead of two widening loads). */
static inline __attribute__((always_inline)) __m512 rc_attn_dec_scores16(const rc_attn *a,
                                                                         const float *q,
                                                                         int64_t k0, int64_t ks,
                                                                         int64_t nk,
                                                                         const int bf16)
{
    const int64_t E = a->E;
    __m512 acc[16];
    for (int t = 0; t < 16; t++)
        acc[t] = _mm512_setzero_ps();
    if (!bf16) {
        for (int64_t d = 0; d < E; d += 16) {
            const __mmask16 mk = rc_tail16(E - d);
            const __m512 qv = _mm512_maskz_loadu_ps(mk, q + d);
            const float *kp = (const float *)a->k + k0 + d;
            for (int t = 0; t < 16; t++)
                if (t < nk) /* keys past nk: not read, their lanes 0 */
                    acc[t] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(mk, kp + t * ks), acc[t]);
        }
        return rc_attn_sum16(acc);
    }
    const uint16_t *qb = (const uint16_t *)q;
    for (int64_t d = 0; d < E; d += 32) {
        const __mmask32 mk = rc_tail32(E - d);
        const __m512i qv = _mm512_loadu_si512(qb + d);
        const uint16_t *kp = (const uint16_t *)a->k + k0 + d;
#ifdef __AVX512BF16__
        for (int t = 0; t < 16; t++)
            if (t < nk)
                acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)qv,
                                          (__m512bh)_mm512_maskz_loadu_epi16(mk, kp + t * ks));
#else
        const __m512 qe = rc_bf16_even(qv), qo = rc_bf16_odd(qv);
        for (int t = 0; t < 16; t++) {
            if (t >= nk)
                continue;
            const __m512i kv = _mm512_maskz_loadu_epi16(mk, kp + t * ks);
            acc[t] = _mm512_fmadd_ps(qo, rc_bf16_odd(kv),
                                     _mm512_fmadd_ps(qe, rc_bf16_even(kv), acc[t]));
        }
#endif
    }
    return _mm512_mul_ps(rc_attn_sum16(acc), _mm512_set1_ps(a->scale2));
}

/* Scores of keys [j0, j0 + n) of batch b, n <= 16, into s[0, n). A tail of n < 16 keys is
 * summed in the order of the 16-key blocks: equal keys must get equal scores (a scalar tail sum
 * differed by an ulp, times a scale of 1e20 a different softmax; found by refcore.fuzz on the
 * AVX2 kernel, which had the same split). */
static inline __attribute__((always_inline)) void rc_attn_dec_scores(const rc_attn *a, int64_t b,
                                                                     const float *q, int64_t j0,
                                                                     int64_t n, float *s,
                                                                     const int bf16)
{
    const int64_t ok = a->offs[a->nb + b] + j0 * a->st[2], ks = a->st[2], kf = a->st[3];
    if (kf == 1) {
        if (n == 16) {
            _mm512_storeu_ps(s, rc_attn_dec_scores16(a, q, ok, ks, 16, bf16));
        } else {
            _mm512_mask_storeu_ps(s, rc_tail16(n), rc_attn_dec_scores16(a, q, ok, ks, n, bf16));
        }
        return;
    }
    for (int64_t t = 0; t < n; t++) { /* strided features: one key at a time, every key alike */
        float sum = 0.0f;
        for (int64_t d = 0; d < a->E; d++) {
            const float qd = bf16 ? rc_ld(q, d, 1) * a->scale2 : q[d];
            sum += qd * rc_ld(a->k, ok + t * ks + d * kf, bf16);
        }
        s[t] = sum;
    }
}

/* o[0, 16 NV) = sum over keys j < n of p[j] * value row j (fp32, contiguous, from element v0,
 * rows vs apart): two keys in flight. */
static inline __attribute__((always_inline)) void rc_attn_dec_pv_f32(const float *v, int64_t vs,
                                                                     const float *p, int64_t n,
                                                                     int64_t cols, float *o,
                                                                     const int NV)
{
    __m512 acc[2][4];
    __mmask16 mk[4];
    for (int c = 0; c < NV; c++) {
        mk[c] = rc_lanes(cols - 16 * c);
        acc[0][c] = acc[1][c] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 2 <= n; j += 2, v += 2 * vs)
        for (int u = 0; u < 2; u++) {
            const __m512 pj = _mm512_set1_ps(p[j + u]);
            for (int c = 0; c < NV; c++)
                acc[u][c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mk[c], v + u * vs + 16 * c),
                                            acc[u][c]);
        }
    if (j < n) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        for (int c = 0; c < NV; c++)
            acc[0][c] = _mm512_fmadd_ps(pj, _mm512_maskz_loadu_ps(mk[c], v + 16 * c), acc[0][c]);
    }
    for (int c = 0; c < NV; c++)
        _mm512_storeu_ps(o + 16 * c, _mm512_add_ps(acc[0][c], acc[1][c]));
}

/* As rc_attn_dec_pv_f32 for bf16 values, 32 NV columns: each 32-element load split into even
 * and odd fp32 lanes, accumulated apart and interleaved back at the end. */
static inline __attribute__((always_inline)) void rc_attn_dec_pv_bf16(const uint16_t *v,
                                                                      int64_t vs, const float *p,
                                                                      int64_t n, int64_t cols,
                                                                      float *o, const int NV)
{
    __m512 ev[2][2], od[2][2];
    __mmask32 mk[2];
    for (int c = 0; c < NV; c++) {
        mk[c] = rc_tail32(cols - 32 * c);
        ev[0][c] = ev[1][c] = od[0][c] = od[1][c] = _mm512_setzero_ps();
    }
    int64_t j = 0;
    for (; j + 2 <= n; j += 2, v += 2 * vs)
        for (int u = 0; u < 2; u++) {
            const __m512 pj = _mm512_set1_ps(p[j + u]);
            for (int c = 0; c < NV; c++) {
                const __m512i x = _mm512_maskz_loadu_epi16(mk[c], v + u * vs + 32 * c);
                ev[u][c] = _mm512_fmadd_ps(pj, rc_bf16_even(x), ev[u][c]);
                od[u][c] = _mm512_fmadd_ps(pj, rc_bf16_odd(x), od[u][c]);
            }
        }
    if (j < n) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        for (int c = 0; c < NV; c++) {
            const __m512i x = _mm512_maskz_loadu_epi16(mk[c], v + 32 * c);
            ev[0][c] = _mm512_fmadd_ps(pj, rc_bf16_even(x), ev[0][c]);
            od[0][c] = _mm512_fmadd_ps(pj, rc_bf16_odd(x), od[0][c]);
        }
    }
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int c = 0; c < NV; c++) {
        const __m512 e = _mm512_add_ps(ev[0][c], ev[1][c]), d = _mm512_add_ps(od[0][c], od[1][c]);
        _mm512_storeu_ps(o + 32 * c, _mm512_permutex2var_ps(e, lo, d));
        _mm512_storeu_ps(o + 32 * c + 16, _mm512_permutex2var_ps(e, hi, d));
    }
}

/* o (ldv fp32) = sum over keys [j0, j0 + n) of p[j - j0] * value row j of batch b. */
static inline __attribute__((always_inline)) void rc_attn_dec_pv(const rc_attn *a, int64_t b,
                                                                 const float *p, int64_t j0,
                                                                 int64_t n, float *o,
                                                                 int64_t ldv, const int bf16)
{
    const int64_t ov = a->offs[2 * a->nb + b] + j0 * a->st[4], vs = a->st[4], vf = a->st[5];
    const int64_t Ev = a->Ev;
    if (vf != 1) {
        memset(o, 0, (size_t)ldv * sizeof(float));
        for (int64_t j = 0; j < n; j++)
            for (int64_t c = 0; c < Ev; c++)
                o[c] += p[j] * rc_ld(a->v, ov + j * vs + c * vf, bf16);
        return;
    }
    for (int64_t c0 = 0; c0 < ldv; c0 += 64) { /* 64 columns at a time (ldv: a multiple) */
        const int64_t cols = Ev - c0;
        if (bf16) {
            const uint16_t *v = (const uint16_t *)a->v + ov + c0;
            if (cols > 32)
                rc_attn_dec_pv_bf16(v, vs, p, n, cols, o + c0, 2);
            else
                rc_attn_dec_pv_bf16(v, vs, p, n, cols, o + c0, 1);
            continue;
        }
        const float *v = (const float *)a->v + ov + c0;
        switch (cols >= 64 ? 4 : (cols + 15) / 16) {
        case 4: rc_attn_dec_pv_f32(v, vs, p, n, cols, o + c0, 4); break;
        case 3: rc_attn_dec_pv_f32(v, vs, p, n, cols, o + c0, 3); break;
        case 2: rc_attn_dec_pv_f32(v, vs, p, n, cols, o + c0, 2); break;
        default: rc_attn_dec_pv_f32(v, vs, p, n, cols, o + c0, 1); break;
        }
    }
}

/* One task: query row i of batch b against keys [ja, jb) (ja a multiple of RC_ATTN_BS).
 * Writes the range's max *m (-inf: nothing attended), sum *l and o = sum of 2^(s - m) v
 * (unnormalised; m taken as 0 when -inf, where p and o are 0). q: E fp32 scratch, s: scores
 * scratch of jb - ja rounded up to RC_ATTN_BS. */
static inline __attribute__((always_inline)) void rc_attn_dec_range(const rc_attn *a, int64_t b,
                                                                    int64_t i, int64_t ja,
                                                                    int64_t jb, float *q, float *s,
                                                                    float *o, int64_t ldv,
                                                                    float *m, float *l,
                                                                    const int bf16)
{
    rc_attn_dec_query(a, b, i, q, bf16);
    jb = rc_min64(jb, rc_attn_key_end(a, i, 1));
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j0 = ja; j0 < jb; j0 += RC_ATTN_BS) {
        float *sb = s + (j0 - ja);
        const int64_t nk = rc_min64(RC_ATTN_BS, jb - j0);
        for (int64_t t = 0; t < nk; t += 16)
            rc_attn_dec_scores(a, b, q, j0 + t, rc_min64(16, nk - t), sb + t, bf16);
        for (int64_t t = nk; t < RC_ATTN_BS; t++)
            sb[t] = -INFINITY; /* past jb (a split's end is a block boundary, or S, or causal) */
        if (a->mask_kind || (a->causal && j0 + RC_ATTN_BS > i + 1) || j0 + RC_ATTN_BS > a->S)
            rc_attn_mask_row(a, b, i, j0, sb);
        for (int c = 0; c < RC_ATTN_BS / 16; c++)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(sb + 16 * c));
    }
    const float top = jb > ja ? _mm512_reduce_max_ps(mx) : -INFINITY;
    const __m512 shift = _mm512_set1_ps(top == -INFINITY ? 0.0f : top);
    __m512 sum = _mm512_setzero_ps();
    const int64_t n = jb > ja ? jb - ja : 0;
    for (int64_t t = 0; t < n; t += 16) {
        const __m512 e = rc_exp2_neg(_mm512_sub_ps(_mm512_loadu_ps(s + t), shift));
        _mm512_storeu_ps(s + t, e); /* lanes past n: -inf scores, 0 probabilities */
        sum = _mm512_add_ps(sum, e);
    }
    *m = top;
    *l = _mm512_reduce_add_ps(sum);
    if (n > 0)
        rc_attn_dec_pv(a, b, s, ja, n, o, ldv, bf16);
    else
        memset(o, 0, (size_t)ldv * sizeof(float));
}

/* Causal: the value rows past row `row`'s diagonal, never read (see rc_attn.h). */
static inline void rc_attn_dec_poison(const rc_attn *a, int64_t row)
{
    const int64_t b = row / a->L, i = row % a->L;
    if (a->causal && i + 1 < a->S)
        rc_attn_poison_row(a, b, row, i + 1, rc_attn_last_bad_v(a, b, i + 1));
}

/* Rows of out from the partials of their key splits (m, l, o as rc_attn_dec_range writes). */
static void rc_attn_dec_merge(const rc_attn *a, int64_t row, int64_t nsplit, const float *part,
                              int64_t stride, int64_t ldv)
{
    float top = -INFINITY, l = 0.0f;
    for (int64_t s = 0; s < nsplit; s++)
        top = part[s * stride] > top ? part[s * stride] : top;
    __m512 acc[4];
    for (int64_t c0 = 0; c0 < a->Ev; c0 += 64) {
        for (int c = 0; c < 4; c++)
            acc[c] = _mm512_setzero_ps();
        l = 0.0f;
        for (int64_t s = 0; s < nsplit; s++) {
            const float *p = part + s * stride;
            /* attended nothing: l is 0, o is 0 or NaN (0 * a non-finite value), kept */
            const float w = p[0] == -INFINITY ? 0.0f : exp2f(p[0] - top);
            l += w * p[1];
            for (int c = 0; c < 4 && c0 + 16 * c < ldv; c++)
                acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(p + 2 + c0 + 16 * c),
                                         acc[c]);
        }
        const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
        for (int c = 0; c < 4 && c0 + 16 * c < a->Ev; c++)
            rc_store_m(a->out, rc_attn_out_row(a, row) + c0 + 16 * c, rc_lanes(a->Ev - c0 - 16 * c),
                       _mm512_mul_ps(acc[c], inv), a->bf16);
    }
    rc_attn_dec_poison(a, row);
}

static inline __attribute__((always_inline)) void rc_attn_dec_task(const rc_attn *a, int64_t t,
                                                                   int64_t nsplit, int64_t chunk,
                                                                   float *buf, float *part,
                                                                   int64_t stride, int64_t ldv,
                                                                   const int bf16)
{
    const int64_t sp = t % nsplit, row = t / nsplit, b = row / a->L, i = row % a->L;
    const int64_t ja = sp * chunk, jb = rc_min64(a->S, ja + chunk);
    float *q = buf, *s = q + rc_round_up(a->E, 16);
    if (nsplit > 1) {
        float *p = part + t * stride;
        rc_attn_dec_range(a, b, i, ja, jb, q, s, p + 2, ldv, &p[0], &p[1], bf16);
        return;
    }
    float *o = s + chunk, m, l;
    rc_attn_dec_range(a, b, i, ja, jb, q, s, o, ldv, &m, &l, bf16);
    const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
    for (int64_t c = 0; c < a->Ev; c += 16)
        rc_store_m(a->out, rc_attn_out_row(a, row) + c, rc_tail16(a->Ev - c),
                   _mm512_mul_ps(_mm512_loadu_ps(o + c), inv), a->bf16);
    rc_attn_dec_poison(a, row);
}

/* The decode path (each query row on its own: cost grows with L). Returns -1 when scratch memory ran
 * out. */
static int rc_attn_decode(const rc_attn *a, int nt)
{
    const int nthr = nt == 1 ? 1 : rc_threads(nt);
    const int64_t rows = a->nb * a->L, ldv = rc_round_up(a->Ev, 64);
    int64_t nsplit = 1;
    if (nthr > 1 && rows < 2 * nthr) {
        const int64_t want = (2 * nthr + rows - 1) / rows, most = a->S / RC_ATTN_SPLIT_MIN;
        nsplit = want < most ? want : most;
        nsplit = nsplit > 1 ? nsplit : 1;
    }
    const int64_t chunk = rc_round_up((a->S + nsplit - 1) / nsplit, RC_ATTN_BS);
    nsplit = (a->S + chunk - 1) / chunk;
    const int64_t stride = 2 + ldv, tasks = rows * nsplit;
    float *part = nsplit > 1 ? rc_attn_alloc((size_t)(tasks * stride) * sizeof(float)) : NULL;
    const size_t sb = (size_t)(rc_round_up(a->E, 16) + chunk + ldv) * sizeof(float);
    int failed = nsplit > 1 && part == NULL;
    const int par = nthr != 1 && tasks > 1;
#pragma omp parallel num_threads(nthr) if (par)
    {
        float *buf = failed ? NULL : rc_attn_alloc(sb);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!buf)
                continue;
            if (a->bf16)
                rc_attn_dec_task(a, t, nsplit, chunk, buf, part, stride, ldv, 1);
            else
                rc_attn_dec_task(a, t, nsplit, chunk, buf, part, stride, ldv, 0);
        }
        free(buf);
    }
    if (nsplit > 1 && !failed)
        for (int64_t r = 0; r < rows; r++)
            rc_attn_dec_merge(a, r, nsplit, part + r * nsplit * stride, stride, ldv);
    free(part);
    return failed ? -1 : 0;
}

#endif
