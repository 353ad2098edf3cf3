/* attention family, portable C: one query row at a time, for correctness on any CPU.
 *
 * The float64 row kernel of rc_attn_exact.h (also the vector levels' path for calls whose fp32
 * scores could overflow).
 */
#ifndef RC_LEVEL
#define RC_LEVEL portable
#endif

#include <stdlib.h>

#include "attention.h"
#include "rc_attn_exact.h"

int RC_FN(rc_scaled_dot_product_attention_f32)(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt)
{
    return rc_attn_exact(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale,
                         nt, 0);
}

int RC_FN(rc_scaled_dot_product_attention_bf16)(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt)
{
    return rc_attn_exact(q, k, v, mask, out, offs, st, nb, L, S, E, Ev, mask_kind, causal, scale,
                         nt, 1);
}
