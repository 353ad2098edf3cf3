/* Attention in float64, one query row at a time (plain C, compiled at every level), and the
 * test that tells the vector kernels when their fp32 scores could overflow.
 *
 * rc_attn_exact is the portable kernel (attention_portable.c) and the vector levels' path for
 * calls whose scores may not fit fp32: per row, the S scores in double (scale applied,
 * causal / mask / -inf), their max, exp(s - max) and the sum in double, then the weighted sum
 * of value rows, rounded once. A row with nothing to attend (every score -inf) gives 0, as the
 * reference.
 *
 * Why the test: the vector kernels form scores in fp32. With |q| or |k| near 1e19 or more, or a
 * huge scale, a score overflows to +inf (inf - inf = NaN for the row) or a whole row to -inf
 * (read as fully masked: 0), where the reference's float64 scores give a softmax (found by
 * refcore.fuzz: q of -3e38 gave NaN, the reference a value row). rc_attn_scores_fit bounds every
 * fp32 intermediate of the levels' score paths (q * scale pre-scaled at avx2, q . k then times
 * scale * log2(e) at AVX-512 / AMX) by E * max|q| * max|k| * max(1, 2|scale|) over the finite
 * elements (NaN and Inf take the kernels' own path, as before) and sends calls past 2^100 to
 * rc_attn_exact. Under that bound a score plus any finite fp32 mask value cannot overflow
 * either (2^100 is below half an ulp of FLT_MAX); the AVX-512 / AMX levels, which add the mask
 * times log2(e), also send masks past 2^127 there (rc_attn_mask_fits). Cost: one pass over q and
 * k (and such a mask) per call, in vector code for dense rows. rc_attn_values_fit bounds the
 * values likewise, for the weights the kernels' exp2 sets to 0 (see RC_ATTN_VALUE_BOUND).
 * rc_attn_fix_rows (after the vector kernel): output rows with a NaN or Inf, which fp32 P V sums
 * of values near FLT_MAX give by overflow, recomputed in float64 (see there).
 */
#ifndef RC_ATTN_EXACT_H
#define RC_ATTN_EXACT_H

#include <stdlib.h>
#include <string.h>

#include "rc_common.h"

#define RC_ATTN_SCORE_BOUND 0x1p100
/* largest change of a score (log2 units) that reading bf16 subnormals as 0 may make: the
 * softmax then moves by a relative 2^-24 at most, far inside bf16's tolerance */
#define RC_ATTN_FLUSH_BOUND 0x1p-24

static inline void rc_attn_exact_row(const void *q, const void *k, const void *v, const void *mask,
                const int64_t *offs, const int64_t *st, int64_t nb, int64_t b, int64_t i,
                int64_t S, int64_t E, int64_t Ev, int mask_kind, int causal, double scale,
                double *p, double *acc, int bf16)
{
    const int64_t oq = offs[b] + i * st[0], ok = offs[nb + b], ov = offs[2 * nb + b];
    const int64_t om = offs[3 * nb + b] + i * st[6];
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; j++) {
        double s = 0.0;
        for (int64_t d = 0; d < E; d++)
            s += (double)rc_ld(q, oq + d * st[1], bf16) *
                 (double)rc_ld(k, ok + j * st[2] + d * st[3], bf16);
        s *= scale;
        if (causal && j > i)
            s = -INFINITY;
        if (mask_kind == 1 && !((const uint8_t *)mask)[om + j * st[7]])
            s = -INFINITY;
        else if (mask_kind == 2)
            s += (double)rc_ld(mask, om + j * st[7], bf16);
        p[j] = s;
        if (s > mx)
            mx = s;
    }
    double sum = 0.0;
    const double shift = isfinite(mx) ? mx : 0.0;
    for (int64_t j = 0; j < S; j++) {
        p[j] = exp(p[j] - shift);
        sum += p[j];
    }
    for (int64_t c = 0; c < Ev; c++)
        acc[c] = 0.0;
    /* every key, weight 0 or not: 0 * a non-finite value is NaN, as in the reference */
    for (int64_t j = 0; j < S; j++)
        for (int64_t c = 0; c < Ev; c++)
            acc[c] += p[j] * (double)rc_ld(v, ov + j * st[4] + c * st[5], bf16);
    const double inv = sum > 0.0 ? 1.0 / sum : 0.0; /* nothing to attend: 0 */
    for (int64_t c = 0; c < Ev; c++)
        acc[c] *= inv;
}

static inline int rc_attn_exact(const void *q, const void *k, const void *v, const void *mask, void *out,
                 const void *offs_, const void *st_, int64_t nb, int64_t L, int64_t S, int64_t E,
                 int64_t Ev, int mask_kind, int causal, double scale, int nt, int bf16)
{
    const int64_t *offs = offs_, *st = st_;
    int failed = 0;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        double *p = malloc((size_t)(S + Ev) * sizeof(double)); /* scores, then the output row */
        if (!p) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < nb * L; r++) {
            if (!p)
                continue;
            const int64_t b = r / L, i = r % L;
            double *acc = p + S;
            rc_attn_exact_row(q, k, v, mask, offs, st, nb, b, i, S, E, Ev, mask_kind, causal,
                              scale, p, acc, bf16);
            for (int64_t c = 0; c < Ev; c++)
                rc_st(out, offs[4 * nb + b] + i * st[8] + c, (float)acc[c], bf16);
        }
        free(p);
    }
    return failed ? -1 : 0;
}

