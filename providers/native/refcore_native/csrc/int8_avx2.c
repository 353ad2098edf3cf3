/* int8 family, AVX2 (+ FMA for the last float step): quantize_per_tensor, dequantize_per_tensor,
 * qlinear, dynamic_qlinear, qconv2d. Every float step is the reference's (refcore/ops/int8.py), so
 * integer outputs match it bit for bit.
 *
 * quantize / dequantize are flat loops over chunks of CHUNK elements (one parallel task each),
 * 32 (quantize) or 8 (dequantize) values a step; a tail goes through a small zeroed buffer, so
 * nothing outside the arrays is read or written.
 *
 * The GEMMs sum exactly in int32, on one of two paths chosen per call from the data (both give
 * the same int32 sums, so the outputs never depend on the path; the C calls return 1 when the
 * uint8 path ran, which the tests check):
 * - uint8 (vpmaddubsw), when a pair of u8 x s8 products cannot leave int16: every weight in
 *   [-64, 64] (x86_static_int8_w7's 7-bit weights: weights_7bit, a serial scan of N x K bytes
 *   that stops at the first 4 KB block holding a wider weight; then a pair is at most
 *   255 * 64 * 2 = 32640 in magnitude, for any code and zero point), or every code a tile reads
 *   <= 127 (a reduced-range activation, as torch's x86 backend quantizes on CPUs without VNNI;
 *   a pair is at most 127 * 128 * 2 = 32512): a vectorized scan of x for a byte above 127
 *   (M x K bytes: the first 64 KB serially, the rest in the GEMM's parallel region; see
 *   x_head_high), and for qconv2d with padding a zero point <= 127 (the padding is the zero
 *   point). vpmaddubsw (u8 x s8 pairs into saturating int16) is exact then. Per 4 k of 8
 *   columns: vpmaddubsw (x's 4 codes broadcast, the weight as its memory operand) + vpmaddwd
 *   with ones + vpaddd, 3 ops per 32 products (the FBGEMM / oneDNN AVX2 method), and
 *   acc = sum x * w - zp * colsum[n] after the loop (colsum from the packed panel; wrapping
 *   int32 steps, an in-range result: exact). Weights packed in k quads (one 256-bit load holds 8
 *   columns x 4 k, two a 16-column panel), K padded to quads with zero weights; x read in place
 *   (qlinear, K % 4 == 0; else rows copied with zeros to whole quads), conv bands uint8 (half
 *   the bytes of int16).
 * - int16 (vpmaddwd), any codes (and always for dynamic_qlinear, whose codes span 0..255): x - zp
 *   in [-255, 255] and w in [-128, 127] as int16 (int16 x int16 pairs -> int32), a pair of
 *   products at most 2 * 255 * 128 in magnitude: 2 x (vpmaddwd + vpaddd) per 32 products.
 * Both are bound by the vector pipes (~2.7 of these a cycle, mixed, on Zen 3). Measured on an
 * AMD EPYC Zen 3 (AVX2, no VNNI), 2 threads, interleaved medians, 7-bit codes (shared host:
 * ratios): the uint8 path is 1.0-1.6x the int16 path on qlinear's BERT shapes (M = 128: 1.0-1.3x,
 * M = 1024: 1.2-1.6x; 1.0-1.7x oneDNN's int8 linear) and 1.4-2.1x on most of ResNet-50's convs,
 * batch 4 (3 x 3: 1.4-1.8x; weighted by the network's layer counts 1.42x, 0.85x oneDNN's int8
 * convs, against 0.60x for the int16 path; see int8.py).
 * - qlinear / dynamic_qlinear, M > SMALL_M (GEMM): tasks are a panel of 16 output columns x a
 *   block of rows. The task's thread packs its panel (int16: 16 weight rows as (k, k + 1) pairs,
 *   one 256-bit load holds 8 columns x 2 k; uint8: the k quads above) into its own buffer, then
 *   sweeps the rows 6 at a time: 12 int32 accumulators, each k pair (quad) one broadcast int32
 *   of x per row. The int16 path first writes x - zp (dynamic: the row's codes q - zp) as int16
 *   rows. Scan, widening and the GEMM run in one parallel region (a region costs ~8 ms when
 *   another process holds a core).
 * - M <= SMALL_M (decode): packing the weight would cost more than using it, so weight rows are
 *   read in place and widened in registers (vpmovsxbw), 4 rows of x x 3 of w at a time, each sum
 *   reduced across its 8 lanes at the end (int16 only).
 * - qconv2d: the same 6 x 16 tiles as an implicit GEMM over padded NHWC bands (uint8 codes, or
 *   int16 x - zp), each tile row reading its window in place (see the qconv2d section).
 * The epilogue is y = float32(acc) * float32(rs * ws[n]) + b in the reference's two roundings
 * (mul_add: an FMA gave inf where the reference's overflowing product plus an infinite bias of
 * the other sign gives NaN; found by the fuzz suite), rs the activation's scale (per row for
 * dynamic_qlinear), then the post-op of the fused ops (qlinear_relu, qlinear_gelu, qconv2d_relu,
 * qconv2d_add_relu) on those fp32 registers before the one store: relu, + other then relu, gelu
 * (erf or tanh) with the fp32 GEMM epilogue's vector gelu (rc2_act of rc_gemm_avx2.h, within
 * 0.05 of gelu's fp32 tolerance: see rc_gelu_erf in rc_avx512.h). The post-op is a constant of
 * the tile's code (tile_post_w / _q: a copy per code and row count, as the fp32 GEMM's rc2_epilogue
 * hoists its switch), so the tiles without one are the same code as before. The requantizing
 * ops (qlinear_relu_quantize, qlinear_gelu_quantize, qconv2d_relu_quantize) are three more
 * post-ops whose store writes quantize_per_tensor's 1-byte codes: y = float32(acc) * s + b in
 * two roundings (their relu forms are bit-exact against the reference: no fma), the activation,
 * then quant8 (the quantize kernel's steps).
 */
#include "int8.h"
#include "rc_avx2.h"
#include "rc_gemm_avx2.h"

#include <float.h>

enum { CHUNK = 16384 };                 /* flat loops: elements per task (a multiple of 32) */
enum { NR = 16, MR = 6, SMALL_M = 16 }; /* the GEMM tile; int8.py has SMALL_M too */
enum { X_BLOCK = 1 << 18, MIN_ROWS = 64 }; /* a GEMM task's rows: ~256 KB of int16 x (L2) */
enum { MB = 4, NB = 3 };                /* the small-M tile */
/* post-op codes (int8.h; int8.py's POST) */
enum { POST_NONE = 0, POST_RELU = 1, POST_ADD_RELU = 2, POST_GELU = 3, POST_GELU_TANH = 4 };
/* the requantizing post-ops: relu / gelu / gelu (tanh), then quantize_per_tensor to 1-byte codes */
enum { POST_RELU_Q = 5, POST_GELU_Q = 6, POST_GELU_TANH_Q = 7 };

static int64_t rc_max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t round_up(int64_t a, int64_t b)
{
    return (a + b - 1) / b * b;
}

/* ---------------------------------------------------------------------------------------------
 * quantize_per_tensor */

enum { RINT = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; /* half to even, as rint */

/* rint(v * inv) clamped to [lo, hi] = [qmin - zp, qmax - zp], plus zp, as int32. vmaxps returns
 * its second operand when either is NaN: NaN -> lo -> qmin; +-inf clamp to the ends. */
RC_INLINE __m256i quant8(__m256 v, __m256 inv, __m256 lo, __m256 hi, __m256i zp)
{
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inv), RINT);
    r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
    return _mm256_add_epi32(_mm256_cvtps_epi32(r), zp);
}

/* 4 x 8 int32 (each in the output type's range) -> 32 bytes in order */
RC_INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d, int sgn)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i q = sgn ? _mm256_packs_epi16(ab, cd) : _mm256_packus_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

RC_INLINE __m256i quant32(const void *x, int64_t i, int bf16, __m256 inv, __m256 lo, __m256 hi,
                          __m256i zp, int sgn)
{
    return pack32(quant8(rc8_load(x, i, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 8, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 16, bf16), inv, lo, hi, zp),
                  quant8(rc8_load(x, i + 24, bf16), inv, lo, hi, zp), sgn);
}

static void quantize_span(const void *x, uint8_t *q, int64_t i0, int64_t i1, float inv, int zp,
                          int qmin, int qmax, int sgn, int bf16)
{
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(qmin - zp));
    const __m256 hi = _mm256_set1_ps((float)(qmax - zp));
    const __m256i vz = _mm256_set1_epi32(zp);
    int64_t i = i0;
    for (; i + 32 <= i1; i += 32)
        _mm256_storeu_si256((__m256i *)(q + i), quant32(x, i, bf16, vi, lo, hi, vz, sgn));
    if (i < i1) { /* the tail, widened to fp32 in a zeroed buffer */
        float t[32] = {0};
        uint8_t o[32];
        for (int64_t j = 0; j < i1 - i; j++)
            t[j] = rc_ld(x, i + j, bf16);
        _mm256_storeu_si256((__m256i *)o, quant32(t, 0, 0, vi, lo, hi, vz, sgn));
        memcpy(q + i, o, (size_t)(i1 - i));
    }
}

static void quantize(const void *x, void *q, int64_t n, float inv, int zp, int qmin, int qmax,
                     int sgn, int nt, int bf16)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        quantize_span(x, (uint8_t *)q, c * CHUNK, rc_min64(n, (c + 1) * CHUNK), inv, zp, qmin,
                      qmax, sgn, bf16);
}

