/* int8 family, AVX-512 + VNNI (the avx512_bf16 level: -mavx512bf16 -mavx512vnni): the symbols of
 * int8_avx2.c with the _avx512_bf16 suffix. Every float step is the reference's (refcore/ops/
 * int8.py), as in the AVX2 file, so integer outputs match it bit for bit.
 *
 * The sums: vpdpbusd (u8 x s8, 4 products into an int32 lane). A group of 4 products is at most
 * 4 * 255 * 128 = 130560 in magnitude and goes straight into int32 (no int16 step, unlike
 * vpmaddubsw), so the raw codes x are multiplied as they are for any code and any weight: there is
 * one exact path and no data scan. The zero point comes off after the loop: acc = sum x * w -
 * zp * colsum[n] (colsum: the column's weight sum, from the packed panel; wrapping int32 steps
 * whose result is the in-range exact sum). Padding (qconv2d) holds the zero point, so it adds
 * zp * w - zp * w = 0; K padded to whole quads multiplies zero weights.
 *
 * - GEMM (qlinear / dynamic_qlinear above SMALL_M rows, qconv2d): weights packed per call into
 *   panels of NR = 32 columns in k quads (one zmm holds 16 columns x 4 k, two a panel), then the
 *   32 columns' colsum (int32). A tile of MR rows x 32 columns: 2 x MR zmm accumulators, per
 *   quad two weight loads, MR broadcasts of x's 4 codes and 2 x MR vpdpbusd. Tasks, row blocks,
 *   conv bands and taps are the AVX2 file's (its qconv2d section explains them); here the codes
 *   are always uint8 (a band is the NHWC codes padded with the zero point).
 * - M <= SMALL_M: the weight is read in place (packing it would cost more than using it): rows
 *   of x against weight rows, 64 k a vpdpbusd, 4 x 4 sums a step, each column's weight sum in
 *   the same loop (ones x w), reduced across lanes at the end, then the GEMM's epilogue.
 * - dynamic_qlinear quantizes each row to uint8 codes with its own scale and zero point (the
 *   reference's float32 steps, as int8_avx2.c's quant_row), then the same sums with the row's
 *   zero point.
 * Epilogue: y = float32(acc) * float32(rs * ws[n]) + b[n] in two roundings (mul_add: not an
 * FMA), the post-op (relu, relu(y + other), gelu erf / tanh with rc_avx512.h's vector gelu, the
 * native fp32 gelu kernel's formula at this level), then the store: fp32, bf16 (round to nearest
 * even in integer steps, as the reference: vcvtneps2bf16 would flush fp32 denormals), or the
 * requantizing post-ops' 1-byte codes (quantize_per_tensor's steps).
 */
#ifndef RC_LEVEL /* int8_amx.c compiles this file again as level amx, with the AMX GEMM */
#define RC_LEVEL avx512_bf16
#endif
#include "int8.h"
#include "rc_avx512.h"

#include <float.h>

#define RC_INLINE static inline __attribute__((always_inline))

enum { CHUNK = 16384 };                    /* flat loops: elements per task */
enum { NR = 32, MR = 12, SMALL_M = 16 };    /* the GEMM tile; int8.py has SMALL_M too */
enum { X_BLOCK = 1 << 18, MIN_ROWS = 64 }; /* a GEMM task's rows: ~256 KB of x (L2) */
enum { MB = 4, NB = 4 };                   /* the small-M dot tile */
/* post-op codes (int8.h; int8.py's POST) */
enum { POST_NONE = 0, POST_RELU = 1, POST_ADD_RELU = 2, POST_GELU = 3, POST_GELU_TANH = 4 };
enum { POST_RELU_Q = 5, POST_GELU_Q = 6, POST_GELU_TANH_Q = 7 };
enum { RINT = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; /* half to even, as rint */

static int64_t rc_max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t round_up(int64_t a, int64_t b)
{
    return (a + b - 1) / b * b;
}

/* lanes [0, n) of a 64-byte vector (n may exceed 64) */
RC_INLINE __mmask64 tail64(int64_t n)
{
    return n >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << n) - 1);
}

/* ---------------------------------------------------------------------------------------------
 * quantize_per_tensor / dequantize_per_tensor: chunks of CHUNK elements (a task each), 16 a step,
 * the tail through masked loads and stores (nothing outside the arrays is touched) */

/* rint(v * inv) clamped to [lo, hi] = [qmin - zp, qmax - zp], plus zp, as int32. vmaxps returns
 * its second operand when either is NaN: NaN -> lo -> qmin; +-inf clamp to the ends. */
RC_INLINE __m512i quant16(__m512 v, __m512 inv, __m512 lo, __m512 hi, __m512i zp)
{
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, inv), RINT);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    return _mm512_add_epi32(_mm512_cvtps_epi32(r), zp);
}

static void quantize_span(const void *x, uint8_t *q, int64_t i0, int64_t i1, float inv, int zp,
                          int qmin, int qmax, int bf16)
{
    const __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps((float)(qmin - zp));
    const __m512 hi = _mm512_set1_ps((float)(qmax - zp));
    const __m512i vz = _mm512_set1_epi32(zp);
    for (int64_t i = i0; i < i1; i += 16) { /* codes in range: vpmovdb keeps them (int8 too) */
        const __mmask16 m = rc_tail16(i1 - i);
        const __m512i c = quant16(rc_load_m(x, i, m, bf16), vi, lo, hi, vz);
        _mm512_mask_cvtepi32_storeu_epi8(q + i, m, c);
    }
}

static void quantize(const void *x, void *q, int64_t n, float inv, int zp, int qmin, int qmax,
                     int nt, int bf16)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        quantize_span(x, (uint8_t *)q, c * CHUNK, rc_min64(n, (c + 1) * CHUNK), inv, zp, qmin,
                      qmax, bf16);
}

void RC_FN(rc_quantize_per_tensor_f32)(const void *x, void *q, int64_t n, float inv, int zp,
                                            int qmin, int qmax, int sgn, int nt)
{
    (void)sgn; /* the codes' bytes are the same either way */
    quantize(x, q, n, inv, zp, qmin, qmax, nt, 0);
}

void RC_FN(rc_quantize_per_tensor_bf16)(const void *x, void *q, int64_t n, float inv, int zp,
                                             int qmin, int qmax, int sgn, int nt)
{
    (void)sgn;
    quantize(x, q, n, inv, zp, qmin, qmax, nt, 1);
}