/* Largest |x| over the finite elements of a row of n fp32 / bf16 values (stride cs) as fp32
 * bits (integer order is magnitude order for finite values); NaN and Inf count as 0. The mask
 * form (not ?:) is what gcc 12 vectorizes. */
static inline uint32_t rc_attn_amax_row(const void *t, int64_t o, int64_t n, int64_t cs, int bf16)
{
    if (bf16) {
        const uint16_t *p = (const uint16_t *)t + o;
        uint16_t m = 0;
        for (int64_t j = 0; j < n; j++) {
            uint16_t u = p[j * cs] & 0x7fffu;
            u &= (uint16_t) - (u < 0x7f80u);
            m = u > m ? u : m;
        }
        return (uint32_t)m << 16;
    }
    const uint32_t *p = (const uint32_t *)t + o;
    uint32_t m = 0;
    for (int64_t j = 0; j < n; j++) {
        uint32_t u = p[j * cs] & 0x7fffffffu;
        u &= -(uint32_t)(u < 0x7f800000u);
        m = u > m ? u : m;
    }
    return m;
}

/* Largest |x| over the finite elements of nb (rows x cols) matrices, element (b, i, j) at
 * offs[b] + i * rs + j * cs; 0 when there are none. Batches sharing an offset (broadcast) and
 * stride-0 dims are read once; a unit-stride dim is the inner loop. nt as attention.h. */
static inline double rc_attn_amax(const void *t, const int64_t *offs, int64_t nb, int64_t rows,
                                  int64_t cols, int64_t rs, int64_t cs, int bf16, int nt)
{
    rows = rs ? rows : 1;
    cols = cs ? cols : 1;
    if (cs != 1 && rs == 1) { /* e.g. keys stored transposed */
        int64_t t_ = rows;
        rows = cols, cols = t_, rs = cs, cs = 1;
    }
    uint32_t top = 0;
    const int par = nt != 1 && nb * rows * cols >= (1 << 16);
#pragma omp parallel for num_threads(rc_threads(nt)) if (par) reduction(max : top) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        if (b && offs[b] == offs[b - 1])
            continue;
        for (int64_t i = 0; i < rows; i++) {
            const uint32_t m = cs == 1 ? rc_attn_amax_row(t, offs[b] + i * rs, cols, 1, bf16)
                                       : rc_attn_amax_row(t, offs[b] + i * rs, cols, cs, bf16);
            top = m > top ? m : top;
        }
    }
    float f;
    memcpy(&f, &top, sizeof f);
    return (double)f;
}

/* Whether every fp32 score intermediate of the vector kernels stays below RC_ATTN_SCORE_BOUND
 * (see the header comment) and, for bf16, reading subnormal inputs as 0 moves no score by more
 * than RC_ATTN_FLUSH_BOUND; offs, st as attention.h. */
static inline int rc_attn_scores_fit(const void *q, const void *k, const int64_t *offs,
                                     const int64_t *st, int64_t nb, int64_t L, int64_t S,
                                     int64_t E, double scale, int bf16, int nt)
{
    const double aq = rc_attn_amax(q, offs, nb, L, E, st[0], st[1], bf16, nt);
    const double ak = rc_attn_amax(k, offs + nb, nb, S, E, st[2], st[3], bf16, nt);
    const double sc = fabs(scale) * 2.0 > 1.0 ? fabs(scale) * 2.0 : 1.0; /* 2 > log2(e) */
    /* bf16 dot products (vdpbf16ps, AMX tiles) read subnormal inputs as 0: a score moves by at
     * most E * 2^-126 * (max|q| + max|k|) * |scale| * log2(e), invisible unless the scale is
     * huge (found by refcore.fuzz on AMX: queries ~1e-38 at scale 1e36 gave other softmaxes) */
    const double flushed = (double)E * 0x1p-126 * (aq + ak) * fabs(scale) * 2.0;
    /* sc alone too: the kernels hold scale * log2(e) as a float, inf past FLT_MAX, and
     * inf * 0 is NaN where q or k is 0 (found by refcore.fuzz: E = 1, scale 3e38) */
    return (double)E * aq * ak * sc <= RC_ATTN_SCORE_BOUND && aq * sc <= RC_ATTN_SCORE_BOUND &&
           sc <= RC_ATTN_SCORE_BOUND && (!bf16 || flushed <= RC_ATTN_FLUSH_BOUND);
}