void rc_quantize_per_tensor_f32_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                     int qmin, int qmax, int sgn, int nt)
{
    quantize(x, q, n, inv, zp, qmin, qmax, sgn, nt, 0);
}

void rc_quantize_per_tensor_bf16_avx2(const void *x, void *q, int64_t n, float inv, int zp,
                                      int qmin, int qmax, int sgn, int nt)
{
    quantize(x, q, n, inv, zp, qmin, qmax, sgn, nt, 1);
}

/* ---------------------------------------------------------------------------------------------
 * dequantize_per_tensor */

/* float32(q - zp) * s for the 8 bytes in the low half of b (q - zp is exact in int32 and fp32) */
RC_INLINE __m256 dequant8(__m128i b, __m256i zp, __m256 s, int sgn)
{
    __m256i v = sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, zp)), s);
}

static void dequantize_span(const uint8_t *q, float *y, int64_t i0, int64_t i1, float scale,
                            int zp, int sgn)
{
    const __m256i vz = _mm256_set1_epi32(zp);
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8)
        _mm256_storeu_ps(y + i, dequant8(_mm_loadl_epi64((const __m128i *)(q + i)), vz, vs, sgn));
    if (i < i1) {
        uint8_t t[16] = {0};
        memcpy(t, q + i, (size_t)(i1 - i));
        rc8_store_n(y, i, i1 - i, dequant8(_mm_loadu_si128((const __m128i *)t), vz, vs, sgn), 0);
    }
}

void rc_dequantize_per_tensor_f32_avx2(const void *q, void *y, int64_t n, float scale, int zp,
                                       int sgn, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++)
        dequantize_span((const uint8_t *)q, (float *)y, c * CHUNK, rc_min64(n, (c + 1) * CHUNK),
                        scale, zp, sgn);
}

/* ---------------------------------------------------------------------------------------------
 * The GEMM machinery of qlinear, dynamic_qlinear and qconv2d: rows of int16 activations (x - zp,
 * or the codes q - zp of dynamic_qlinear) against int8 weight rows widened to int16, or uint8
 * codes <= 127 against int8 weights in k quads, exact int32 sums, then the float tail of every
 * op:
 *   y[row, c] = float32(acc) * float32(rs[row] * ws[c]) + bi[c]  (two roundings: mul_add)
 * with rs[row] the row's activation scale (the one input_scale of the static ops, the row's own
 * scale in dynamic_qlinear; the product is rounded to float32 as the reference's s), rounded to
 * bf16 for a bf16 dynamic_qlinear. */

/* The float tail of a block of output columns: rs[row * rstep] (rstep 0: one scale for all
 * rows), NR column scales and biases readable from ws / bi (zeros past the last column), y at
 * the block's first column (ldy elements a row, fp32 or bf16), cols columns written; then the
 * post-op (fp32 outputs only), POST_ADD_RELU reading other's value of (row, column c of the
 * block) at res + (row - rbase) * rrow + c * rcol (res NULL for the other codes). */
typedef struct {
    float inv;  /* float32(1 / output_scale) */
    int zp, qmin, qmax, sgn; /* the output's zero point and range; sgn: int8, else uint8 codes */
} Q8;

typedef struct {
    const float *rs, *ws, *bi;
    int64_t rstep, ldy, cols;
    void *y;
    int bf16, post;
    const float *res;
    int64_t rbase, rrow, rcol;
    Q8 q; /* the requantizing post-ops' output codes (y: bytes) */
} Out;

/* other's values of output row `row`, columns [c, c + n) of the block, in lanes [0, n) (zeros
 * past them; n >= 1): a (masked) load where they are contiguous, else one value at a time */
RC_INLINE __m256 res8(const Out *o, int64_t row, int64_t c, int64_t n)
{
    const float *r = o->res + (row - o->rbase) * o->rrow + c * o->rcol;
    if (o->rcol == 1)
        return rc2_load_n(r, 0, n, 0);
    float t[8] = {0};
    for (int64_t j = 0; j < rc_min64(n, 8); j++)
        t[j] = r[j * o->rcol];
    return _mm256_loadu_ps(t);
}

/* the post-op `post` (a constant once inlined) on v, columns [c, c + n) of row `row` (n >= 1) */
RC_INLINE __m256 post8(const Out *o, __m256 v, int64_t row, int64_t c, int64_t n, const int post)
{
    switch (post) {
    case POST_RELU:
    case POST_RELU_Q: return rc2_act(v, RC_ACT_RELU); /* NaN stays NaN (then quantizes to qmin) */
    case POST_ADD_RELU: return rc2_act(_mm256_add_ps(v, res8(o, row, c, n)), RC_ACT_RELU);
    case POST_GELU:
    case POST_GELU_Q: return rc2_act(v, RC_ACT_GELU);
    case POST_GELU_TANH:
    case POST_GELU_TANH_Q: return rc2_act(v, RC_ACT_GELU_TANH);
    default: return v;
    }
}

/* post8 with o's post-op read at run time (the small-M path: a switch per few outputs) */
static __m256 post8_any(const Out *o, __m256 v, int64_t row, int64_t c, int64_t n)
{
    switch (o->post) {
    case POST_RELU: return post8(o, v, row, c, n, POST_RELU);
    case POST_ADD_RELU: return post8(o, v, row, c, n, POST_ADD_RELU);
    case POST_GELU: return post8(o, v, row, c, n, POST_GELU);
    case POST_GELU_TANH: return post8(o, v, row, c, n, POST_GELU_TANH);
    case POST_RELU_Q: return post8(o, v, row, c, n, POST_RELU_Q);
    case POST_GELU_Q: return post8(o, v, row, c, n, POST_GELU_Q);
    case POST_GELU_TANH_Q: return post8(o, v, row, c, n, POST_GELU_TANH_Q);
    default: return v;
    }
}

/* 16 bytes of each weight row c0 + c (c < 8) from k0: zeros for rows past n and k past K */
static void load_rows8_tail(const int8_t *w, int64_t n, int64_t k, int64_t c0, int64_t k0,
                            __m128i r[8])
{
    const int64_t kk = rc_min64(16, k - k0);
    for (int64_t c = 0; c < 8; c++) {
        int8_t t[16] = {0};
        if (c0 + c < n)
            memcpy(t, w + (c0 + c) * k + k0, (size_t)kk);
        r[c] = _mm_loadu_si128((const __m128i *)t);
    }
}

/* 8 x 8 transpose of 16-bit elements: r[c] holds row c's 8 k pairs; pair j of rows 0..7, widened
 * to int16, goes to dst + 32 * j for j < nj */
RC_INLINE void transpose_store(const __m128i r[8], int16_t *dst, int64_t nj)
{
    __m128i t[8], u[8], o[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) { /* i: rows 0-3, then 4-7 */
        u[4 * i] = _mm_unpacklo_epi32(t[4 * i], t[4 * i + 2]);     /* pairs 0, 1 */
        u[4 * i + 1] = _mm_unpackhi_epi32(t[4 * i], t[4 * i + 2]); /* pairs 2, 3 */
        u[4 * i + 2] = _mm_unpacklo_epi32(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm_unpackhi_epi32(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        o[2 * i] = _mm_unpacklo_epi64(u[i], u[i + 4]);
        o[2 * i + 1] = _mm_unpackhi_epi64(u[i], u[i + 4]);
    }
    for (int64_t j = 0; j < nj; j++)
        _mm256_storeu_si256((__m256i *)(dst + 32 * j), _mm256_cvtepi8_epi16(o[j]));
}

/* Panel of weight rows [n0, n0 + 16) of an (n, k) matrix: dst[(j * 2 + h) * 16 + 2 * c + e] =
 * w[n0 + 8h + c, 2j + e] as int16, for j < pairs (zeros past n and k). Whole 8 x 16-byte blocks
 * are loaded in place, the rest through zeroed buffers. */
static void pack_panel(const int8_t *w, int64_t n, int64_t k, int64_t n0, int64_t pairs,
                       int16_t *dst)
{
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        const int64_t j0 = k0 / 2, nj = rc_min64(8, pairs - j0);
        for (int64_t h = 0; h < 2; h++) {
            const int64_t c0 = n0 + 8 * h;
            __m128i r[8];
            if (c0 + 8 <= n && k0 + 16 <= k) {
                for (int c = 0; c < 8; c++)
                    r[c] = _mm_loadu_si128((const __m128i *)(w + (c0 + c) * k + k0));
            } else {
                load_rows8_tail(w, n, k, c0, k0, r);
            }
            transpose_store(r, dst + j0 * 32 + h * 16, nj);
        }
    }
}

/* Panel of weight rows [n0, n0 + 16) of an (n, k) matrix in k quads: dst[j * 64 + h * 32 + 4 * c
 * + e] = w[n0 + 8h + c, 4j + e] for j < quads (zeros past n and k; one 256-bit load holds 8
 * columns x 4 k), then at dst + 64 * quads the 16 columns' zp * colsum as int32 (colsum[c] = the
 * sum of column c's weights, wrapping int32 steps: the tile subtracts it from an in-range sum).
 * Whole 8 x 16-byte blocks are loaded in place, the rest through zeroed buffers (load_rows8_tail:
 * k0 < k as 4 * quads <= k + 3). */
static void pack_panel_q(const int8_t *w, int64_t n, int64_t k, int64_t n0, int64_t quads,
                         int zp, int8_t *dst)
{
    for (int64_t k0 = 0; k0 < 4 * quads; k0 += 16) {
        const int64_t j0 = k0 / 4, nj = rc_min64(4, quads - j0);
        for (int64_t h = 0; h < 2; h++) {
            const int64_t c0 = n0 + 8 * h;
            __m128i r[8], o[8];
            if (c0 + 8 <= n && k0 + 16 <= k) {
                for (int c = 0; c < 8; c++)
                    r[c] = _mm_loadu_si128((const __m128i *)(w + (c0 + c) * k + k0));
            } else {
                load_rows8_tail(w, n, k, c0, k0, r);
            }
            for (int i = 0; i < 8; i += 4) { /* 4 x 4 transposes of 32-bit quads */
                const __m128i t0 = _mm_unpacklo_epi32(r[i], r[i + 1]);
                const __m128i t1 = _mm_unpackhi_epi32(r[i], r[i + 1]);
                const __m128i t2 = _mm_unpacklo_epi32(r[i + 2], r[i + 3]);
                const __m128i t3 = _mm_unpackhi_epi32(r[i + 2], r[i + 3]);
                o[i] = _mm_unpacklo_epi64(t0, t2); /* quad 0 of rows i .. i + 3 */
                o[i + 1] = _mm_unpackhi_epi64(t0, t2);
                o[i + 2] = _mm_unpacklo_epi64(t1, t3);
                o[i + 3] = _mm_unpackhi_epi64(t1, t3);
            }
            for (int64_t j = 0; j < nj; j++) {
                int8_t *d = dst + (j0 + j) * 64 + h * 32;
                _mm_storeu_si128((__m128i *)d, o[j]);
                _mm_storeu_si128((__m128i *)(d + 16), o[4 + j]);
            }
        }
    }
    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    for (int64_t j = 0; j < quads; j++) { /* 1 * w pairs: no saturation */
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(dst + 64 * j));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(dst + 64 * j + 32));
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, w0), one16));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, w1), one16));
    }
    const __m256i z = _mm256_set1_epi32(zp);
    _mm256_storeu_si256((__m256i *)(dst + 64 * quads), _mm256_mullo_epi32(s0, z));
    _mm256_storeu_si256((__m256i *)(dst + 64 * quads + 32), _mm256_mullo_epi32(s1, z));
}

