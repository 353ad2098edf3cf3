/* Shared by the AVX-512 and AMX attention kernels (with rc_attn.h): the masks, the online
 * softmax of one row of a key block, 2^x. Scores live in the log2 domain (query pre-scaled, or
 * scores scaled, by scale * log2(e)), so each probability is one 2^x.
 *
 * Online softmax (flash attention): per query row a running max m and sum l; a key block with a
 * larger max (by RC_ATTN_SLACK) rescales l and the output so far by alpha = 2^(m_old - m_new). A row
 * that has seen only -inf keeps m = -inf and uses 0 as its shift, so its p and l stay 0 and the
 * row ends as 0 (the reference's "nothing to attend").
 */
#ifndef RC_ATTN_AVX512_H
#define RC_ATTN_AVX512_H

#include "rc_attn.h"
#include "rc_avx512.h"

/* lanes [0, n) for any n (n <= 0: none) */
static inline __mmask16 rc_lanes(int64_t n)
{
    return n <= 0 ? (__mmask16)0 : rc_tail16(n);
}

/* 2^x for x <= 8 (scores minus a running max, see RC_ATTN_SLACK), -inf or NaN: n = round(x),
 * r = x - n in [-0.5, 0.5], p = the degree-7 Taylor polynomial of e^(r ln 2) (relative error
 * < 1e-8, below fp32's ulp), times 2^n. Below 2^-64 the result is 0 (also for -inf): far below
 * fp32 resolution against the row's largest term (>= 2^-8), and it keeps tiny and denormal
 * values (microcode assists in every later multiply, measured 2x on causal calls) out of
 * P and P V. NaN stays NaN (the clamp returns its second operand, the compare is ordered). */
static inline __m512 rc_exp2_neg(__m512 x)
{
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-64.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_set1_ps(-64.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.5403530393381608e-04f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618129107628477e-03f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550410866482158e-02f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402265069591007e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931471805599453e-01f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(live, p, n);
}

/* Mask the scores s[0, 64) of query row i against keys j0 + [0, 64) of batch b, in place: keys
 * past S, above the diagonal (causal) or masked off (bool) become -inf; a float mask is added
 * (times log2(e)). Only reads the mask for rows i < L. */
static inline void rc_attn_mask_row(const rc_attn *a, int64_t b, int64_t i, int64_t j0, float *s)
{
    int64_t lim = a->S - j0;
    if (a->causal && i + 1 - j0 < lim)
        lim = i + 1 - j0;
    const int64_t *st = a->st;
    const int64_t om = a->mask_kind && i < a->L ? a->offs[3 * a->nb + b] + i * st[6] : 0;
    for (int c = 0; c < RC_ATTN_BS / 16; c++) {
        const int64_t j = j0 + 16 * c;
        __mmask16 keep = rc_lanes(lim - 16 * c);
        __m512 v = _mm512_loadu_ps(s + 16 * c);
        if (a->mask_kind && i < a->L && keep) {
            if (a->mask_kind == 1 && st[7] == 1) {
                __m128i by = _mm_maskz_loadu_epi8(keep, (const uint8_t *)a->mask + om + j);
                keep &= _mm_test_epi8_mask(by, by);
            } else if (a->mask_kind == 1) {
                for (int t = 0; t < 16; t++)
                    if ((keep >> t & 1) && !((const uint8_t *)a->mask)[om + (j + t) * st[7]])
                        keep &= (__mmask16) ~(1u << t);
            } else {
                __m512 mv;
                if (st[7] == 1) {
                    mv = rc_load_m(a->mask, om + j, keep, a->bf16);
                } else {
                    float tmp[16] = {0};
                    for (int t = 0; t < 16; t++)
                        if (keep >> t & 1)
                            tmp[t] = rc_ld(a->mask, om + (j + t) * st[7], a->bf16);
                    mv = _mm512_loadu_ps(tmp);
                }
                v = _mm512_fmadd_ps(mv, _mm512_set1_ps(RC_LOG2E), v);
            }
        }
        _mm512_storeu_ps(s + 16 * c, _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), keep, v));
    }
}

/* max of the 16 lanes, in every lane */
static inline __m512 rc_hmax(__m512 v)
{
    v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
    v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));
    v = _mm512_max_ps(v, _mm512_permute_ps(v, 0x4e));
    return _mm512_max_ps(v, _mm512_permute_ps(v, 0xb1));
}

/* The online softmax's bookkeeping for 4 rows of scores s[r][0..4) (64 keys, log2 domain,
 * masked): the running maxima m (4) move (see RC_ATTN_SLACK); shift (4) is what to subtract
 * (0 for a row that has seen only -inf), alpha (4) each row's factor for what it accumulated. */
