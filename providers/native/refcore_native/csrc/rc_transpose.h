/* 16 x 16 transposes of 32-bit elements, shared by the GEMM family (VNNI-2 and fp32 panel
 * packing) and the AMX attention kernel (keys as VNNI-2 B tiles). AVX-512 only (include after
 * rc_avx512.h).
 */
#ifndef RC_TRANSPOSE_H
#define RC_TRANSPOSE_H

#include "rc_avx512.h"

/* 16-bit elements [0, n) of a 32-element row (n may exceed 32 or be <= 0). */
static inline __mmask32 rc_tail32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u);
}

/* dst row c (c < drows, stride dstride bytes) = 32-bit column c of the 16 x 16 block whose row
 * r < nrows starts at src + r * sstride (row mask m in 16-bit elements); missing rows are 0. */
static inline void rc_transpose16(const char *src, int64_t sstride, int64_t nrows, __mmask32 m,
                                  char *dst, int64_t dstride, int64_t drows)
{
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < nrows ? _mm512_maskz_loadu_epi16(m, src + i * sstride) : _mm512_setzero_si512();
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(u[h + i], u[h + 4 + i], 0x88);
            t[h + 4 + i] = _mm512_shuffle_i32x4(u[h + i], u[h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        if (i < drows)
            _mm512_storeu_si512(dst + i * dstride, _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88));
        if (i + 8 < drows)
            _mm512_storeu_si512(dst + (i + 8) * dstride,
                                _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd));
    }
}

#endif