static void dequantize_span(const uint8_t *q, float *y, int64_t i0, int64_t i1, float scale,
                            int zp, int sgn)
{
    const __m512i vz = _mm512_set1_epi32(zp);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t i = i0; i < i1; i += 16) { /* float32(q - zp) * s: q - zp exact */
        const __mmask16 m = rc_tail16(i1 - i);
        const __m128i b = _mm_maskz_loadu_epi8(m, q + i);
        const __m512i v = sgn ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
        _mm512_mask_storeu_ps(y + i, m,
                              _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(v, vz)), vs));
    }
}

void RC_FN(rc_dequantize_per_tensor_f32)(const void *q, void *y, int64_t n, float scale,
                                              int zp, int sgn, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        dequantize_span((const uint8_t *)q, (float *)y, c * CHUNK, rc_min64(n, (c + 1) * CHUNK),
                        scale, zp, sgn);
}

/* ---------------------------------------------------------------------------------------------
 * The epilogue of qlinear, dynamic_qlinear and qconv2d:
 *   y[row, c] = float32(acc) * float32(rs[row] * ws[c]) + bi[c]  (two roundings: mul_add)
 * acc = sum x * w - zp[row] * colsum[c]; then the post-op and the store. */

typedef struct {
    float inv; /* float32(1 / output_scale) */
    int zp, qmin, qmax, sgn;
} Q8;

/* A block of output columns: rs / zp[row * rstep] (rstep 0: one scale and zero point for all
 * rows), NR column scales and biases readable from ws / bi (zeros past the last column), y at
 * the block's first column (ldy elements a row), cols columns written; POST_ADD_RELU reads
 * other's (row, column c of the block) at res + (row - rbase) * rrow + c * rcol. */
typedef struct {
    const float *rs, *ws, *bi;
    const int32_t *zp;
    int64_t rstep, ldy, cols;
    void *y;
    int bf16, post;
    const float *res;
    int64_t rbase, rrow, rcol;
    Q8 q;
} Out;

/* float32(acc) * s + b with both roundings: the empty asm keeps gcc from contracting an fma */
RC_INLINE __m512 mul_add(__m512 acc, __m512 s, __m512 b)
{
    __m512 p = _mm512_mul_ps(acc, s);
    __asm__("" : "+v"(p));
    return _mm512_add_ps(p, b);
}

/* fp32 -> bf16 to nearest even in integer steps (denormals too, as the reference's rounding);
 * NaN stays a quiet NaN */
RC_INLINE __m256i narrow_bf16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

/* other's values of output row `row`, block columns [c, c + n) in lanes [0, n) (n >= 1) */
RC_INLINE __m512 res16(const Out *o, int64_t row, int64_t c, int64_t n)
{
    const float *r = o->res + (row - o->rbase) * o->rrow + c * o->rcol;
    if (o->rcol == 1)
        return _mm512_maskz_loadu_ps(rc_tail16(n), r);
    float t[16] = {0};
    for (int64_t j = 0; j < rc_min64(n, 16); j++)
        t[j] = r[j * o->rcol];
    return _mm512_loadu_ps(t);
}

/* the post-op `post` (a constant once inlined) on block columns [c, c + n) of row `row` */
RC_INLINE __m512 post16(const Out *o, __m512 v, int64_t row, int64_t c, int64_t n, const int post)
{
    const __m512 zero = _mm512_setzero_ps();
    switch (post) {
    case POST_RELU:
    case POST_RELU_Q: return _mm512_max_ps(zero, v); /* NaN stays NaN (quantizes to qmin) */
    case POST_ADD_RELU: return _mm512_max_ps(zero, _mm512_add_ps(v, res16(o, row, c, n)));
    case POST_GELU:
    case POST_GELU_Q: return rc_gelu_erf(v);
    case POST_GELU_TANH:
    case POST_GELU_TANH_Q: return rc_gelu_tanh(v);
    default: return v;
    }
}

/* 16 results of row `row` from block column c (0 or 16), acc already less zp * colsum */
RC_INLINE void store16(const Out *o, int64_t row, int64_t c, __m512i acc, const int post)
{
    const int64_t n = o->cols - c;
    if (n <= 0)
        return;
    const __mmask16 m = rc_tail16(n);
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(o->rs[row * o->rstep]),
                                   _mm512_loadu_ps(o->ws + c));
    __m512 y = mul_add(_mm512_cvtepi32_ps(acc), s, _mm512_loadu_ps(o->bi + c));
    if (post != POST_NONE)
        y = post16(o, y, row, c, n, post);
    const int64_t at = row * o->ldy + c;
    if (post >= POST_RELU_Q) {
        const Q8 *q = &o->q;
        const __m512i code = quant16(y, _mm512_set1_ps(q->inv),
                                     _mm512_set1_ps((float)(q->qmin - q->zp)),
                                     _mm512_set1_ps((float)(q->qmax - q->zp)),
                                     _mm512_set1_epi32(q->zp));
        _mm512_mask_cvtepi32_storeu_epi8((uint8_t *)o->y + at, m, code);
    } else if (o->bf16) {
        _mm256_mask_storeu_epi16((uint16_t *)o->y + at, m, narrow_bf16(y));
    } else {
        _mm512_mask_storeu_ps((float *)o->y + at, m, y);
    }
}

/* a row's two halves of raw sums a0, a1 less zp[row] * colsum (z0, z1), then stored */
RC_INLINE void store_row(const Out *o, int64_t row, __m512i a0, __m512i a1, __m512i z0,
                         __m512i z1, const int post)
{
    const __m512i zp = _mm512_set1_epi32(o->zp[row * o->rstep]);
    store16(o, row, 0, _mm512_sub_epi32(a0, _mm512_mullo_epi32(zp, z0)), post);
    store16(o, row, 16, _mm512_sub_epi32(a1, _mm512_mullo_epi32(zp, z1)), post);
}

/* ---------------------------------------------------------------------------------------------
 * Weight panels */

/* 16 x 16 transpose of int32: r[c] element j -> r[j] element c */
RC_INLINE void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + e]: element 4L + e of rows 4i .. 4i + 3, lane L */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int e = 0; e < 4; e++) { /* 4 x 4 transpose of 128-bit lanes */
        const __m512i a = r[e], b = r[4 + e], c = r[8 + e], d = r[12 + e];
        const __m512i ab0 = _mm512_shuffle_i32x4(a, b, 0x44);
        const __m512i ab1 = _mm512_shuffle_i32x4(a, b, 0xee);
        const __m512i cd0 = _mm512_shuffle_i32x4(c, d, 0x44);
        const __m512i cd1 = _mm512_shuffle_i32x4(c, d, 0xee);
        r[e] = _mm512_shuffle_i32x4(ab0, cd0, 0x88);
        r[4 + e] = _mm512_shuffle_i32x4(ab0, cd0, 0xdd);
        r[8 + e] = _mm512_shuffle_i32x4(ab1, cd1, 0x88);
        r[12 + e] = _mm512_shuffle_i32x4(ab1, cd1, 0xdd);
    }
}