/* 1 when a byte of x[0, n) is above 127 (the uint8 tiles need every code <= 127) */
static int any_high(const uint8_t *x, int64_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a = _mm256_or_si256(a, _mm256_loadu_si256((const __m256i *)(x + i)));
        b = _mm256_or_si256(b, _mm256_loadu_si256((const __m256i *)(x + i + 32)));
    }
    int r = _mm256_movemask_epi8(_mm256_or_si256(a, b)) != 0;
    for (; i < n; i++)
        r |= x[i] > 127;
    return r;
}

/* 1 when every int8 weight of w[0, n) is in [-64, 64]: |w| as unsigned bytes (|-128| is 128),
 * their maximum against 64 */
static int weights_7bit_block(const int8_t *w, int64_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a = _mm256_max_epu8(a, _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(w + i))));
        b = _mm256_max_epu8(b, _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(w + i + 32))));
    }
    const __m256i over = _mm256_cmpeq_epi8(_mm256_max_epu8(_mm256_max_epu8(a, b),
                                                           _mm256_set1_epi8(64)),
                                           _mm256_set1_epi8(64));
    int ok = _mm256_movemask_epi8(over) == -1;
    for (; i < n; i++)
        ok &= w[i] >= -64 && w[i] <= 64;
    return ok;
}

/* 1 when every int8 weight of w[0, n) is in [-64, 64] (7-bit weights, x86_static_int8_w7's):
 * then a pair of u8 x s8 products is at most 255 * 64 * 2 = 32640 in magnitude, so the uint8
 * tiles are exact for any activation code and any zero point. A serial scan in blocks of 4 KB,
 * ending at the first block holding a wider weight (full-range weights: the first block): up to
 * N x K bytes against the GEMM's M x N x K. */
static int weights_7bit(const int8_t *w, int64_t n)
{
    for (int64_t i = 0; i < n; i += 4096)
        if (!weights_7bit_block(w + i, rc_min64(4096, n - i)))
            return 0;
    return 1;
}

/* The scan of x for a code above 127 (the uint8 tiles need every code <= 127) is in two parts.
 * Before the parallel region, serially, its first X_HEAD bytes (x_head_high): full-range codes
 * show one there, and the call takes the int16 tiles with no scan and no extra barrier in the
 * region (as before the uint8 path). The rest, when there is one and no code above 127 was
 * found, in the region (any_high_omp). */
enum { X_HEAD = 4 * CHUNK };

static int x_head_high(const uint8_t *x, int64_t n)
{
    return any_high(x, rc_min64(n, X_HEAD));
}

/* 1 when a byte of x[X_HEAD, n) is above 127 (n > X_HEAD): a worksharing loop of the caller's
 * parallel region (every thread calls it; the result is every thread's; *shared is 0 before the
 * region). A thread skips its chunks after its first hit. */
static int any_high_omp(const uint8_t *x, int64_t n, int *shared)
{
    const int64_t chunk = X_HEAD;
    int hit = 0;
#pragma omp for schedule(static) nowait
    for (int64_t c = 1; c < (n + chunk - 1) / chunk; c++)
        if (!hit)
            hit = any_high(x + c * chunk, rc_min64(chunk, n - c * chunk));
    if (hit) {
#pragma omp atomic write
        *shared = 1;
    }
#pragma omp barrier
    int r;
#pragma omp atomic read
    r = *shared;
    return r;
}

/* an int32 holding x[2j], x[2j + 1] (int16), in every lane */
RC_INLINE __m256i pair_at(const int16_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

/* lanes [0, n) of v to element i of y (n may be <= 0 or >= 8) */
RC_INLINE void store_upto(void *y, int64_t i, int64_t n, __m256 v, int bf16)
{
    if (n >= 8)
        rc8_store(y, i, v, bf16);
    else if (n > 0)
        rc8_store_n(y, i, n, v, bf16);
}

/* float32(acc) * s + b with both roundings (the reference's steps): the empty asm keeps gcc
 * (-ffp-contract=fast) from fusing the two into one fma */
RC_INLINE __m256 mul_add(__m256 acc, __m256 s, __m256 b)
{
    __m256 p = _mm256_mul_ps(acc, s);
    __asm__("" : "+x"(p));
    return _mm256_add_ps(p, b);
}

/* mul_add on one float */
RC_INLINE float mul_add1(float acc, float s, float b)
{
    float p = acc * s;
    __asm__("" : "+x"(p));
    return p + b;
}

/* y0, y1 (16 fp32) -> their quantize_per_tensor codes, the first n bytes stored at d (n >= 1):
 * quant8's steps (those of the quantize kernel), packed without saturating (codes in range) */
RC_INLINE void store_codes16(const Q8 *q, uint8_t *d, int64_t n, __m256 y0, __m256 y1)
{
    const __m256 inv = _mm256_set1_ps(q->inv), lo = _mm256_set1_ps((float)(q->qmin - q->zp));
    const __m256 hi = _mm256_set1_ps((float)(q->qmax - q->zp));
    const __m256i zp = _mm256_set1_epi32(q->zp);
    const __m256i p = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(quant8(y0, inv, lo, hi, zp), quant8(y1, inv, lo, hi, zp)), 0xd8);
    const __m128i a = _mm256_castsi256_si128(p), b = _mm256_extracti128_si256(p, 1);
    const __m128i c = q->sgn ? _mm_packs_epi16(a, b) : _mm_packus_epi16(a, b);
    if (n >= 16) {
        _mm_storeu_si128((__m128i *)d, c);
    } else {
        uint8_t t[16];
        _mm_storeu_si128((__m128i *)t, c);
        memcpy(d, t, (size_t)n);
    }
}

/* a requantizing post-op's row: y = float32(acc) * float32(rs * ws[c]) + bi[c] (two roundings,
 * as every row: the relu forms are bit-exact), the activation, then the codes */
RC_INLINE void store_row16_q(const Out *o, int64_t row, __m256i a0, __m256i a1, const int post)
{
    const __m256 s = _mm256_set1_ps(o->rs[row * o->rstep]);
    __m256 y0 = mul_add(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(s, _mm256_loadu_ps(o->ws)),
                        _mm256_loadu_ps(o->bi));
    __m256 y1 = mul_add(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(s, _mm256_loadu_ps(o->ws + 8)),
                        _mm256_loadu_ps(o->bi + 8));
    y0 = post8(o, y0, row, 0, o->cols, post);
    y1 = post8(o, y1, row, 8, o->cols, post); /* n unused by these post-ops */
    store_codes16(&o->q, (uint8_t *)o->y + row * o->ldy, o->cols, y0, y1);
}

