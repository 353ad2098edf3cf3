/* int8 family, AMX: int8_avx512_bf16.c compiled again with -mamx-tile -mamx-int8, so a complete
 * level (every symbol with the _amx suffix). The one difference: qlinear / dynamic_qlinear's
 * GEMM (M >= AMX_MIN_M) sums on AMX tiles (tdpbusd: u8 x s8 into int32, exact as vpdpbusd), 32 x
 * 32 output blocks from the same 32-column panels (16 quads of a half are a B tile, rows 128
 * bytes apart) and A tiles read in place (K a multiple of 64) or from the prepared rows; the
 * epilogue is the VNNI file's. qconv2d stays on the VNNI tiles. Runs only where refcore.cpu
 * reports the OS granted tile data (the amx level): the kernels load the tile config per thread
 * and release it after. */
#ifndef __AMX_INT8__
#error "int8_amx.c needs -mamx-tile -mamx-int8"
#endif
#define RC_LEVEL amx
#include "int8_avx512_bf16.c"
