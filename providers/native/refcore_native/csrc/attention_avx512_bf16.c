/* attention family at the avx512_bf16 level (bf16 only): attention_avx512.c compiled again
 * with -mavx512bf16 and RC_BF16_DP: scores by vdpbf16ps on bf16 feature pairs (exact products,
 * fp32 accumulation; half the instructions of widening + FMA), one-instruction bf16 output
 * stores. P V stays fp32 FMA: P rounded to bf16 would miss the reference's single rounding.
 */
#define RC_LEVEL avx512_bf16
#define RC_BF16_ONLY
#define RC_BF16_DP
#include "attention_avx512.c"