RC_INLINE void store_row16(const Out *o, int64_t row, __m256i a0, __m256i a1, const int post)
{
    if (post >= POST_RELU_Q) {
        store_row16_q(o, row, a0, a1, post);
        return;
    }
    const __m256 s = _mm256_set1_ps(o->rs[row * o->rstep]);
    __m256 y0 = mul_add(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(s, _mm256_loadu_ps(o->ws)),
                        _mm256_loadu_ps(o->bi));
    __m256 y1 = mul_add(_mm256_cvtepi32_ps(a1), _mm256_mul_ps(s, _mm256_loadu_ps(o->ws + 8)),
                        _mm256_loadu_ps(o->bi + 8));
    if (post != POST_NONE) {
        y0 = post8(o, y0, row, 0, o->cols, post);
        if (o->cols > 8)
            y1 = post8(o, y1, row, 8, o->cols - 8, post);
    }
    store_upto(o->y, row * o->ldy, o->cols, y0, o->bf16);
    store_upto(o->y, row * o->ldy + 8, o->cols - 8, y1, o->bf16);
}

/* acc += p in acc's own register: written as an intrinsic, gcc 12 added into p's register and
 * copied it back (8 vmovdqa a k pair in the 4 x 16 loop, ~1 / 4 of its instructions), and at 6
 * rows spilled accumulators */
RC_INLINE __m256i acc_add(__m256i acc, __m256i p)
{
    __asm__("vpaddd %1, %0, %0" : "+x"(acc) : "x"(p));
    return acc;
}

#define RC_ACC(r)                                                                                  \
    if (ROWS > r) {                                                                                \
        const __m256i b = pair_at(x##r + 2 * j);                                                   \
        a##r##0 = acc_add(a##r##0, _mm256_madd_epi16(b, w0));                                      \
        a##r##1 = acc_add(a##r##1, _mm256_madd_epi16(b, w1));                                      \
    }
#define RC_OUT(r)                                                                                  \
    if (ROWS > r)                                                                                  \
        store_row16(o, row + (r), a##r##0, a##r##1, POST);
/* The int16 tile. Output rows row .. row + ROWS - 1 x the panel wp's 16 columns: row r reads,
 * for each tap t, tp pairs from x + ro[r] + taps[t] (qlinear: one tap, the whole row; qconv2d: a
 * kernel row or a kernel tap of the padded input), the panel ntap * tp pairs in the same order.
 * ro holds MR offsets whatever ROWS. 6 rows: 12 accumulators, 2 weight vectors, a broadcast and a
 * product, all 16 ymm registers (acc_add keeps gcc from spilling; the loop is 12 vpmaddwd + 12
 * vpaddd + 6 broadcasts + 2 loads + 5 scalar ops a k pair against 8 + 8 + 4 + 2 + 5 at 4 rows:
 * ~10% fewer instructions per product, and Zen 3's 6-wide dispatch is the limit there; single
 * thread, interleaved with oneDNN: qlinear 0.71-0.76x -> 0.78-0.91x, qconv2d about the same).
 * POST: the post-op of the stores (a constant). */
RC_INLINE void tile_w(const void *xv, const int64_t *ro, const int64_t *taps, int64_t ntap,
                      int64_t tp, const void *wv, const Out *o, int64_t row, const int ROWS,
                      const int POST)
{
    const int16_t *x = (const int16_t *)xv, *wp = (const int16_t *)wv;
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
    __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00;
    __m256i a51 = a00;
    for (int64_t t = 0; t < ntap; t++, wp += 32 * tp) {
        const int16_t *x0 = x + ro[0] + taps[t], *x1 = x + ro[1] + taps[t];
        const int16_t *x2 = x + ro[2] + taps[t], *x3 = x + ro[3] + taps[t];
        const int16_t *x4 = x + ro[4] + taps[t], *x5 = x + ro[5] + taps[t];
        for (int64_t j = 0; j < tp; j++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wp + 32 * j));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(wp + 32 * j + 16));
            RC_ACC(0) RC_ACC(1) RC_ACC(2) RC_ACC(3) RC_ACC(4) RC_ACC(5)
        }
    }
    RC_OUT(0) RC_OUT(1) RC_OUT(2) RC_OUT(3) RC_OUT(4) RC_OUT(5)
}
#undef RC_ACC

