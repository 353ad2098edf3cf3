/* attention family at the avx512_bf16 level: attention_avx512.c compiled again with
 * -mavx512bf16 (one-instruction bf16 output stores). Only the bf16 kernel is defined here.
 */
#define RC_LEVEL avx512_bf16
#define RC_BF16_ONLY
#include "attention_avx512.c"
