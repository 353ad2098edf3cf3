/* Scalar (portable) activation formulas shared by the portable kernel files.
 *
 * fp32 with libm (erfcf, expf); static inline, like everything in rc_common.h.
 */
#ifndef RC_SCALAR_H
#define RC_SCALAR_H

#include "rc_common.h"

/* x * Phi(x) with Phi(x) = erfc(-x/sqrt2)/2: no cancellation in the negative tail. */
static inline float rc_gelu_erf1(float x)
{
    return x * (0.5f * erfcf(-x * 0.70710678118654752f));
}

/* 0.5x(1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3) */
static inline float rc_gelu_tanh1(float x)
{
    float v = x * (-1.5957691216057308f - 0.0713548162726f * x * x);
    return x / (1.0f + expf(v));
}

static inline float rc_silu1(float x)
{
    return x / (1.0f + expf(-x));
}

/* max(x, 0); NaN stays NaN (as torch.relu) */
static inline float rc_relu1(float x)
{
    return x < 0.0f ? 0.0f : x;
}

#endif
