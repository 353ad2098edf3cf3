/* attention family, portable C: one query row at a time, for correctness on any CPU.
 *
 * Per row: the S scores in double (scale applied, causal/mask/-inf), their max, exp(s - max)
 * and the sum in double, then the weighted sum of value rows, rounded once. A row with nothing to
 * attend (every score -inf) gives 0, as the reference.
 */
#ifndef RC_LEVEL
#define RC_LEVEL portable
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_common.h"

static void row(const void *q, const void *k, const void *v, const void *mask,
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

static int sdpa(const void *q, const void *k, const void *v, const void *mask, void *out,
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
            row(q, k, v, mask, offs, st, nb, b, i, S, E, Ev, mask_kind, causal, scale, p,
                acc, bf16);
            for (int64_t c = 0; c < Ev; c++)
                rc_st(out, offs[4 * nb + b] + i * st[8] + c, (float)acc[c], bf16);
        }
        free(p);
    }
    return failed ? -1 : 0;
}

int RC_FN(rc_scaled_dot_product_attention_f32)(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt)
{
    return sdpa(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 0);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    return sdpa(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale, nt, 1);
}