/* Panel of weight rows [n0, n0 + 32) of an (n, k) matrix in k quads: dst[j * 128 + h * 64 +
 * 4 * c + e] = w[n0 + 16h + c, 4j + e] for j < quads (zeros past n and k: quads may pass K),
 * then at dst + 128 * quads the 32 columns' weight sums (int32: vpdpbusd of ones and w). */
static void pack_panel(const int8_t *w, int64_t n, int64_t k, int64_t n0, int64_t quads,
                       int8_t *dst)
{
    for (int64_t k0 = 0; k0 < 4 * quads; k0 += 64) {
        const int64_t j0 = k0 / 4, nj = rc_min64(16, quads - j0);
        const __mmask64 km = k > k0 ? tail64(k - k0) : 0; /* AMX panels: whole 64-k blocks */
        for (int64_t h = 0; h < 2; h++) {
            __m512i r[16];
            for (int c = 0; c < 16; c++) {
                const int64_t row = n0 + 16 * h + c;
                r[c] = row < n ? _mm512_maskz_loadu_epi8(km, w + row * k + k0)
                               : _mm512_setzero_si512();
            }
            transpose16(r);
            for (int64_t j = 0; j < nj; j++)
                _mm512_storeu_si512(dst + (j0 + j) * 128 + h * 64, r[j]);
        }
    }
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0;
    for (int64_t j = 0; j < quads; j++) {
        s0 = _mm512_dpbusd_epi32(s0, ones, _mm512_loadu_si512(dst + 128 * j));
        s1 = _mm512_dpbusd_epi32(s1, ones, _mm512_loadu_si512(dst + 128 * j + 64));
    }
    _mm512_storeu_si512(dst + 128 * quads, s0);
    _mm512_storeu_si512(dst + 128 * quads + 64, s1);
}

/* ---------------------------------------------------------------------------------------------
 * The tile: output rows row .. row + ROWS - 1 x the panel wp's 32 columns. Row r reads, for each
 * tap t, tq quads of codes from x + ro[r] + taps[t] (qlinear: one tap, the whole row; qconv2d: a
 * kernel row or a kernel tap of the padded band), the panel ntap * tq quads in the same order,
 * then its colsum. ro holds MR offsets whatever ROWS. POST: the stores' post-op (a constant). */
RC_INLINE void tile(const uint8_t *x, const int64_t *ro, const int64_t *taps, int64_t ntap,
                    int64_t tq, const int8_t *wp, const Out *o, int64_t row, const int ROWS,
                    const int POST)
{
    __m512i acc[MR][2];
    for (int r = 0; r < ROWS; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    const int8_t *w = wp;
    for (int64_t t = 0; t < ntap; t++) {
        const uint8_t *xr[MR];
        for (int r = 0; r < ROWS; r++)
            xr[r] = x + ro[r] + taps[t];
        for (int64_t j = 0; j < tq; j++, w += 128) {
            const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
            for (int r = 0; r < ROWS; r++) {
                int32_t v;
                memcpy(&v, xr[r] + 4 * j, sizeof v);
                const __m512i b = _mm512_set1_epi32(v);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b, w0);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b, w1);
            }
        }
    }
    const __m512i z0 = _mm512_loadu_si512(w), z1 = _mm512_loadu_si512(w + 64);
    for (int r = 0; r < ROWS; r++)
        store_row(o, row + r, acc[r][0], acc[r][1], z0, z1, POST);
}

#define RC_TILE_ARGS                                                                               \
    const uint8_t *x, const int64_t *ro, const int64_t *taps, int64_t ntap, int64_t tq,          \
        const int8_t *wp, const Out *o, int64_t row, int64_t rows
/* one function per post-op (noinline: the tile's code per row count and post-op once) */
#define RC_POST_TILES(name, post)                                                                  \
    static __attribute__((noinline)) void name(RC_TILE_ARGS)                                      \
    {                                                                                              \
        switch (rows) {                                                                            \
        case 12: tile(x, ro, taps, ntap, tq, wp, o, row, 12, post); break;                         \
        case 11: tile(x, ro, taps, ntap, tq, wp, o, row, 11, post); break;                         \
        case 10: tile(x, ro, taps, ntap, tq, wp, o, row, 10, post); break;                         \
        case 9: tile(x, ro, taps, ntap, tq, wp, o, row, 9, post); break;                           \
        case 8: tile(x, ro, taps, ntap, tq, wp, o, row, 8, post); break;                           \
        case 7: tile(x, ro, taps, ntap, tq, wp, o, row, 7, post); break;                           \
        case 6: tile(x, ro, taps, ntap, tq, wp, o, row, 6, post); break;                           \
        case 5: tile(x, ro, taps, ntap, tq, wp, o, row, 5, post); break;                           \
        case 4: tile(x, ro, taps, ntap, tq, wp, o, row, 4, post); break;                           \
        case 3: tile(x, ro, taps, ntap, tq, wp, o, row, 3, post); break;                           \
        case 2: tile(x, ro, taps, ntap, tq, wp, o, row, 2, post); break;                           \
        default: tile(x, ro, taps, ntap, tq, wp, o, row, 1, post); break;                          \
        }                                                                                          \
    }
RC_POST_TILES(tile_none, POST_NONE)
RC_POST_TILES(tile_relu, POST_RELU)
RC_POST_TILES(tile_add_relu, POST_ADD_RELU)
RC_POST_TILES(tile_gelu, POST_GELU)
RC_POST_TILES(tile_gelu_tanh, POST_GELU_TANH)
RC_POST_TILES(tile_relu_q, POST_RELU_Q)
RC_POST_TILES(tile_gelu_q, POST_GELU_Q)
RC_POST_TILES(tile_gelu_tanh_q, POST_GELU_TANH_Q)
#undef RC_POST_TILES