/* an int32 holding x[4j .. 4j + 3] (uint8), in every lane (vpbroadcastd from memory) */
RC_INLINE __m256i quad_at(const uint8_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

/* acc[c] += sum_e b[e] * w[4c + e] for 8 columns c (b: 4 codes <= 127 in every lane; w: the 8
 * columns' 4 int8 weights, read as the memory operand of vpmaddubsw): each pair of products is
 * at most 127 * 128 * 2 = 32512 in magnitude, so vpmaddubsw's int16 never saturates, and
 * vpmaddwd with ones adds the two pairs exactly into int32. One asm block: the weight stays a
 * memory operand (two more live registers would spill an accumulator) and the sum lands in
 * acc's own register (acc_add's reason). */
RC_INLINE __m256i quad_add(__m256i acc, __m256i b, const int8_t *w, __m256i ones)
{
    __m256i t;
    __asm__("vpmaddubsw %[w], %[b], %[t]\n\t"
            "vpmaddwd %[one], %[t], %[t]\n\t"
            "vpaddd %[t], %[a], %[a]"
            : [a] "+x"(acc), [t] "=&x"(t)
            : [b] "x"(b), [w] "m"(*(const __m256i *)w), [one] "x"(ones));
    return acc;
}

#define RC_QACC(r)                                                                                 \
    if (ROWS > r) {                                                                                \
        const __m256i b = quad_at(x##r + 4 * j);                                                   \
        a##r##0 = quad_add(a##r##0, b, w, ones);                                                   \
        a##r##1 = quad_add(a##r##1, b, w + 32, ones);                                              \
    }
#define RC_ZP(r)                                                                                   \
    if (ROWS > r) {                                                                                \
        a##r##0 = _mm256_sub_epi32(a##r##0, z0);                                                   \
        a##r##1 = _mm256_sub_epi32(a##r##1, z1);                                                   \
    }
/* The uint8 tile (every code read <= 127): tile_w's rows, taps and stores over uint8 x read in
 * place and a panel of k quads (pack_panel_q): tq quads a tap, then the 16 columns' zp * colsum
 * (int32) after the ntap * tq quads. acc = sum x * w - zp * colsum = sum (x - zp) * w, exact in
 * int32 (wrapping steps, an in-range result), the same acc as tile_w's. The loop: 12 (vpmaddubsw
 * + vpmaddwd + vpaddd) + 6 broadcasts + 5 scalar ops a k quad, against tile_w's 2 x (12 + 12 + 6
 * + 2 + 5). */
RC_INLINE void tile_q(const void *xv, const int64_t *ro, const int64_t *taps, int64_t ntap,
                      int64_t tq, const void *wv, const Out *o, int64_t row, const int ROWS,
                      const int POST)
{
    const uint8_t *x = (const uint8_t *)xv;
    const int8_t *wp = (const int8_t *)wv;
    const int32_t *zc = (const int32_t *)(wp + ntap * tq * 64);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
    __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00;
    __m256i a51 = a00;
    for (int64_t t = 0; t < ntap; t++, wp += 64 * tq) {
        const uint8_t *x0 = x + ro[0] + taps[t], *x1 = x + ro[1] + taps[t];
        const uint8_t *x2 = x + ro[2] + taps[t], *x3 = x + ro[3] + taps[t];
        const uint8_t *x4 = x + ro[4] + taps[t], *x5 = x + ro[5] + taps[t];
        for (int64_t j = 0; j < tq; j++) {
            const int8_t *w = wp + 64 * j;
            RC_QACC(0) RC_QACC(1) RC_QACC(2) RC_QACC(3) RC_QACC(4) RC_QACC(5)
        }
    }
    const __m256i z0 = _mm256_loadu_si256((const __m256i *)zc);
    const __m256i z1 = _mm256_loadu_si256((const __m256i *)(zc + 8));
    RC_ZP(0) RC_ZP(1) RC_ZP(2) RC_ZP(3) RC_ZP(4) RC_ZP(5)
    RC_OUT(0) RC_OUT(1) RC_OUT(2) RC_OUT(3) RC_OUT(4) RC_OUT(5)
}
#undef RC_QACC
#undef RC_ZP
#undef RC_OUT

#define RC_TILE_ARGS                                                                               \
    const void *x, const int64_t *ro, const int64_t *taps, int64_t ntap, int64_t tp,            \
        const void *wp, const Out *o, int64_t row, int64_t rows
#define RC_TILES(tile, post)                                                                       \
    switch (rows) {                                                                                \
    case 6: tile(x, ro, taps, ntap, tp, wp, o, row, 6, post); break;                               \
    case 5: tile(x, ro, taps, ntap, tp, wp, o, row, 5, post); break;                               \
    case 4: tile(x, ro, taps, ntap, tp, wp, o, row, 4, post); break;                               \
    case 3: tile(x, ro, taps, ntap, tp, wp, o, row, 3, post); break;                               \
    case 2: tile(x, ro, taps, ntap, tp, wp, o, row, 2, post); break;                               \
    default: tile(x, ro, taps, ntap, tp, wp, o, row, 1, post); break;                              \
    }

/* the tiles with a post-op: out of line, so tile_any_w / _q (no post-op) stay small (with every
 * post-op's code inside it, tile_any stayed a call per tile: +4% instructions for plain qconv2d,
 * callgrind). One function per post-op and tile kind: with all seven post-ops' 42 tiles in one
 * function gcc 12 moved the accumulators through ymm0 and spilled one in every inner loop (the
 * fused convs ran 1.3-1.7x slower than plain qconv2d, Zen 3). tile_any_w is a function of its
 * own (a call per tile, as before the uint8 path): forced inline into conv_run's parallel region,
 * the 6-row loop had 15 ymm registers (the region keeps a store-mask constant in ymm15) and
 * spilled an accumulator every k pair (a load, vpaddd, store chain: the int16 qconv2d ran
 * 1.1-1.4x slower, Zen 3). tile_any_q inlines without a spill (measured no slower that way). */
#define RC_POST_TILES(name, tile, post)                                                            \
    static __attribute__((noinline)) void name(RC_TILE_ARGS)                                      \
    {                                                                                              \
        RC_TILES(tile, post)                                                                       \
    }
/* a tile kind's post-op tiles, its dispatch on o->post and its tile_any_<k> (the no post-op
 * tiles inline in it; ATTR its storage and inlining) */
#define RC_TILE_KIND(k, ATTR)                                                                      \
    RC_POST_TILES(tile_##k##_relu, tile_##k, POST_RELU)                                            \
    RC_POST_TILES(tile_##k##_add_relu, tile_##k, POST_ADD_RELU)                                    \
    RC_POST_TILES(tile_##k##_gelu, tile_##k, POST_GELU)                                            \
    RC_POST_TILES(tile_##k##_gelu_tanh, tile_##k, POST_GELU_TANH)                                  \
    RC_POST_TILES(tile_##k##_relu_q, tile_##k, POST_RELU_Q)                                        \
    RC_POST_TILES(tile_##k##_gelu_q, tile_##k, POST_GELU_Q)                                        \
    RC_POST_TILES(tile_##k##_gelu_tanh_q, tile_##k, POST_GELU_TANH_Q)                              \
    static void tile_post_##k(RC_TILE_ARGS)                                                        \
    {                                                                                              \
        switch (o->post) {                                                                         \
        case POST_RELU: tile_##k##_relu(x, ro, taps, ntap, tp, wp, o, row, rows); break;           \
        case POST_ADD_RELU: tile_##k##_add_relu(x, ro, taps, ntap, tp, wp, o, row, rows); break;   \
        case POST_GELU: tile_##k##_gelu(x, ro, taps, ntap, tp, wp, o, row, rows); break;           \
        case POST_GELU_TANH: tile_##k##_gelu_tanh(x, ro, taps, ntap, tp, wp, o, row, rows); break; \
        case POST_RELU_Q: tile_##k##_relu_q(x, ro, taps, ntap, tp, wp, o, row, rows); break;       \
        case POST_GELU_Q: tile_##k##_gelu_q(x, ro, taps, ntap, tp, wp, o, row, rows); break;       \
        default: tile_##k##_gelu_tanh_q(x, ro, taps, ntap, tp, wp, o, row, rows); break;           \
        }                                                                                          \
    }                                                                                              \
    ATTR void tile_any_##k(RC_TILE_ARGS)                                                           \
    {                                                                                              \
        if (o->post != POST_NONE) {                                                                \
            tile_post_##k(x, ro, taps, ntap, tp, wp, o, row, rows);                                \
            return;                                                                                \
        }                                                                                          \
        RC_TILES(tile_##k, POST_NONE)                                                              \
    }
RC_TILE_KIND(w, static __attribute__((noinline)))
RC_TILE_KIND(q, RC_INLINE)
#undef RC_TILE_KIND
#undef RC_POST_TILES
#undef RC_TILES
#undef RC_TILE_ARGS

/* ---------------------------------------------------------------------------------------------
 * qlinear and dynamic_qlinear: scratch layout (offsets in bytes; every part a multiple of 32
 * bytes long)
 *   wp  GEMM path only: a panel per thread, the larger of P pairs x 32 int16 (P = ceil(K / 2);
 *       odd K: a zero k) and Q quads x 64 bytes + 64 (the uint8 path's, Q = ceil(K / 4))
 *   xw  M rows x kx int16: x - zp (or q - zp), zeros from K to kx = K rounded up to 16; on the
 *       uint8 path, when K % 4 != 0, M rows x 4Q bytes of x, zeros from K
 *   ws  np fp32: the weight scales, zeros past N (np = N rounded up to NR)
 *   bi  np fp32: the bias, zeros past N or without one
 *   rs  M rounded up to 8 fp32: dynamic_qlinear's row scales */

typedef struct {
    int16_t *wp, *xw;
    float *ws, *bi, *rs;
    int64_t kx, pairs, quads, np;
} Scratch;

/* A call: x uint8 (static: scale xs, zero point zp) or fp32 / bf16 (dyn: quantized per row) */
typedef struct {
    const void *x;
    const int8_t *w;
    void *y;
    int64_t m, n, k;
    float xs;
    int zp, dyn, bf16, post, nt;
    Q8 q; /* requantizing post-ops: y holds 1-byte codes */
} Lin;

/* a thread's panel: int16 pairs or uint8-path quads, whichever is longer */
static int64_t panel1_bytes(int64_t k)
{
    return rc_max64((k + 1) / 2 * 32 * (int64_t)sizeof(int16_t), (k + 3) / 4 * 64 + 64);
}

static int64_t panel_bytes(int64_t m, int64_t k, int nt)
{
    return m > SMALL_M ? rc_threads(nt) * panel1_bytes(k) : 0;
}

static Scratch carve(void *scratch, const Lin *l, const void *ws, const void *b)
{
    Scratch s;
    s.kx = round_up(l->k, 16);
    s.pairs = (l->k + 1) / 2;
    s.quads = (l->k + 3) / 4;
    s.np = round_up(l->n, NR);
    s.wp = (int16_t *)scratch;
    s.xw = (int16_t *)((char *)scratch + panel_bytes(l->m, l->k, l->nt));
    s.ws = (float *)(s.xw + l->m * s.kx);
    s.bi = s.ws + s.np;
    s.rs = s.bi + s.np;
    for (int64_t c = 0; c < s.np; c++) {
        s.ws[c] = c < l->n ? ((const float *)ws)[c] : 0.0f;
        s.bi[c] = c < l->n && b ? ((const float *)b)[c] : 0.0f;
    }
    return s;
}

int64_t rc_qlinear_scratch_f32_avx2(int64_t m, int64_t n, int64_t k, int nt)
{
    return panel_bytes(m, k, nt) + (int64_t)sizeof(int16_t) * m * round_up(k, 16) +
           (int64_t)sizeof(float) * (2 * round_up(n, NR) + round_up(m, 8));
}

/* row of x (k bytes) -> k int16 x - zp, then zeros up to kx */
static void widen_row(const uint8_t *x, int16_t *d, int64_t k, int64_t kx, int zp)
{
    const __m256i z = _mm256_set1_epi16((short)zp);
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(x + j)));
        _mm256_storeu_si256((__m256i *)(d + j), _mm256_sub_epi16(v, z));
    }
    for (; j < k; j++)
        d[j] = (int16_t)(x[j] - zp);
    for (; j < kx; j++)
        d[j] = 0;
}

RC_INLINE float hmin8(__m256 v)
{
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
}

/* 8 codes q - zp = clamp(rint(x * inv), -zp, 255 - zp) (lo, hi), as int32 */
RC_INLINE __m256i code8(__m256 v, __m256 inv, __m256 lo, __m256 hi)
{
    __m256 r = _mm256_round_ps(_mm256_mul_ps(v, inv), RINT);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
}

/* A row of dynamic_qlinear's input (k fp32 or bf16 values) -> d: k int16 codes q - zp, zeros up
 * to kx; returns the row's scale, NaN for a row holding inf or NaN (d then all zeros). The
 * reference's float32 steps (token_qparams): lo = min(row, 0), hi = max(row, 0), scale =
 * max(float32(hi - lo) / 255, FLT_EPSILON), zp = clamp(-rint(lo / scale), 0, 255), inv =
 * 1 / scale (a float32 division), q = clamp(rint(float32(x * inv)) + zp, 0, 255). */
static float quant_row(const void *x, int64_t k, int bf16, int16_t *d, int64_t kx)
{
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 lo = _mm256_setzero_ps(), hi = lo, bad = lo;
    int64_t j = 0;
    for (; j < k; j += 8) { /* a tail's missing lanes are 0: within [lo, hi] already */
        const __m256 v = j + 8 <= k ? rc8_load(x, j, bf16) : rc8_load_n(x, j, k - j, bf16);
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(rc8_abs(v), inf, _CMP_NLT_UQ)); /* inf or NaN */
    }
    const float l = hmin8(lo), h = rc8_hmax(hi);
    float scale = (h - l) / 255.0f;
    scale = scale > FLT_EPSILON ? scale : FLT_EPSILON;
    if (_mm256_movemask_ps(bad) || !isfinite(scale)) {
        memset(d, 0, (size_t)kx * sizeof *d);
        return NAN;
    }
    const float zp = fminf(fmaxf(-rintf(l / scale), 0.0f), 255.0f);
    const __m256 inv = _mm256_set1_ps(1.0f / scale), qlo = _mm256_set1_ps(-zp);
    const __m256 qhi = _mm256_set1_ps(255.0f - zp);
    for (j = 0; j + 16 <= k; j += 16) {
        __m256i a = code8(rc8_load(x, j, bf16), inv, qlo, qhi);
        __m256i b = code8(rc8_load(x, j + 8, bf16), inv, qlo, qhi);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(d + j), p);
    }
    for (; j < k; j += 8) {
        int32_t t[8];
        const __m256 v = j + 8 <= k ? rc8_load(x, j, bf16) : rc8_load_n(x, j, k - j, bf16);
        _mm256_storeu_si256((__m256i *)t, code8(v, inv, qlo, qhi));
        for (int64_t e = 0; e < rc_min64(8, k - j); e++)
            d[j + e] = (int16_t)t[e];
    }
    for (j = k; j < kx; j++)
        d[j] = 0;
    return scale;
}

/* row r of the call's activation into the scratch: widened (static) or quantized (dynamic) */
static void prep_row(const Lin *l, const Scratch *s, int64_t r)
{
    int16_t *d = s->xw + r * s->kx;
    if (l->dyn)
        s->rs[r] = quant_row((const char *)l->x + r * l->k * (l->bf16 ? 2 : 4), l->k, l->bf16,
                             d, s->kx);
    else
        widen_row((const uint8_t *)l->x + r * l->k, d, l->k, s->kx, l->zp);
}

/* the float tail of output columns [c0, c0 + cols) */
static Out lin_out(const Lin *l, const Scratch *s, int64_t c0, int64_t cols)
{
    const Out o = {.rs = l->dyn ? s->rs : &l->xs, .ws = s->ws + c0, .bi = s->bi + c0,
                   .rstep = l->dyn, .ldy = l->n, .cols = cols,
                   .y = (char *)l->y + c0 * (l->post >= POST_RELU_Q ? 1 : l->bf16 ? 2 : 4),
                   .bf16 = l->bf16, .post = l->post, .q = l->q};
    return o;
}

/* Rows [i0, i1) of y, columns [p * NR, p * NR + NR) (fewer at the end of N), from the packed
 * panel wp: int16 rows of s->xw (Q = 0), or uint8 rows of x, ldx bytes apart (Q = 1) */
RC_INLINE void gemm_panel(const Lin *l, const Scratch *s, const void *x, int64_t ldx,
                          const void *wp, int64_t p, int64_t i0, int64_t i1, const int Q)
{
    const Out o = lin_out(l, s, p * NR, rc_min64(NR, l->n - p * NR));
    const int64_t tap = 0;
    for (int64_t i = i0; i < i1; i += MR) {
        const int64_t rows = rc_min64(MR, i1 - i);
        int64_t ro[MR];
        for (int64_t r = 0; r < MR; r++)
            ro[r] = (i + rc_min64(r, rows - 1)) * ldx;
        if (Q)
            tile_any_q(x, ro, &tap, 1, s->quads, wp, &o, i, rows);
        else
            tile_any_w(x, ro, &tap, 1, s->pairs, wp, &o, i, rows);
    }
}

/* The tasks of the GEMM (inside the parallel region): a panel of 16 output columns x a block of
 * rb rows each. A thread packs a task's panel into its own buffer wp (hot in L1 / L2 as the rows
 * sweep it: packing the whole weight up front wrote it to L3 at ~4 bytes / ns, 10-20% of a call
 * at M = 128), unless its previous task had the same panel. Row blocks keep x's rows in L2. Q:
 * the uint8 tiles over x (ldx bytes a row), else the int16 ones over s->xw. */
RC_INLINE void gemm_tasks(const Lin *l, const Scratch *s, void *wp, const void *x, int64_t ldx,
                          int64_t rb, const int Q)
{
    const int64_t nrb = (l->m + rb - 1) / rb;
    int64_t packed = -1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < s->np / NR * nrb; t++) {
        const int64_t p = t / nrb, i0 = t % nrb * rb;
        if (p != packed && Q)
            pack_panel_q(l->w, l->n, l->k, p * NR, s->quads, l->zp, (int8_t *)wp);
        else if (p != packed)
            pack_panel(l->w, l->n, l->k, p * NR, s->pairs, (int16_t *)wp);
        packed = p;
        gemm_panel(l, s, x, ldx, wp, p, i0, rc_min64(l->m, i0 + rb), Q);
    }
}

static void gemm_tasks_w(const Lin *l, const Scratch *s, void *wp)
{
    const int64_t rb = rc_max64(MIN_ROWS, X_BLOCK / (2 * rc_max64(s->kx, 1)) / MR * MR);
    gemm_tasks(l, s, wp, s->xw, s->kx, rb, 0);
}

/* the uint8 path: x read in place when K % 4 == 0, else its rows copied with zeros up to 4Q
 * (whole quads inside the buffer) */
static void gemm_tasks_q(const Lin *l, const Scratch *s, void *wp)
{
    const uint8_t *x = (const uint8_t *)l->x;
    const int64_t ldx = 4 * s->quads;
    if (ldx != l->k) {
        uint8_t *d = (uint8_t *)s->xw;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < l->m; r++) {
            memcpy(d + r * ldx, x + r * l->k, (size_t)l->k);
            memset(d + r * ldx + l->k, 0, (size_t)(ldx - l->k));
        }
        x = d;
    }
    /* K = 0: no quad (ldx 0), every sum 0: the row block only must not divide by it */
    const int64_t rb = rc_max64(MIN_ROWS, X_BLOCK / rc_max64(ldx, 1) / MR * MR);
    gemm_tasks(l, s, wp, x, ldx, rb, 1);
}

/* One parallel region (a region costs ~8 ms when another process holds a core): a static call
 * first scans x for a code above 127; none (reduced-range codes): the uint8 tiles, else (and
 * for dynamic_qlinear) the rows of x widened (or quantized) to int16, then the int16 tiles.
 * Both sum the same int32 values. Returns 1 when the uint8 tiles ran. */
static int qlinear_gemm(const Lin *l, const Scratch *s)
{
    const uint8_t *x = (const uint8_t *)l->x;
    const int64_t nx = l->m * l->k;
    const int w7 = !l->dyn && weights_7bit(l->w, l->n * l->k);
    const int head = l->dyn || (!w7 && x_head_high(x, nx)); /* the int16 tiles */
    const int scan = !head && !w7 && nx > X_HEAD;            /* the rest of x to scan */
    int high = 0;
#pragma omp parallel num_threads(rc_threads(l->nt)) if (l->nt != 1)
    {
        void *wp = (char *)s->wp + omp_get_thread_num() * panel1_bytes(l->k);
        const int w = head || (scan && any_high_omp(x, nx, &high));
        if (w) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < l->m; r++)
                prep_row(l, s, r);
            gemm_tasks_w(l, s, wp);
        } else {
            gemm_tasks_q(l, s, wp);
        }
    }
    return !(head || high);
}

/* ---------------------------------------------------------------------------------------------
 * qlinear and dynamic_qlinear, small M: weight rows widened in registers */

RC_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* 16 weights of row w from j as int16; fewer than 16 left (n): zeros past them */
RC_INLINE __m256i w16(const int8_t *w, int64_t j, int64_t n)
{
    if (n >= 16)
        return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + j)));
    int8_t t[16] = {0};
    memcpy(t, w + j, (size_t)n);
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)t));
}

