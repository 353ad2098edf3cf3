/* vision family at the avx512 level: vision_portable.c compiled with AVX-512 (the channel loop
 * on 16 lanes). */
#define RC_LEVEL avx512
#include "vision_portable.c"