static void tile_any(RC_TILE_ARGS)
{
    switch (o->post) {
    case POST_RELU: tile_relu(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_ADD_RELU: tile_add_relu(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_GELU: tile_gelu(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_GELU_TANH: tile_gelu_tanh(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_RELU_Q: tile_relu_q(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_GELU_Q: tile_gelu_q(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    case POST_GELU_TANH_Q: tile_gelu_tanh_q(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    default: tile_none(x, ro, taps, ntap, tq, wp, o, row, rows); break;
    }
}
#undef RC_TILE_ARGS

/* ---------------------------------------------------------------------------------------------
 * qlinear and dynamic_qlinear. Scratch (bytes, each part a multiple of 64):
 *   wp  GEMM path only: a panel per thread, quads x 128 bytes + 128 (the colsum)
 *   xq  M rows x 4 * quads bytes: dynamic_qlinear's codes, or a static x whose K is not a
 *       multiple of 4 copied with zeros to whole quads
 *   ws, bi  np fp32 each (np = N rounded up to NR): scales and bias, zeros past N
 *   rs, zq  M rounded up to 16 fp32 / int32: dynamic_qlinear's row scales and zero points */

typedef struct {
    int8_t *wp;
    uint8_t *xq;
    float *ws, *bi, *rs;
    int32_t *zq;
    int64_t quads, np, ldq; /* ldq: xq's row length */
} Scratch;

typedef struct {
    const void *x;
    const int8_t *w;
    void *y;
    int64_t m, n, k;
    float xs;
    int32_t zp;
    int dyn, bf16, post, nt;
    Q8 q;
} Lin;

#ifdef __AMX_INT8__
#define RC_AMX 1
enum { AMX_MIN_M = 32 }; /* qlinear's GEMM runs on AMX tiles from this M (level amx) */
enum { AMX_ROWS = 256, AMX_KC = 16 }; /* a task's rows at most; k blocks of 64 a K chunk */
#else
#define RC_AMX 0
enum { AMX_MIN_M = 1 << 30, AMX_ROWS = 0 };
#endif

static int use_amx(int64_t m)
{
    return RC_AMX && m >= AMX_MIN_M;
}

/* xq's row length: whole quads (the VNNI tiles), or whole 64-byte A-tile rows (AMX) */
static int64_t xq_ld(int64_t m, int64_t k)
{
    return use_amx(m) ? round_up(k, 64) : round_up(k, 4);
}

/* a GEMM thread's buffer: its panel, quads x 128 bytes + 128 (the colsum); AMX: the panel's
 * quads to whole 16-quad B tiles, then a 32 x 32 int32 C block and a zero-padded 32-row block
 * of x (the last, partial one) */
static int64_t thread_bytes(int64_t m, int64_t k)
{
    if (use_amx(m))
        return round_up(k, 64) * 32 + 128 + AMX_ROWS * 128 + 32 * round_up(k, 64);
    return (k + 3) / 4 * 128 + 128;
}

static int64_t wp_bytes(int64_t m, int64_t k, int nt)
{
    return m > SMALL_M ? rc_threads(nt) * thread_bytes(m, k) : 0;
}

int64_t RC_FN(rc_qlinear_scratch_f32)(int64_t m, int64_t n, int64_t k, int nt)
{
    return wp_bytes(m, k, nt) + round_up(m * xq_ld(m, k), 64) +
           (int64_t)sizeof(float) * (2 * round_up(n, NR) + 2 * round_up(m, 16));
}

static Scratch carve(void *scratch, const Lin *l, const void *ws, const void *b)
{
    Scratch s;
    s.quads = (l->k + 3) / 4;
    s.np = round_up(l->n, NR);
    s.ldq = xq_ld(l->m, l->k);
    s.wp = (int8_t *)scratch;
    s.xq = (uint8_t *)scratch + wp_bytes(l->m, l->k, l->nt);
    s.ws = (float *)(s.xq + round_up(l->m * s.ldq, 64));
    s.bi = s.ws + s.np;
    s.rs = s.bi + s.np;
    s.zq = (int32_t *)(s.rs + round_up(l->m, 16));
    for (int64_t c = 0; c < s.np; c++) {
        s.ws[c] = c < l->n ? ((const float *)ws)[c] : 0.0f;
        s.bi[c] = c < l->n && b ? ((const float *)b)[c] : 0.0f;
    }
    return s;
}

/* A row of dynamic_qlinear's input (k fp32 or bf16 values) -> d: k uint8 codes, zeros up to
 * ldx; *zp its zero point; returns its scale, NaN for a row holding inf or NaN (codes 0, zp 0).
 * The reference's float32 steps (token_qparams): lo = min(row, 0), hi = max(row, 0), scale =
 * max(float32(hi - lo) / 255, FLT_EPSILON), zp = clamp(-rint(lo / scale), 0, 255), inv =
 * 1 / scale (a float32 division), q = clamp(rint(float32(x * inv)) + zp, 0, 255). */
static float quant_row(const void *x, int64_t k, int bf16, uint8_t *d, int64_t ldx, int32_t *zpo)
{
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 lo = _mm512_setzero_ps(), hi = lo;
    __mmask16 bad = 0;
    for (int64_t j = 0; j < k; j += 16) { /* masked lanes load 0: within [lo, hi] already */
        const __m512 v = rc_load_m(x, j, rc_tail16(k - j), bf16);
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
        bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_NLT_UQ); /* inf or NaN */
    }
    const float l = _mm512_reduce_min_ps(lo), h = _mm512_reduce_max_ps(hi);
    float scale = (h - l) / 255.0f;
    scale = scale > FLT_EPSILON ? scale : FLT_EPSILON;
    if (bad || !isfinite(scale)) {
        memset(d, 0, (size_t)ldx);
        *zpo = 0;
        return NAN;
    }
    const float zp = fminf(fmaxf(-rintf(l / scale), 0.0f), 255.0f);
    const __m512 inv = _mm512_set1_ps(1.0f / scale), qlo = _mm512_set1_ps(-zp);
    const __m512 qhi = _mm512_set1_ps(255.0f - zp);
    const __m512i z = _mm512_set1_epi32((int)zp);
    for (int64_t j = 0; j < k; j += 16) {
        const __mmask16 m = rc_tail16(k - j);
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(rc_load_m(x, j, m, bf16), inv), RINT);
        const __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, qlo), qhi));
        _mm512_mask_cvtepi32_storeu_epi8(d + j, m, _mm512_add_epi32(q, z));
    }
    memset(d + k, 0, (size_t)(ldx - k));
    *zpo = (int32_t)zp;
    return scale;
}

/* row r of the activation into xq: quantized (dynamic) or copied with zeros to whole quads (AMX:
 * 64-byte blocks) */
static void prep_row(const Lin *l, const Scratch *s, int64_t r)
{
    const int64_t ldx = s->ldq;
    uint8_t *d = s->xq + r * ldx;
    if (l->dyn) {
        s->rs[r] = quant_row((const char *)l->x + r * l->k * (l->bf16 ? 2 : 4), l->k, l->bf16, d,
                             ldx, s->zq + r);
    } else {
        memcpy(d, (const uint8_t *)l->x + r * l->k, (size_t)l->k);
        memset(d + l->k, 0, (size_t)(ldx - l->k));
    }
}

/* the epilogue of output columns [c0, c0 + cols) */
static Out lin_out(const Lin *l, const Scratch *s, int64_t c0, int64_t cols)
{
    const Out o = {.rs = l->dyn ? s->rs : &l->xs, .zp = l->dyn ? s->zq : &l->zp,
                   .ws = s->ws + c0, .bi = s->bi + c0, .rstep = l->dyn, .ldy = l->n,
                   .cols = cols,
                   .y = (char *)l->y + c0 * (l->post >= POST_RELU_Q ? 1 : l->bf16 ? 2 : 4),
                   .bf16 = l->bf16, .post = l->post, .q = l->q};
    return o;
}

/* Tasks (inside the parallel region): a panel of 32 output columns x a block of rb rows each;
 * the task's thread packs its panel into its own buffer wp unless its previous task had it. */
static void gemm_tasks(const Lin *l, const Scratch *s, int8_t *wp, const uint8_t *x, int64_t ldx)
{
    const int64_t rb = rc_max64(MIN_ROWS, X_BLOCK / rc_max64(ldx, 1) / MR * MR);
    const int64_t nrb = (l->m + rb - 1) / rb, tap = 0;
    int64_t packed = -1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < s->np / NR * nrb; t++) {
        const int64_t p = t / nrb, i0 = t % nrb * rb, i1 = rc_min64(l->m, i0 + rb);
        if (p != packed)
            pack_panel(l->w, l->n, l->k, p * NR, s->quads, wp);
        packed = p;
        const Out o = lin_out(l, s, p * NR, rc_min64(NR, l->n - p * NR));
        for (int64_t i = i0; i < i1; i += MR) {
            const int64_t rows = rc_min64(MR, i1 - i);
            int64_t ro[MR];
            for (int64_t r = 0; r < MR; r++)
                ro[r] = (i + rc_min64(r, rows - 1)) * ldx;
            tile_any(x, ro, &tap, 1, s->quads, wp, &o, i, rows);
        }
    }
}

/* rows [r0, r0 + rows) of raw sums (int32, ld a row, the block's 32 columns) less zp * cs,
 * through the epilogue (the post-op's code chosen once) */
static void store_block(const Out *o, const int32_t *sums, int64_t ld, int64_t r0, int64_t rows,
                        const int32_t *cs)
{
    const __m512i z0 = _mm512_loadu_si512(cs), z1 = _mm512_loadu_si512(cs + 16);
#define RC_ROWS(post)                                                                              \
    for (int64_t r = 0; r < rows; r++)                                                             \
        store_row(o, r0 + r, _mm512_loadu_si512(sums + r * ld),                                    \
                  _mm512_loadu_si512(sums + r * ld + 16), z0, z1, post);                           \
    break;
    switch (o->post) {
    case POST_RELU: RC_ROWS(POST_RELU)
    case POST_ADD_RELU: RC_ROWS(POST_ADD_RELU)
    case POST_GELU: RC_ROWS(POST_GELU)
    case POST_GELU_TANH: RC_ROWS(POST_GELU_TANH)
    case POST_RELU_Q: RC_ROWS(POST_RELU_Q)
    case POST_GELU_Q: RC_ROWS(POST_GELU_Q)
    case POST_GELU_TANH_Q: RC_ROWS(POST_GELU_TANH_Q)
    default: RC_ROWS(POST_NONE)
    }
#undef RC_ROWS
}

#if RC_AMX
/* Palette 1, tiles 0-7 of 16 rows x 64 bytes: C 0-3 (a 32 x 32 int32 block), A 4-5 (32 rows of
 * 64 codes), B 6-7 (16 quads x 16 columns: the panel's halves, rows 128 bytes apart) */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) TILE_CONFIG = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* c (32 x 32 int32, 128 bytes a row) += 32 rows of x (lda bytes apart) x the panel wp over k
 * blocks [b0, b1) of 64 codes (16 quads of the panel a block, its halves 64 bytes apart):
 * tdpbusd, u8 x s8 exact into int32; c starts at 0 when b0 is 0 */