#define RC_W(c)                                                                                    \
    if (COLS > c)                                                                                  \
        w##c = w16(w + (c) * k, j, k - j);
#define RC_DOT(r, c)                                                                               \
    if (ROWS > r && COLS > c)                                                                      \
        a##r##c = _mm256_add_epi32(                                                                \
            a##r##c,                                                                               \
            _mm256_madd_epi16(w##c, _mm256_loadu_si256((const __m256i *)(x + (r) * ldx + j))));
#define RC_STEP                                                                                    \
    RC_W(0) RC_W(1) RC_W(2)                                                                        \
    RC_DOT(0, 0) RC_DOT(0, 1) RC_DOT(0, 2) RC_DOT(1, 0) RC_DOT(1, 1) RC_DOT(1, 2)                  \
    RC_DOT(2, 0) RC_DOT(2, 1) RC_DOT(2, 2) RC_DOT(3, 0) RC_DOT(3, 1) RC_DOT(3, 2)
#define RC_SUM(r, c)                                                                               \
    if (ROWS > r && COLS > c)                                                                      \
        out[(r) * NB + (c)] = hsum_i32(a##r##c);
/* out[r * NB + c] = sum_k x[r, k] * w[c, k] for r < ROWS, c < COLS (x rows: stride ldx, zeros
 * from k up to a multiple of 16; w rows: k bytes each, read in place) */
RC_INLINE void dot_tile(const int16_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *out,
                        const int ROWS, const int COLS)
{
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256i a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    __m256i w0 = a00, w1 = a00, w2 = a00;
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        RC_STEP
    }
    if (j < k) {
        RC_STEP
    }
    RC_SUM(0, 0) RC_SUM(0, 1) RC_SUM(0, 2) RC_SUM(1, 0) RC_SUM(1, 1) RC_SUM(1, 2)
    RC_SUM(2, 0) RC_SUM(2, 1) RC_SUM(2, 2) RC_SUM(3, 0) RC_SUM(3, 1) RC_SUM(3, 2)
}
#undef RC_W
#undef RC_DOT
#undef RC_STEP
#undef RC_SUM

static void dot_any(const int16_t *x, int64_t ldx, const int8_t *w, int64_t k, int32_t *out,
                    int64_t rows, int64_t cols)
{
#define RC_ROWS(c)                                                                                 \
    switch (rows) {                                                                                \
    case 4: dot_tile(x, ldx, w, k, out, 4, c); break;                                             \
    case 3: dot_tile(x, ldx, w, k, out, 3, c); break;                                             \
    case 2: dot_tile(x, ldx, w, k, out, 2, c); break;                                             \
    default: dot_tile(x, ldx, w, k, out, 1, c); break;                                            \
    }
    if (cols == NB) {
        RC_ROWS(3)
    } else {
        for (int64_t c = 0; c < cols; c++, w += k, out++)
            RC_ROWS(1)
    }
#undef RC_ROWS
}

/* a requantizing post-op's output row `row`, columns [0, o->cols) (o->cols <= NB) of acc, with
 * the GEMM path's vector steps */
static void small_codes(const Out *o, int64_t row, const int32_t *acc)
{
    int32_t a[8] = {0};
    float ws[8] = {0}, bi[8] = {0};
    for (int64_t c = 0; c < o->cols; c++) {
        a[c] = acc[c];
        ws[c] = o->ws[c];
        bi[c] = o->bi[c];
    }
    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(o->rs[row * o->rstep]), _mm256_loadu_ps(ws));
    __m256 y = mul_add(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)a)), s,
                       _mm256_loadu_ps(bi));
    y = post8_any(o, y, row, 0, o->cols);
    store_codes16(&o->q, (uint8_t *)o->y + row * o->ldy, o->cols, y, y);
}

