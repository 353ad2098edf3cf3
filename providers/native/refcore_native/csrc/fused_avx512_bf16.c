/* fused family at the avx512_bf16 level: fused_avx512.c compiled again with -mavx512bf16, so
 * each fp32 -> bf16 rounding is one vcvtneps2bf16 (see rc_narrow_bf16). Only the bf16 kernels
 * are defined here: the float32 ones would be identical.
 */
#define RC_LEVEL avx512_bf16
#define RC_BF16_ONLY
#include "fused_avx512.c"