static void amx_block(const uint8_t *x, int64_t lda, int64_t b0, int64_t b1, const int8_t *wp,
                      int32_t *c)
{
    if (b0 == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, 128);
        _tile_loadd(1, c + 16, 128);
        _tile_loadd(2, c + 16 * 32, 128);
        _tile_loadd(3, c + 16 * 32 + 16, 128);
    }
    for (int64_t b = b0; b < b1; b++) {
        _tile_loadd(4, x + b * 64, lda);
        _tile_loadd(6, wp + b * 2048, 128);
        _tile_dpbusd(0, 4, 6);
        _tile_loadd(7, wp + b * 2048 + 64, 128);
        _tile_dpbusd(1, 4, 7);
        _tile_loadd(5, x + 16 * lda + b * 64, lda);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
}

/* The AMX tasks (inside the parallel region): a panel x a block of at most AMX_ROWS rows each,
 * as gemm_tasks; x (ldx bytes a row) holds whole 64-byte blocks. K runs in chunks of AMX_KC
 * blocks, each over every 32-row block of the task with the int32 sums parked in the thread's
 * buffer (cb: rows x 32): the chunk's B tiles (16 KB) stay in L1 while the A tiles stream (whole
 * K at once read both from L2 at K = 3072: 4 KB a step of 4 tdpbusd). A last block of fewer than
 * 32 rows is read from a zero-padded copy (xt, made once per row block). */
static void amx_tasks(const Lin *l, const Scratch *s, int8_t *wp, const uint8_t *x, int64_t ldx)
{
    const int64_t kp = round_up(l->k, 64), q16 = kp / 4, kb = kp / 64;
    int32_t *cb = (int32_t *)(wp + q16 * 128 + 128);
    uint8_t *xt = (uint8_t *)(cb + AMX_ROWS * 32);
    const int64_t rb = rc_min64(AMX_ROWS, rc_max64(64, X_BLOCK / rc_max64(ldx, 1) / 32 * 32));
    const int64_t nrb = (l->m + rb - 1) / rb;
    int64_t packed = -1, copied = -1;
    _tile_loadconfig(&TILE_CONFIG);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < s->np / NR * nrb; t++) {
        const int64_t p = t / nrb, i0 = t % nrb * rb, i1 = rc_min64(l->m, i0 + rb);
        if (p != packed)
            pack_panel(l->w, l->n, l->k, p * NR, q16, wp);
        packed = p;
        for (int64_t b0 = 0; b0 == 0 || b0 < kb; b0 += AMX_KC) { /* K = 0: zero sums stored */
            for (int64_t i = i0; i < i1; i += 32) {
                const uint8_t *a = x + i * ldx;
                int64_t lda = ldx;
                if (i1 - i < 32) {
                    if (copied != i) {
                        for (int64_t r = 0; r < i1 - i; r++)
                            memcpy(xt + r * kp, a + r * ldx, (size_t)kp);
                        memset(xt + (i1 - i) * kp, 0, (size_t)((32 - (i1 - i)) * kp));
                        copied = i;
                    }
                    a = xt;
                    lda = kp;
                }
                amx_block(a, lda, b0, rc_min64(kb, b0 + AMX_KC), wp, cb + (i - i0) * 32);
            }
        }
        const Out o = lin_out(l, s, p * NR, rc_min64(NR, l->n - p * NR));
        store_block(&o, cb, 32, i0, i1 - i0, (const int32_t *)(wp + q16 * 128));
    }
    _tile_release();
}
#endif