/* output columns [c0, c0 + NB) (fewer at the end of N) for every row */
static void small_block(const Lin *l, const Scratch *s, int64_t c0)
{
    const Out o = lin_out(l, s, c0, rc_min64(NB, l->n - c0));
    for (int64_t r0 = 0; r0 < l->m; r0 += MB) {
        const int64_t rows = rc_min64(MB, l->m - r0);
        int32_t acc[MB * NB];
        dot_any(s->xw + r0 * s->kx, s->kx, l->w + c0 * l->k, l->k, acc, rows, o.cols);
        for (int64_t r = 0; r < rows; r++) {
            const float rs = o.rs[(r0 + r) * o.rstep];
            float v[8] = {0};
            for (int64_t c = 0; c < o.cols; c++)
                v[c] = mul_add1((float)acc[r * NB + c], rs * o.ws[c], o.bi[c]);
            if (o.post >= POST_RELU_Q) {
                small_codes(&o, r0 + r, acc + r * NB);
            } else if (o.post == POST_NONE) {
                for (int64_t c = 0; c < o.cols; c++)
                    rc_st(o.y, (r0 + r) * o.ldy + c, v[c], o.bf16);
            } else { /* the GEMM path's vector post-op, so both paths give the same values */
                const __m256 p = post8_any(&o, _mm256_loadu_ps(v), r0 + r, 0, o.cols);
                rc8_store_n(o.y, (r0 + r) * o.ldy, o.cols, p, 0);
            }
        }
    }
}

static void qlinear_small(const Lin *l, const Scratch *s)
{
    for (int64_t r = 0; r < l->m; r++) /* M x K: small */
        prep_row(l, s, r);
    RC_PARALLEL_FOR(l->nt, rc_rows_per_chunk(NB * l->k))
    for (int64_t i = 0; i < (l->n + NB - 1) / NB; i++)
        small_block(l, s, i * NB);
}

/* returns 1 when the uint8 tiles ran (qlinear_gemm) */
static int linear(const Lin *l, const void *ws, const void *b, void *scratch)
{
    Scratch s = carve(scratch, l, ws, b);
    if (l->m > SMALL_M)
        return qlinear_gemm(l, &s);
    qlinear_small(l, &s);
    return 0;
}

int rc_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                        void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                        int post, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .xs = xs, .zp = zp,
                   .post = post, .nt = nt};
    return linear(&l, ws, b, scratch);
}

int rc_qlinear_q8_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                       void *scratch, int64_t m, int64_t n, int64_t k, float xs, int zp,
                       int post, float inv, int ozp, int qmin, int qmax, int sgn, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .xs = xs, .zp = zp,
                   .post = post, .nt = nt, .q = {inv, ozp, qmin, qmax, sgn}};
    return linear(&l, ws, b, scratch);
}

void rc_dynamic_qlinear_f32_avx2(const void *x, const void *w, const void *ws, const void *b,
                                 void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .dyn = 1, .nt = nt};
    linear(&l, ws, b, scratch);
}

void rc_dynamic_qlinear_bf16_avx2(const void *x, const void *w, const void *ws, const void *b,
                                  void *y, void *scratch, int64_t m, int64_t n, int64_t k, int nt)
{
    const Lin l = {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .dyn = 1, .bf16 = 1, .nt = nt};
    linear(&l, ws, b, scratch);
}

/* ---------------------------------------------------------------------------------------------
 * qconv2d: an implicit GEMM (rows: output pixels, columns: output channels, K = kH x kW x C / G in
 * (kh, kw, c) order) over bands of the input (a few output rows of an image) in a padded NHWC
 * buffer per thread: uint8 codes with the zero point as padding (the uint8 tiles: every code
 * read <= 127), else widened to int16 x - zp (padding 0: the zero point after the subtraction).
 * A tile's rows read their windows in place: with groups 1 and dilation 1 along W, a kernel row
 * is one run of kW x C values (a "tap"), else each (kh, kw) is a run of C / G. The weight (OHWI)
 * is packed once per call into qlinear's panels of 16 output channels of one group, each run
 * padded to whole pairs (int16) or quads (uint8) with zero weights (they multiply the next run's
 * first values or the zeros past the band: 0).
 *
 * geo (int64): N H W C O G kH kW sH sW dH dW top left Ho Wo Hp Wp nchw (Hp, Wp: the padded
 * input's height and width; nchw: the input is NCHW memory, else NHWC). */

typedef struct {
    int64_t n, h, w, c, o, g, kh, kw, sh, sw, dh, dw, top, left, ho, wo, hp, wp, nchw;
    int64_t merged, cg, og, run, ntap, tp, kp, tq, kq, npg; /* derived: see conv_geo */
    int64_t br, nbi, band;                                  /* bands: see conv_geo */
} Geo;

static Geo conv_geo(const int64_t *v)
{
    Geo q;
    memset(&q, 0, sizeof q);
    q.n = v[0], q.h = v[1], q.w = v[2], q.c = v[3], q.o = v[4], q.g = v[5], q.kh = v[6];
    q.kw = v[7], q.sh = v[8], q.sw = v[9], q.dh = v[10], q.dw = v[11], q.top = v[12];
    q.left = v[13], q.ho = v[14], q.wo = v[15], q.hp = v[16], q.wp = v[17], q.nchw = v[18];
    const int64_t merged = q.g == 1 && q.dw == 1;
    q.merged = merged;
    q.cg = q.c / q.g;
    q.og = q.o / q.g;
    q.run = merged ? q.kw * q.cg : q.cg; /* values a tap reads in place */
    q.ntap = merged ? q.kh : q.kh * q.kw;
    q.tp = (q.run + 1) / 2; /* pairs a tap */
    q.kp = 2 * q.tp * q.ntap;
    q.tq = (q.run + 3) / 4; /* quads a tap */
    q.kq = 4 * q.tq * q.ntap;
    q.npg = (q.og + NR - 1) / NR; /* panels a group */
    /* a band: br output rows of one image (nbi bands an image, as even as can be), its padded
     * input rows widened into a thread's buffer of band int16: ~X_BLOCK bytes (L2) */
    const int64_t most = rc_max64(1, X_BLOCK / rc_max64(2 * q.sh * q.wp * q.c, 1));
    q.nbi = (q.ho + most - 1) / most;
    q.br = (q.ho + q.nbi - 1) / q.nbi;
    q.band = round_up(((q.br - 1) * q.sh + (q.kh - 1) * q.dh + 1) * q.wp * q.c + 16, 16);
    return q;
}

/* scratch (bytes, each part a multiple of 32): every panel, packed (G x npg panels, each the
 * larger of kp / 2 pairs x 32 int16 and kq / 4 quads x 64 bytes + 64); per thread a staging copy
 * of a panel's 16 weight rows (16 x kp or kq int8, runs padded) and a band of padded input (band
 * int16 or bytes: the rows, then at least 16 more, a last run's pair or quad reading past them);
 * the taps' offsets (ntap int64); the weight scales and bias (O + NR fp32 each, zeros past O) */
static int64_t conv_panel_bytes(const Geo *q)
{
    return rc_max64(q->kp * 32, q->kq * 16 + 64);
}

static int64_t conv_stage_bytes(const Geo *q)
{
    return 16 * rc_max64(q->kp, q->kq);
}

static int64_t conv_thread_bytes(const Geo *q)
{
    return conv_stage_bytes(q) + 2 * q->band;
}

int64_t rc_qconv2d_scratch_f32_avx2(const void *geo, int nt)
{
    const Geo q = conv_geo((const int64_t *)geo);
    return q.g * q.npg * conv_panel_bytes(&q) + rc_threads(nt) * conv_thread_bytes(&q) +
           8 * round_up(q.ntap, 4) + 2 * 4 * round_up(q.o + NR, 8);
}

typedef struct {
    Geo q;
    const uint8_t *x;
    const int8_t *w;
    void *y;        /* fp32, or 1-byte codes (the requantizing post-ops) */
    char *wp;       /* the packed panels */
    char *thr;      /* per thread: staging, band */
    int64_t *taps;  /* offsets of the taps in a band */
    float *ws, *bi; /* padded scales and bias */
    const float *res; /* other (POST_ADD_RELU): NHWC, or NCHW when res_nchw */
    float xs;
    int zp, post, res_nchw;
    Q8 oq;
} Conv;

