/* fused family, portable C: add + relu / gelu (erf, tanh) / silu, add + layer_norm.
 *
 * The arithmetic of the AVX-512 file in scalar fp32 (rc_scalar.h, rc_norm_portable.h): the sum
 * rounded to the dtype, then activated or normalised (stored into the output row, normalised in
 * place from cache); one rounding to bf16 at the store.
 */
#ifndef RC_LEVEL
#define RC_LEVEL portable
#endif

#include "fused.h"
#include "rc_norm_portable.h"
#include "rc_scalar.h"

enum { RC_CHUNK = 16384, NONE = 0, RELU = 1, GELU = 2, GELU_TANH = 3, SILU = 4 };

static inline float act(float x, int op)
{
    switch (op) {
    case RELU:
        return rc_relu1(x);
    case GELU:
        return rc_gelu_erf1(x);
    case GELU_TANH:
        return rc_gelu_tanh1(x);
    case SILU:
        return rc_silu1(x);
    default:
        return x;
    }
}

/* a + b rounded to the dtype, in fp32 */
static inline float sum(float a, float b, int bf16)
{
    float s = a + b;
    return bf16 ? rc_bf16_to_f32(rc_f32_to_bf16(s)) : s;
}

static inline void span(const void *a, const void *b, void *y, int64_t lo, int64_t hi, int op,
                        int bf16)
{
    for (int64_t j = lo; j < hi; j++)
        rc_st(y, j, act(sum(rc_ld(a, j, bf16), rc_ld(b, j, bf16), bf16), op), bf16);
}

/* y row = layer_norm(a row + b row), normalised in place from cache */
static inline void ln_row(const void *a, const void *b, const void *w, const void *bias, void *y,
                          int64_t d, double eps, int bf16)
{
    span(a, b, y, 0, d, NONE, bf16);
    rc_layer_norm_row(y, w, bias, y, d, eps, bf16);
}

#include "rc_fused_driver.h"

RC_ADD_ACT(add_relu, f32, RELU, 0)
RC_ADD_ACT(add_relu, bf16, RELU, 1)
RC_ADD_ACT(add_gelu, f32, GELU, 0)
RC_ADD_ACT(add_gelu, bf16, GELU, 1)
RC_ADD_ACT(add_gelu_tanh, f32, GELU_TANH, 0)
RC_ADD_ACT(add_gelu_tanh, bf16, GELU_TANH, 1)
RC_ADD_ACT(add_silu, f32, SILU, 0)
RC_ADD_ACT(add_silu, bf16, SILU, 1)

RC_ADD_LN(f32, 0)

RC_ADD_LN(bf16, 1)