/* One parallel region: the rows prepared where needed (dynamic codes, or a K that is not a
 * multiple of 4, for AMX of 64), then the tasks */
static void qlinear_gemm(const Lin *l, const Scratch *s)
{
    const int amx = use_amx(l->m);
    const int prep = l->dyn || l->k % (amx ? 64 : 4);
    const uint8_t *x = prep ? s->xq : (const uint8_t *)l->x;
    const int64_t ldx = prep ? s->ldq : l->k;
#pragma omp parallel num_threads(rc_threads(l->nt)) if (l->nt != 1)
    {
        int8_t *wp = s->wp + omp_get_thread_num() * thread_bytes(l->m, l->k);
        if (prep) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < l->m; r++)
                prep_row(l, s, r);
        }
#if RC_AMX
        if (amx)
            amx_tasks(l, s, wp, x, ldx);
        else
#endif
            gemm_tasks(l, s, wp, x, ldx);
    }
}

/* ---------------------------------------------------------------------------------------------
 * M <= SMALL_M: weight rows read in place */

/* the sums of a, b, c, d (16 lanes each) in lanes 0, 1, 2, 3 */
RC_INLINE __m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d)
{
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    const __m512i s =
        _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h =
        _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* acc += the u8 x s8 dot products of a and b, in acc's own register: written as the intrinsic,
 * gcc 12 kept the small-M tile's 20 sums in an array it copied through other registers (a
 * vmovdqa per vpdpbusd in the loop) */
RC_INLINE __m512i dp(__m512i acc, __m512i a, __m512i b)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* sums[r * NR + c] = sum_k x[r, k] * w[c, k] for r < ROWS, c < COLS (x rows ldx bytes apart,
 * w rows k bytes, both read in place with masked loads); CS: also cs[c] = sum_k w[c, k] */
RC_INLINE void dot_tile(const uint8_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *sums,
                        int32_t *cs, const int ROWS, const int COLS, const int CS)
{
    __m512i a[MB][NB], s[NB], wv[NB];
    const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    for (int c = 0; c < NB; c++) {
        s[c] = wv[c] = zero;
        for (int r = 0; r < MB; r++)
            a[r][c] = zero;
    }
    for (int64_t j = 0; j < k; j += 64) {
        const __mmask64 m = tail64(k - j);
        for (int c = 0; c < COLS; c++)
            wv[c] = _mm512_maskz_loadu_epi8(m, w + c * k + j);
        if (CS)
            for (int c = 0; c < COLS; c++)
                s[c] = dp(s[c], ones, wv[c]);
        for (int r = 0; r < ROWS; r++) {
            const __m512i xv = _mm512_maskz_loadu_epi8(m, x + r * ldx + j);
            for (int c = 0; c < COLS; c++)
                a[r][c] = dp(a[r][c], xv, wv[c]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        int32_t t[4];
        _mm_storeu_si128((__m128i *)t, hsum4(a[r][0], a[r][1], a[r][2], a[r][3]));
        for (int c = 0; c < COLS; c++)
            sums[r * NR + c] = t[c];
    }
    if (CS) {
        int32_t t[4];
        _mm_storeu_si128((__m128i *)t, hsum4(s[0], s[1], s[2], s[3]));
        for (int c = 0; c < COLS; c++)
            cs[c] = t[c];
    }
}

static void dot_any(const uint8_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *sums,
                    int32_t *cs, int64_t rows, int64_t cols, int first)
{
#define RC_ROWS(C, CS)                                                                             \
    switch (rows) {                                                                                \
    case 4: dot_tile(x, ldx, w, k, sums, cs, 4, C, CS); break;                                     \
    case 3: dot_tile(x, ldx, w, k, sums, cs, 3, C, CS); break;                                     \
    case 2: dot_tile(x, ldx, w, k, sums, cs, 2, C, CS); break;                                     \
    default: dot_tile(x, ldx, w, k, sums, cs, 1, C, CS); break;                                    \
    }
    if (cols == NB && first) {
        RC_ROWS(NB, 1)
    } else if (cols == NB) {
        RC_ROWS(NB, 0)
    } else {
        for (int64_t c = 0; c < cols; c++, w += k, sums++, cs++)
            RC_ROWS(1, 1)
    }
#undef RC_ROWS
}

/* output columns [c0, c0 + NR) (fewer at the end of N) for every row: sums, then the GEMM's
 * epilogue (the same stores, so both paths give the same values) */
static void small_block(const Lin *l, const Scratch *s, const uint8_t *x, int64_t ldx, int64_t c0)
{
    const Out o = lin_out(l, s, c0, rc_min64(NR, l->n - c0));
    int32_t sums[SMALL_M * NR], cs[NR];
    memset(sums, 0, sizeof sums);
    memset(cs, 0, sizeof cs);
    for (int64_t c = 0; c < o.cols; c += NB)
        for (int64_t r0 = 0; r0 < l->m; r0 += MB)
            dot_any(x + r0 * ldx, ldx, l->w + (c0 + c) * l->k, l->k, sums + r0 * NR + c, cs + c,
                    rc_min64(MB, l->m - r0), rc_min64(NB, o.cols - c), r0 == 0);
    store_block(&o, sums, NR, 0, l->m, cs);
}

static void qlinear_small(const Lin *l, const Scratch *s)
{
    const uint8_t *x = (const uint8_t *)l->x;
    int64_t ldx = l->k;
    if (l->dyn) { /* M x K: small */
        for (int64_t r = 0; r < l->m; r++)
            prep_row(l, s, r);
        x = s->xq;
        ldx = s->ldq;
    }
    RC_PARALLEL_FOR(l->nt, 1)
    for (int64_t i = 0; i < s->np / NR; i++)
        small_block(l, s, x, ldx, i * NR);
}

static void linear(const Lin *l, const void *ws, const void *b, void *scratch)
{
    const Scratch s = carve(scratch, l, ws, b);
    if (l->m > SMALL_M)
        qlinear_gemm(l, &s);
    else
        qlinear_small(l, &s);
}

int RC_FN(rc_qlinear_f32)(const void *x, const void *w, const void *ws, const void *b,
                               void *y, void *scratch, int64_t m, int64_t n, int64_t k, float xs,
                               int zp, int post, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .xs = xs, .zp = zp,
                   .post = post, .nt = nt};
    linear(&l, ws, b, scratch);
    return 1;
}

int RC_FN(rc_qlinear_q8)(const void *x, const void *w, const void *ws, const void *b, void *y,
                              void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                              int post, float inv, int ozp, int qmin, int qmax, int sgn, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .xs = xs, .zp = zp,
                   .post = post, .nt = nt, .q = {inv, ozp, qmin, qmax, sgn}};
    linear(&l, ws, b, scratch);
    return 1;
}