/* row hp of image n of the padded input, x - zp, to d (Wp x C int16) */
static void pad_row(const Conv *cv, int64_t n, int64_t hp, int16_t *d)
{
    const Geo *q = &cv->q;
    const int64_t h = hp - q->top, c = q->c, w = q->w;
    if (h < 0 || h >= q->h) {
        memset(d, 0, (size_t)(q->wp * c) * sizeof *d);
        return;
    }
    memset(d, 0, (size_t)(q->left * c) * sizeof *d);
    int16_t *e = d + q->left * c;
    if (!q->nchw) {
        widen_row(cv->x + (n * q->h + h) * w * c, e, w * c, w * c, cv->zp);
    } else { /* NCHW: each channel's row strided into the pixels */
        for (int64_t ch = 0; ch < c; ch++) {
            const uint8_t *s = cv->x + ((n * c + ch) * q->h + h) * w;
            for (int64_t i = 0; i < w; i++)
                e[i * c + ch] = (int16_t)(s[i] - cv->zp);
        }
    }
    memset(e + w * c, 0, (size_t)((q->wp - q->left - w) * c) * sizeof *d);
}

/* pad_row for the uint8 tiles: the codes, padded with the zero point, to d (Wp x C bytes) */
static void pad_row_q(const Conv *cv, int64_t n, int64_t hp, uint8_t *d)
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

/* the packed panel p of group g (output channels g * og + p * NR ...) into wp: int16 pairs (Q =
 * 0) or uint8-path quads (Q = 1); runs of odd length (not a multiple of 4) staged in st padded
 * with zero weights */
static void conv_pack(const Conv *cv, int64_t g, int64_t p, int8_t *st, void *wp, const int Q)
{
    const Geo *q = &cv->q;
    const int64_t k = q->ntap * q->run; /* the weight's row length */
    const int64_t kk = Q ? q->kq : q->kp, tk = kk / q->ntap; /* padded row and run lengths */
    const int8_t *w = cv->w + g * q->og * k;
    int64_t n = q->og, n0 = p * NR;
    if (kk != k) {
        n = rc_min64(NR, q->og - p * NR);
        for (int64_t r = 0; r < n; r++)
            for (int64_t t = 0; t < q->ntap; t++) {
                int8_t *d = st + r * kk + t * tk;
                memcpy(d, w + (p * NR + r) * k + t * q->run, (size_t)q->run);
                memset(d + q->run, 0, (size_t)(tk - q->run));
            }
        w = st;
        n0 = 0;
    }
    if (Q)
        pack_panel_q(w, n, kk, n0, kk / 4, cv->zp, (int8_t *)wp);
    else
        pack_panel(w, n, kk, n0, kk / 2, (int16_t *)wp);
}

/* output rows [oh0, oh1) of image n x the panel wp (output channels g * og + p * NR ...), the
 * band xb holding the padded input from row oh0 * sH (int16, or uint8 codes when Q) */
RC_INLINE void conv_rows(const Conv *cv, const void *xb, const void *wp, int64_t g, int64_t p,
                         int64_t n, int64_t oh0, int64_t oh1, const int Q)
{
    const Geo *q = &cv->q;
    const int64_t c0 = g * q->og + p * NR, hw = q->ho * q->wo;
    Out o = {.rs = &cv->xs, .ws = cv->ws + c0, .bi = cv->bi + c0, .rstep = 0, .ldy = q->o,
             .cols = rc_min64(NR, q->og - p * NR),
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
        if (Q)
            tile_any_q(xb, ro, cv->taps, q->ntap, q->tq, wp, &o, i, rows);
        else
            tile_any_w(xb, ro, cv->taps, q->ntap, q->tp, wp, &o, i, rows);
    }
}

/* The work of conv_run's parallel region (every thread calls it; mine: the thread's staging and
 * band): every panel packed, then a task per (band, run of `per` panels): the task's thread
 * fills the band's padded input into its buffer (L2), then runs its panels over it. Q: the
 * uint8 band and tiles, else int16. */
RC_INLINE void conv_tasks(const Conv *cv, char *mine, int64_t runs, int64_t per, const int Q)
{
    const Geo *q = &cv->q;
    const int64_t np = q->g * q->npg, nb = q->n * q->nbi, pb = conv_panel_bytes(q);
    const int64_t row = q->wp * q->c, es = Q ? 1 : 2; /* a band row: values, bytes each */
    char *xb = mine + conv_stage_bytes(q);
#pragma omp for schedule(dynamic, 1)
    for (int64_t gp = 0; gp < np; gp++)
        conv_pack(cv, gp / q->npg, gp % q->npg, (int8_t *)mine, cv->wp + gp * pb, Q);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nb * runs; t++) {
        const int64_t b = t / runs, n = b / q->nbi, oh0 = b % q->nbi * q->br;
        const int64_t oh1 = rc_min64(q->ho, oh0 + q->br);
        const int64_t rows = (oh1 - 1 - oh0) * q->sh + (q->kh - 1) * q->dh + 1;
        for (int64_t j = 0; j < rows; j++) {
            if (Q)
                pad_row_q(cv, n, oh0 * q->sh + j, (uint8_t *)xb + j * row);
            else
                pad_row(cv, n, oh0 * q->sh + j, (int16_t *)xb + j * row);
        }
        memset(xb + rows * row * es, 0, (size_t)(16 * es));
        for (int64_t gp = t % runs * per; gp < rc_min64(np, (t % runs + 1) * per); gp++)
            conv_rows(cv, xb, cv->wp + gp * pb, gp / q->npg, gp % q->npg, n, oh0, oh1, Q);
    }
}

static void conv_tasks_w(const Conv *cv, char *mine, int64_t runs, int64_t per)
{
    conv_tasks(cv, mine, runs, per, 0);
}

static void conv_tasks_q(const Conv *cv, char *mine, int64_t runs, int64_t per)
{
    conv_tasks(cv, mine, runs, per, 1);
}

/* One parallel region: the uint8 tiles when every byte they read is <= 127 (a scan of x finds
 * no code above 127, and the zero point is <= 127 where it pads), else the int16 ones; then
 * conv_tasks. Runs of panels split a band when there are fewer than 4 bands a thread (the band
 * is then filled once per run: C x Wp values a row against kW x kH x C x 16 x Wo products a row
 * and panel). A padded copy of the whole input (2 bytes a value, written then read from DRAM on
 * ResNet's 56 x 56 layers) made 1 x 1 convs memory-bound: 27 against 55 GMAC/s (3 x 3, same K),
 * one Zen 3 core. Returns 1 when the uint8 tiles ran. */
static int conv_run(const Conv *cv, int nt)
{
    const Geo *q = &cv->q;
    const int64_t np = q->g * q->npg, nb = q->n * q->nbi;
    const int64_t runs = rc_min64(np, rc_max64(1, (4 * rc_threads(nt) + nb - 1) / nb));
    const int64_t per = (np + runs - 1) / runs;
    const int w7 = weights_7bit(cv->w, q->o * q->kh * q->kw * q->cg); /* any code, any zp */
    const int zp_ok = w7 || cv->zp <= 127 || (q->hp == q->h && q->wp == q->w); /* zp unread */
    const int64_t nx = q->n * q->h * q->w * q->c;
    const int head = !zp_ok || (!w7 && x_head_high(cv->x, nx)); /* the int16 tiles */
    const int scan = !head && !w7 && nx > X_HEAD;               /* the rest of x to scan */
    int high = 0;
#pragma omp parallel num_threads(rc_threads(nt)) if (nt != 1)
    {
        char *mine = cv->thr + omp_get_thread_num() * conv_thread_bytes(q);
        if (head || (scan && any_high_omp(cv->x, nx, &high)))
            conv_tasks_w(cv, mine, runs, per);
        else
            conv_tasks_q(cv, mine, runs, per);
    }
    return !(head || high);
}

static int qconv2d(const void *x, const void *w, const void *ws, const void *b,
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
    cv.ws = (float *)(cv.taps + round_up(q->ntap, 4));
    cv.bi = cv.ws + round_up(q->o + NR, 8);
    for (int64_t t = 0; t < q->ntap; t++) /* merged: t = kh; else t = kh * kW + kw */
        cv.taps[t] = q->merged ? t * q->dh * q->wp * q->c
                         : ((t / q->kw) * q->dh * q->wp + (t % q->kw) * q->dw) * q->c;
    for (int64_t c = 0; c < q->o + NR; c++) {
        cv.ws[c] = c < q->o ? ((const float *)ws)[c] : 0.0f;
        cv.bi[c] = c < q->o && b ? ((const float *)b)[c] : 0.0f;
    }
    return conv_run(&cv, nt);
}

int rc_qconv2d_f32_avx2(const void *x, const void *w, const void *ws, const void *b,
                        const void *other, void *y, void *scratch, const void *geo, float xs,
                        int zp, int post, int other_nchw, int nt)
{
    const Q8 none = {0};
    return qconv2d(x, w, ws, b, other, y, scratch, geo, xs, zp, post, other_nchw, none, nt);
}

int rc_qconv2d_q8_avx2(const void *x, const void *w, const void *ws, const void *b, void *y,
                       void *scratch, const void *geo, float xs, int zp, int post, float inv,
                       int ozp, int qmin, int qmax, int sgn, int nt)
{
    const Q8 oq = {inv, ozp, qmin, qmax, sgn};
    return qconv2d(x, w, ws, b, NULL, y, scratch, geo, xs, zp, post, 0, oq, nt);
}
