/* vision family at the avx2 level: vision_portable.c compiled with -mavx2 -mfma -mf16c (the
 * channel loop on 8 lanes). */
#define RC_LEVEL avx2
#include "vision_portable.c"