void RC_FN(rc_dynamic_qlinear_f32)(const void *x, const void *w, const void *ws,
                                        const void *b, void *y, void *scratch, int64_t m,
                                        int64_t n, int64_t k, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .dyn = 1, .nt = nt};
    linear(&l, ws, b, scratch);
}

void RC_FN(rc_dynamic_qlinear_bf16)(const void *x, const void *w, const void *ws,
                                         const void *b, void *y, void *scratch, int64_t m,
                                         int64_t n, int64_t k, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .dyn = 1, .bf16 = 1, .nt = nt};
    linear(&l, ws, b, scratch);
}

/* ---------------------------------------------------------------------------------------------
 * qconv2d: int8_avx2.c's implicit GEMM (bands of padded NHWC input per thread, taps read in
 * place, the OHWI weight packed once per call into panels of one group's output channels), with
 * the codes always uint8 (padded with the zero point) and 32-column panels of k quads.
 *
 * geo (int64): N H W C O G kH kW sH sW dH dW top left Ho Wo Hp Wp nchw. */

typedef struct {
    int64_t n, h, w, c, o, g, kh, kw, sh, sw, dh, dw, top, left, ho, wo, hp, wp, nchw;
    int64_t merged, cg, og, run, ntap, tq, kq, npg; /* derived: see conv_geo */
    int64_t br, nbi, band;                          /* bands */
} Geo;

static Geo conv_geo(const int64_t *v)
{
    Geo q;
    memset(&q, 0, sizeof q);
    q.n = v[0], q.h = v[1], q.w = v[2], q.c = v[3], q.o = v[4], q.g = v[5], q.kh = v[6];
    q.kw = v[7], q.sh = v[8], q.sw = v[9], q.dh = v[10], q.dw = v[11], q.top = v[12];
    q.left = v[13], q.ho = v[14], q.wo = v[15], q.hp = v[16], q.wp = v[17], q.nchw = v[18];
    q.merged = q.g == 1 && q.dw == 1;
    q.cg = q.c / q.g;
    q.og = q.o / q.g;
    q.run = q.merged ? q.kw * q.cg : q.cg; /* values a tap reads in place */
    q.ntap = q.merged ? q.kh : q.kh * q.kw;
    q.tq = (q.run + 3) / 4; /* quads a tap */
    q.kq = 4 * q.tq * q.ntap;
    q.npg = (q.og + NR - 1) / NR; /* panels a group */
    /* a band: br output rows of one image, its padded input rows in a thread's buffer: ~X_BLOCK
     * bytes (L2) */
    const int64_t most = rc_max64(1, X_BLOCK / rc_max64(q.sh * q.wp * q.c, 1));
    q.nbi = (q.ho + most - 1) / most;
    q.br = (q.ho + q.nbi - 1) / q.nbi;
    q.band = round_up(((q.br - 1) * q.sh + (q.kh - 1) * q.dh + 1) * q.wp * q.c + 64, 64);
    return q;
}

/* scratch: every panel (G x npg, each kq / 4 quads x 128 bytes + 128); per thread a staging
 * copy of a panel's 32 weight rows (runs padded to quads) and a band; the taps' offsets; the
 * weight scales and bias (O + NR fp32 each, zeros past O) */
static int64_t conv_panel_bytes(const Geo *q)
{
    return q->kq * 32 + 128;
}

static int64_t conv_stage_bytes(const Geo *q)
{
    return round_up(NR * q->kq, 64);
}

static int64_t conv_thread_bytes(const Geo *q)
{
    return conv_stage_bytes(q) + q->band;
}

int64_t RC_FN(rc_qconv2d_scratch_f32)(const void *geo, int nt)
{
    const Geo q = conv_geo((const int64_t *)geo);
    return q.g * q.npg * conv_panel_bytes(&q) + rc_threads(nt) * conv_thread_bytes(&q) +
           8 * round_up(q.ntap, 8) + 2 * 4 * round_up(q.o + NR, 16);
}

typedef struct {
    Geo q;
    const uint8_t *x;
    const int8_t *w;
    void *y;
    char *wp, *thr;
    int64_t *taps;
    float *ws, *bi;
    const float *res;
    float xs;
    int32_t zp;
    int post, res_nchw;
    Q8 oq;
} Conv;

/* row hp of image n of the padded input: the codes, padded with the zero point (Wp x C bytes) */
static void pad_row(const Conv *cv, int64_t n, int64_t hp, uint8_t *d)
{
    const Geo *q = &cv->q;
    const int64_t h = hp - q->top, c = q->c, w = q->w;
    if (h < 0 || h >= q->h) {
        memset(d, cv->zp, (size_t)(q->wp * c));
        return;
    }
    memset(d, cv->zp, (size_t)(q->left * c));
    uint8_t *e = d + q->left * c;
    if (!q->nchw) {
        memcpy(e, cv->x + (n * q->h + h) * w * c, (size_t)(w * c));
    } else {
        for (int64_t ch = 0; ch < c; ch++) {
            const uint8_t *s = cv->x + ((n * c + ch) * q->h + h) * w;
            for (int64_t i = 0; i < w; i++)
                e[i * c + ch] = s[i];
        }
    }
    memset(e + w * c, cv->zp, (size_t)((q->wp - q->left - w) * c));
}

/* the packed panel p of group g; runs that are not whole quads staged in st with zero weights */
static void conv_pack(const Conv *cv, int64_t g, int64_t p, int8_t *st, int8_t *wp)
{
    const Geo *q = &cv->q;
    const int64_t k = q->ntap * q->run, tk = q->kq / q->ntap;
    const int8_t *w = cv->w + g * q->og * k;
    int64_t n = q->og, n0 = p * NR;
    if (q->kq != k) {
        n = rc_min64(NR, q->og - p * NR);
        for (int64_t r = 0; r < n; r++)
            for (int64_t t = 0; t < q->ntap; t++) {
                int8_t *d = st + r * q->kq + t * tk;
                memcpy(d, w + (p * NR + r) * k + t * q->run, (size_t)q->run);
                memset(d + q->run, 0, (size_t)(tk - q->run));
            }
        w = st;
        n0 = 0;
    }
    pack_panel(w, n, q->kq, n0, q->kq / 4, wp);
}

