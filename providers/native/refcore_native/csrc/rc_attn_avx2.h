/* AVX2 + FMA vector helpers of the attention kernel (attention_avx2.c): 8-lane fp32 / bf16
 * loads and stores with tails, 2^x, horizontal max and sum, an 8 x 8 transpose, the masks of a
 * row of scores and the online softmax of 4 rows of a key block (see rc_attn.h for the call's
 * description and rc_attn_avx512.h for the same steps on 16 lanes). No AVX-512 instruction.
 *
 * Scores stay in natural units (the query pre-scaled by scale); each probability is one
 * 2^((s - max) log2(e)), the factor applied after the subtraction so that no finite score
 * overflows (the AVX-512 levels scale first, by scale * log2(e)). bf16 is widened to fp32 (a shift, exact) and rounded once, to nearest
 * even, when the output is stored.
 */
#ifndef RC_ATTN_AVX2_H
#define RC_ATTN_AVX2_H

#include <immintrin.h>

#include "rc_attn.h"

/* lanes [0, n) as a maskload / maskstore mask (n <= 0: none, n >= 8: all) */
/* RC_ATTN_SLACK in the natural units the AVX2 scores stay in (see attention_avx2.c's run). */
#define RC8_ATTN_SLACK (RC_ATTN_SLACK / RC_LOG2E)

static inline __m256i rc8_lanes(int64_t n)
{
    const int k = n <= 0 ? 0 : n >= 8 ? 8 : (int)n;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 rc8_widen_bf16(__m128i h)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 elements from element i of p (fp32 or bf16), n of them (n >= 8: all; the rest 0) */
static inline __m256 rc8_load(const void *p, int64_t i, int64_t n, int bf16)
{
    if (!bf16)
        return n >= 8 ? _mm256_loadu_ps((const float *)p + i)
                      : _mm256_maskload_ps((const float *)p + i, rc8_lanes(n));
    if (n >= 8)
        return rc8_widen_bf16(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    uint16_t tmp[8] = {0};
    for (int64_t t = 0; t < n; t++)
        tmp[t] = ((const uint16_t *)p)[i + t];
    return rc8_widen_bf16(_mm_loadu_si128((const __m128i *)tmp));
}

/* fp32 to bf16 bit patterns, round to nearest even, NaN kept a (quiet) NaN (rc_f32_to_bf16) */
static inline __m128i rc8_narrow_bf16(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                                   odd),
                                  16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qn, nan);
    const __m256i packed = _mm256_packus_epi32(r, r); /* 16-bit values in lanes 0-3, 8-11 */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0xd8));
}

/* 8 elements (n of them, n >= 8: all) to element i of p, fp32 or bf16 */
static inline void rc8_store(void *p, int64_t i, int64_t n, __m256 v, int bf16)
{
    if (!bf16) {
        if (n >= 8)
            _mm256_storeu_ps((float *)p + i, v);
        else
            _mm256_maskstore_ps((float *)p + i, rc8_lanes(n), v);
        return;
    }
    const __m128i h = rc8_narrow_bf16(v);
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
        return;
    }
    uint16_t tmp[8];
    _mm_storeu_si128((__m128i *)tmp, h);
    for (int64_t t = 0; t < n; t++)
        ((uint16_t *)p)[i + t] = tmp[t];
}

/* 2^x for x <= 8, -inf or NaN (rc_exp2_neg of rc_attn_avx512.h on 8 lanes): n = round(x),
 * r = x - n, a degree-6 polynomial for 2^r on [-0.5, 0.5] (least squares on relative error,
 * measured max relative error 9.7e-8 evaluated in fp32, as the degree-7 Taylor one) times 2^n
 * built in the exponent bits. Below 2^-64 the result is 0 (also for -inf), which keeps
 * denormals out of P and P V; NaN stays NaN (max returns its second operand, the compare is
 * unordered, and a NaN's 2^n is a finite factor). */