/* Largest float mask value (in magnitude) the AVX-512 / AMX score paths take: they add the mask
 * times log2(e) to scores under RC_ATTN_SCORE_BOUND, and 2^127 * log2(e) + 2^100 stays below
 * FLT_MAX, where a mask of -3e38 became -inf (a fully masked row: 0 where the reference gives a
 * softmax) and +-3e38 in one row inf - inf = NaN (found by hypothesis on an AMX machine; the AVX2
 * level applies log2(e) after subtracting the row max and needs no bound). */
#define RC_ATTN_MASK_BOUND 0x1p127

/* Largest S * max|v| (finite values) the vector kernels take. Their exp2 returns 0 below 2^-64
 * (AMX's unmasked blocks: 2^-64), so a key whose weight is under 2^-64 of the row's largest
 * drops out of (or enters) P V: each such term moves the output by under 2^-64 * max|v| of
 * the weights' sum (which the largest weight, 1, is part of), S of them by S * 2^-64 * max|v|
 * <= 2^-24 under this bound, far below the fp32 atol. Past it the term may be the output:
 * a value of -3e38 at a weight of 3e-27 gave -1e12 in the reference and torch, 0.76 here
 * (found by refcore.fuzz at avx2 and avx512); such calls take the float64 path. */
#define RC_ATTN_VALUE_BOUND 0x1p40

/* Whether the values of a call stay under RC_ATTN_VALUE_BOUND (see there); offs, st as
 * attention.h. One pass over the values (S x Ev per batch, against L x S x Ev for P V). */
static inline int rc_attn_values_fit(const void *v, const int64_t *offs, const int64_t *st,
                                     int64_t nb, int64_t S, int64_t Ev, int bf16, int nt)
{
    return (double)S * rc_attn_amax(v, offs + 2 * nb, nb, S, Ev, st[4], st[5], bf16, nt) <=
           RC_ATTN_VALUE_BOUND;
}

/* Whether a float mask (mask_kind 2) has no finite value past RC_ATTN_MASK_BOUND; offs, st as
 * attention.h. One pass over the mask (L x S per batch, against L x S x E for the scores). */
static inline int rc_attn_mask_fits(const void *mask, const int64_t *offs, const int64_t *st,
                                    int64_t nb, int64_t L, int64_t S, int mask_kind, int bf16,
                                    int nt)
{
    return mask_kind != 2 ||
           rc_attn_amax(mask, offs + 3 * nb, nb, L, S, st[6], st[7], bf16, nt) <= RC_ATTN_MASK_BOUND;
}

/* Whether the n values at element offset o of t (dense) hold a NaN or an Inf (all exponent
 * bits set): the largest masked exponent decides, a max the compiler vectorizes. */
static inline int rc_attn_row_bad(const void *t, int64_t o, int64_t n, int bf16)
{
    if (bf16) {
        const uint16_t *p = (const uint16_t *)t + o;
        uint16_t m = 0;
        for (int64_t c = 0; c < n; c++) {
            const uint16_t u = p[c] & 0x7f80u;
            m = u > m ? u : m;
        }
        return m == 0x7f80u;
    }
    const uint32_t *p = (const uint32_t *)t + o;
    uint32_t m = 0;
    for (int64_t c = 0; c < n; c++) {
        const uint32_t u = p[c] & 0x7f800000u;
        m = u > m ? u : m;
    }
    return m == 0x7f800000u;
}

/* After a vector kernel: every output row holding a NaN or an Inf recomputed in float64
 * (rc_attn_exact_row). The fp32 accumulation of P V overflows for values near FLT_MAX (the
 * flash kernels' unnormalised sums carry weights up to 2^8), giving inf or inf - inf = NaN
 * where the reference's weighted mean is finite or one infinity (found by refcore.fuzz);
 * overflow never leaves a finite wrong value, so finite rows are kept. Rows that are NaN
 * because an input is take this path too (the same result, the reference's). Cost: one pass
 * over the output. Returns -1 when no scratch could be allocated. */
static inline int rc_attn_fix_rows(const void *q, const void *k, const void *v, const void *mask,
                                   void *out, const void *offs_, const void *st_, int64_t nb,
                                   int64_t L, int64_t S, int64_t E, int64_t Ev, int mask_kind,
                                   int causal, double scale, int bf16)
{
    const int64_t *offs = offs_, *st = st_;
    double *p = NULL;
    for (int64_t r = 0; r < nb * L; r++) {
        const int64_t b = r / L, i = r % L, o = offs[4 * nb + b] + i * st[8];
        if (!rc_attn_row_bad(out, o, Ev, bf16))
            continue;
        if (!p && !(p = malloc((size_t)(S + Ev) * sizeof(double))))
            return -1;
        rc_attn_exact_row(q, k, v, mask, offs, st, nb, b, i, S, E, Ev, mask_kind, causal, scale,
                          p, p + S, bf16);
        for (int64_t c = 0; c < Ev; c++)
            rc_st(out, o + c, (float)p[S + c], bf16);
    }
    free(p);
    return 0;
}

#endif