/* output rows [oh0, oh1) of image n x the panel wp, the band xb holding the padded input from
 * row oh0 * sH */
static void conv_rows(const Conv *cv, const uint8_t *xb, const int8_t *wp, int64_t g, int64_t p,
                      int64_t n, int64_t oh0, int64_t oh1)
{
    const Geo *q = &cv->q;
    const int64_t c0 = g * q->og + p * NR, hw = q->ho * q->wo;
    Out o = {.rs = &cv->xs, .zp = &cv->zp, .ws = cv->ws + c0, .bi = cv->bi + c0, .rstep = 0,
             .ldy = q->o, .cols = rc_min64(NR, q->og - p * NR),
             .y = (char *)cv->y + c0 * (cv->post >= POST_RELU_Q ? 1 : 4), .bf16 = 0,
             .post = cv->post, .q = cv->oq};
    if (cv->res && !cv->res_nchw) { /* other[row, c] as y's */
        o.res = cv->res + c0;
        o.rrow = q->o;
        o.rcol = 1;
    } else if (cv->res) { /* other[n, c, pixel]: the band's rows are pixels of image n */
        o.res = cv->res + (n * q->o + c0) * hw;
        o.rbase = n * hw;
        o.rrow = 1;
        o.rcol = hw;
    }
    const int64_t i0 = (n * q->ho + oh0) * q->wo, i1 = (n * q->ho + oh1) * q->wo;
    int64_t oh = 0, ow = 0; /* from oh0 */
    for (int64_t i = i0; i < i1; i += MR) {
        const int64_t rows = rc_min64(MR, i1 - i);
        int64_t ro[MR];
        for (int64_t r = 0; r < rows; r++) {
            ro[r] = (oh * q->sh * q->wp + ow * q->sw) * q->c + g * q->cg;
            if (++ow == q->wo) {
                ow = 0;
                oh++;
            }
        }
        for (int64_t r = rows; r < MR; r++)
            ro[r] = ro[0];
        tile_any(xb, ro, cv->taps, q->ntap, q->tq, wp, &o, i, rows);
    }
}

/* One parallel region: every panel packed, then a task per (band, run of `per` panels): the
 * task's thread fills the band's padded input into its buffer, then runs its panels over it.
 * Runs of panels split a band when there are fewer than 4 bands a thread. */
static void conv_run(const Conv *cv, int nt)
{
    const Geo *q = &cv->q;
    const int64_t np = q->g * q->npg, nb = q->n * q->nbi, pb = conv_panel_bytes(q);
    const int64_t runs = rc_min64(np, rc_max64(1, (4 * rc_threads(nt) + nb - 1) / nb));
    const int64_t per = (np + runs - 1) / runs, row = q->wp * q->c;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        char *mine = cv->thr + omp_get_thread_num() * conv_thread_bytes(q);
        uint8_t *xb = (uint8_t *)mine + conv_stage_bytes(q);
#pragma omp for schedule(dynamic, 1)
        for (int64_t gp = 0; gp < np; gp++)
            conv_pack(cv, gp / q->npg, gp % q->npg, (int8_t *)mine, (int8_t *)cv->wp + gp * pb);
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < nb * runs; t++) {
            const int64_t b = t / runs, n = b / q->nbi, oh0 = b % q->nbi * q->br;
            const int64_t oh1 = rc_min64(q->ho, oh0 + q->br);
            const int64_t rows = (oh1 - 1 - oh0) * q->sh + (q->kh - 1) * q->dh + 1;
            for (int64_t j = 0; j < rows; j++)
                pad_row(cv, n, oh0 * q->sh + j, xb + j * row);
            memset(xb + rows * row, 0, 64); /* a last quad reads up to 3 bytes past the rows */
            for (int64_t gp = t % runs * per; gp < rc_min64(np, (t % runs + 1) * per); gp++)
                conv_rows(cv, xb, (const int8_t *)cv->wp + gp * pb, gp / q->npg, gp % q->npg, n,
                          oh0, oh1);
        }
    }
}

static void qconv2d(const void *x, const void *w, const void *ws, const void *b,
                    const void *other, void *y, void *scratch, const void *geo, float xs, int zp,
                    int post, int other_nchw, Q8 oq, int nt)
{
    Conv cv;
    cv.oq = oq;
    cv.q = conv_geo((const int64_t *)geo);
    const Geo *q = &cv.q;
    cv.x = x;
    cv.w = w;
    cv.y = y;
    cv.xs = xs;
    cv.zp = zp;
    cv.post = post;
    cv.res = post == POST_ADD_RELU ? other : NULL;
    cv.res_nchw = other_nchw;
    cv.wp = (char *)scratch;
    cv.thr = cv.wp + q->g * q->npg * conv_panel_bytes(q);
    cv.taps = (int64_t *)(cv.thr + rc_threads(nt) * conv_thread_bytes(q));
    cv.ws = (float *)(cv.taps + round_up(q->ntap, 8));
    cv.bi = cv.ws + round_up(q->o + NR, 16);
    for (int64_t t = 0; t < q->ntap; t++) /* merged: t = kh; else t = kh * kW + kw */
        cv.taps[t] = q->merged ? t * q->dh * q->wp * q->c
                               : ((t / q->kw) * q->dh * q->wp + (t % q->kw) * q->dw) * q->c;
    for (int64_t c = 0; c < q->o + NR; c++) {
        cv.ws[c] = c < q->o ? ((const float *)ws)[c] : 0.0f;
        cv.bi[c] = c < q->o && b ? ((const float *)b)[c] : 0.0f;
    }
    conv_run(&cv, nt);
}

int RC_FN(rc_qconv2d_f32)(const void *x, const void *w, const void *ws, const void *b,
                               const void *other, void *y, void *scratch, const void *geo,
                               float xs, int zp, int post, int other_nchw, int nt)
{
    const Q8 none = {0};
    qconv2d(x, w, ws, b, other, y, scratch, geo, xs, zp, post, other_nchw, none, nt);
    return 1;
}

int RC_FN(rc_qconv2d_q8)(const void *x, const void *w, const void *ws, const void *b, void *y,
                              void *scratch, const void *geo, float xs, int zp, int post,
                              float inv, int ozp, int qmin, int qmax, int sgn, int nt)
{
    const Q8 oq = {inv, ozp, qmin, qmax, sgn};
    qconv2d(x, w, ws, b, NULL, y, scratch, geo, xs, zp, post, 0, oq, nt);
    return 1;
}