static inline __m256 rc8_exp2_neg(__m256 x)
{
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-64.0f), _CMP_NLT_UQ);
    x = _mm256_max_ps(_mm256_set1_ps(-64.0f), x);
    const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.5337576830689627e-04f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3399860363040444e-03f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.618519534356787e-03f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.550328997517891e-02f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.402264660871395e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.931472056005105e-01f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0000000005920204f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                         _mm256_set1_epi32(127)),
                                        23);
    return _mm256_and_ps(live, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline float rc8_hmax(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float rc8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane t = the sum of the lanes of s[t]: an 8 x 8 transpose-and-add. */
static inline __m256 rc8_sum8(const __m256 s[8])
{
    const __m256 a = _mm256_hadd_ps(s[0], s[1]), b = _mm256_hadd_ps(s[2], s[3]);
    const __m256 c = _mm256_hadd_ps(s[4], s[5]), d = _mm256_hadd_ps(s[6], s[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20),
                         _mm256_permute2f128_ps(ab, cd, 0x31));
}

/* In-register transpose of 8 rows of 8 floats. */
static inline void rc8_transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Mask the scores s[0, 64) of query row i against keys j0 + [0, 64) of batch b, in place: keys
 * past S, above the diagonal (causal) or masked off (bool) become -inf; a float mask is added.
 * Only reads the mask for rows i < L. */
static inline void rc8_attn_mask_row(const rc_attn *a, int64_t b, int64_t i, int64_t j0, float *s)
{
    int64_t lim = a->S - j0;
    if (a->causal && i + 1 - j0 < lim)
        lim = i + 1 - j0;
    const int64_t *st = a->st;
    const int mk = i < a->L ? a->mask_kind : 0;
    const int64_t om = mk ? a->offs[3 * a->nb + b] + i * st[6] + j0 * st[7] : 0;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int c = 0; c < RC_ATTN_BS / 8; c++) {
        const int64_t n = lim - 8 * c;
        __m256 keep = _mm256_castsi256_ps(rc8_lanes(n));
        __m256 v = _mm256_loadu_ps(s + 8 * c);
        if (mk == 1 && n > 0) {
            const uint8_t *m = (const uint8_t *)a->mask + om + 8 * c * st[7];
            __m128i by;
            if (st[7] == 1 && n >= 8) {
                by = _mm_loadl_epi64((const __m128i *)m);
            } else {
                uint8_t tmp[16] = {0};
                for (int64_t t = 0; t < 8 && t < n; t++)
                    tmp[t] = m[t * st[7]];
                by = _mm_loadu_si128((const __m128i *)tmp);
            }
            const __m256i on = _mm256_cvtepu8_epi32(by);
            const __m256i off = _mm256_cmpeq_epi32(on, _mm256_setzero_si256());
            keep = _mm256_andnot_ps(_mm256_castsi256_ps(off), keep);
        } else if (mk == 2 && n > 0) {
            __m256 mv;
            if (st[7] == 1) {
                mv = rc8_load(a->mask, om + 8 * c, n, a->bf16);
            } else {
                float tmp[8] = {0};
                for (int64_t t = 0; t < 8 && t < n; t++)
                    tmp[t] = rc_ld(a->mask, om + (8 * c + t) * st[7], a->bf16);
                mv = _mm256_loadu_ps(tmp);
            }
            v = _mm256_add_ps(v, mv);
        }
        _mm256_storeu_ps(s + 8 * c, _mm256_blendv_ps(ninf, v, keep));
    }
}

/* Online softmax step for 4 rows of masked scores s (natural units, rows 64 apart, in place
 * turned into probabilities): the running maxima m (4) move only past m + RC8_ATTN_SLACK (the
 * horizontal max only then), p = 2^((s - shift) log2(e)) (shift 0 for a row that has seen only
 * -inf; the difference is taken before the factor, so no finite score overflows),
 * lv (4 x 8) per-lane running sums, alpha (4) each row's factor for what it accumulated. */
static inline void rc8_attn_softmax4(float *s, float *m, float *lv, float *alpha)
{
    for (int r = 0; r < 4; r++) {
        float *row = s + r * RC_ATTN_BS;
        __m256 mx = _mm256_loadu_ps(row);
        for (int c = 1; c < RC_ATTN_BS / 8; c++)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(row + 8 * c));
        float mnew = m[r];
        const __m256 gt = _mm256_cmp_ps(mx, _mm256_set1_ps(m[r] + RC8_ATTN_SLACK), _CMP_GT_OQ);
        if (_mm256_movemask_ps(gt)) {
            const float bm = rc8_hmax(mx);
            mnew = bm > m[r] + RC8_ATTN_SLACK ? bm : m[r];
        }
        const float shift = mnew == -INFINITY ? 0.0f : mnew;
        alpha[r] = mnew == m[r]           ? 1.0f
                   : m[r] == -INFINITY ? 0.0f
                                       : exp2f((m[r] - shift) * RC_LOG2E);
        m[r] = mnew;
        const __m256 vs = _mm256_set1_ps(shift), l2e = _mm256_set1_ps(RC_LOG2E);
        __m256 sum = _mm256_setzero_ps();
        for (int c = 0; c < RC_ATTN_BS / 8; c++) {
            const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(row + 8 * c), vs);
            const __m256 e = rc8_exp2_neg(_mm256_mul_ps(d, l2e));
            _mm256_storeu_ps(row + 8 * c, e);
            sum = _mm256_add_ps(sum, e);
        }
        const __m256 lsum = _mm256_loadu_ps(lv + 8 * r);
        _mm256_storeu_ps(lv + 8 * r, _mm256_fmadd_ps(lsum, _mm256_set1_ps(alpha[r]), sum));
    }
}

/* Output row `row` (= b * L + i) from o (Ev fp32 accumulators) divided by l: 0 when l is 0
 * (nothing attended; NaN stays NaN). */
static inline void rc8_attn_store_row(const rc_attn *a, int64_t row, const float *o, float l)
{
    const __m256 inv = _mm256_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
    const int64_t base = rc_attn_out_row(a, row);
    for (int64_t c = 0; c < a->Ev; c += 8)
        rc8_store(a->out, base + c, a->Ev - c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv),
                  a->bf16);
}

#endif