static inline __attribute__((always_inline)) void rc_attn_shift4(__m512 s[4][4], float *m,
                                                                float *shift, float *alpha)
{
    float diff[16] = {0};
    for (int r = 0; r < 4; r++) {
        __m512 mx = _mm512_max_ps(_mm512_max_ps(s[r][0], s[r][1]), _mm512_max_ps(s[r][2], s[r][3]));
        float mnew = m[r];
        /* the horizontal max only when some lane passes m + slack (m = -inf: any finite lane) */
        if (_mm512_cmp_ps_mask(mx, _mm512_set1_ps(m[r] + RC_ATTN_SLACK), _CMP_GT_OQ)) {
            const float bm = _mm512_cvtss_f32(rc_hmax(mx));
            mnew = bm > m[r] + RC_ATTN_SLACK ? bm : m[r];
        }
        shift[r] = mnew == -INFINITY ? 0.0f : mnew;
        diff[r] = m[r] - shift[r]; /* m = -inf: alpha = 0 */
        m[r] = mnew;
    }
    _mm_storeu_ps(alpha, _mm512_castps512_ps128(rc_exp2_neg(_mm512_loadu_ps(diff))));
}

/* Online softmax step for 4 rows whose scores (log2 domain, masked) are s[r][0..4) (64 keys):
 * p = 2^(s - shift) stored to p (rows 64 apart), lv (4 x 16) per-lane running sums (summed
 * once at the end), m and alpha as in rc_attn_shift4. */
static inline __attribute__((always_inline)) void rc_attn_softmax4(__m512 s[4][4], float *p,
                                                                  float *m, float *lv,
                                                                  float *alpha)
{
    float shift[4];
    rc_attn_shift4(s, m, shift, alpha);
    for (int r = 0; r < 4; r++) {
        const __m512 vs = _mm512_set1_ps(shift[r]);
        __m512 sum = _mm512_setzero_ps();
        for (int c = 0; c < 4; c++) {
            const __m512 e = rc_exp2_neg(_mm512_sub_ps(s[r][c], vs));
            _mm512_storeu_ps(p + r * RC_ATTN_BS + 16 * c, e);
            sum = _mm512_add_ps(sum, e);
        }
        _mm512_storeu_ps(lv + 16 * r,
                         _mm512_fmadd_ps(_mm512_loadu_ps(lv + 16 * r), _mm512_set1_ps(alpha[r]), sum));
    }
}

/* Write rows [i0, i0 + n) of batch b: o (n, ldo) fp32 accumulators divided by their sums l
 * (per-lane partial sums lv, 16 per row): 0 when the sum is 0 (nothing attended). */
static inline void rc_attn_store(const rc_attn *a, int64_t b, int64_t i0, int64_t n,
                                 const float *o, int64_t ldo, const float *lv)
{
    for (int64_t r = 0; r < n; r++) {
        const float l = _mm512_reduce_add_ps(_mm512_loadu_ps(lv + 16 * r));
        const __m512 inv = _mm512_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
        const int64_t base = a->offs[4 * a->nb + b] + (i0 + r) * a->st[8];
        for (int64_t c = 0; c < a->Ev; c += 16) {
            __mmask16 mk = rc_tail16(a->Ev - c);
            rc_store_m(a->out, base + c, mk, _mm512_mul_ps(_mm512_loadu_ps(o + r * ldo + c), inv),
                       a->bf16);
        }
    }
    rc_attn_poison_rows(a, b, i0, n); /* causal: NaN / Inf in the value rows never visited */
}

/* Value rows j of batch b as fp32 rows of ldv (>= Ev, zero padded) for j < S, zeros up to rows. */
static inline void rc_attn_pack_v_f32(const rc_attn *a, int64_t b, float *vp, int64_t ldv,
                                      int64_t rows)
{
    const int64_t ov = a->offs[2 * a->nb + b], vs = a->st[4], vf = a->st[5];
    for (int64_t j = 0; j < rows; j++) {
        float *dst = vp + j * ldv;
        if (j >= a->S) {
            memset(dst, 0, (size_t)ldv * sizeof(float));
            continue;
        }
        for (int64_t c = 0; c < ldv; c += 16) {
            if (vf == 1) {
                _mm512_storeu_ps(dst + c, rc_load_m(a->v, ov + j * vs + c, rc_lanes(a->Ev - c), a->bf16));
            } else {
                for (int64_t t = c; t < c + 16; t++)
                    dst[t] = t < a->Ev ? rc_ld(a->v, ov + j * vs + t * vf, a->bf16) : 0.0f;
            }
        }
    }
}

#endif
