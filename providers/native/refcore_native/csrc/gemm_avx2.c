/* gemm family, AVX2 + FMA (no AVX-512): fp32 and bf16 GEMM with a 6 x 16 FMA register block
 * (12 accumulators, two weight vectors and a broadcast of the 16 ymm registers), fused epilogue.
 *
 * Both dtypes compute in fp32 on fp32 operands: the weight is read as K x 32 fp32 panels (the
 * avx512_f32_panel32 layout, one panel = two 16-column halves for the 6 x 16 block), a bf16
 * weight (plain, amx_bf16_vnni2-packed, or matmul's (K, N)) widened into a per-thread fp32
 * panel just before use, a bf16 x widened once per call into an fp32 copy (Zen 3 has no bf16
 * dot product; widening is exact, so bf16 differs from fp32 only by its one final rounding).
 * Threads take (batch, 32-column panel) items dynamically and run every 6-row block of M
 * against theirs: the panel (K x 128 B) stays in L2, a block's rows of x in L1 for both halves.
 * Non-finite sums are recomputed in float64 (rc_gemm_fix.h).
 */
#include <stdlib.h>

#include "gemm.h"
#include "rc_gemm_avx2.h"
#include "rc_gemm_fix.h"

enum { MR = 6, NR = 32 };

/* Columns [32 p, 32 p + 32) of w (N, K) (fp32 or bf16) as a K x 32 fp32 panel (zeros past N). */
static void pack_nk(const void *w, int bf16, int64_t n, int64_t k, int64_t p, float *dst)
{
    rc2_pack_nk(w, bf16, n, k, p * NR, NR, dst);
}

/* Columns [32 p, 32 p + 32) of w (K, N) (matmul's other) as a K x 32 fp32 panel. */
static void pack_kn(const void *w, int bf16, int64_t n, int64_t k, int64_t p, float *dst)
{
    const int64_t left = n - p * NR;
    for (int64_t j = 0; j < k; j++)
        for (int64_t c = 0; c < NR; c += 8)
            _mm256_storeu_ps(dst + j * NR + c,
                             c < left ? rc2_load_n(w, j * n + p * NR + c, left - c, bf16)
                                      : _mm256_setzero_ps());
}

/* Panel p of an amx_bf16_vnni2-packed weight (tiles 2p and 2p + 1) as a K x 32 fp32 panel: a
 * tile row holds the pairs (k, k + 1) of 16 columns; the even bf16 of each pair is row k. */
static void pack_vnni(const uint16_t *w, int64_t n, int64_t k, int64_t p, float *dst)
{
    const int64_t kt = (k + 31) / 32, ntiles = (n + 15) / 16;
    for (int64_t h = 0; h < 2; h++) {
        const int64_t nb = 2 * p + h;
        for (int64_t kk = 0; kk < k; kk += 2) {
            float *lo = dst + kk * NR + 16 * h, *hi = lo + NR;
            if (nb >= ntiles) {
                memset(lo, 0, 64);
                if (kk + 1 < k)
                    memset(hi, 0, 64);
                continue;
            }
            const uint16_t *row = w + ((nb * kt + kk / 32) * 16 + (kk % 32) / 2) * 32;
            for (int q = 0; q < 2; q++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(row + 16 * q));
                _mm256_storeu_ps(lo + 8 * q, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                if (kk + 1 < k)
                    _mm256_storeu_ps(hi + 8 * q, _mm256_castsi256_ps(_mm256_and_si256(
                                                     v, _mm256_set1_epi32((int)0xffff0000u))));
            }
        }
    }
}

/* c (rows x 16, ld 32) = a (rows x k, ld lda) @ b (k x 16, ld 32); rows a constant <= MR.
 * Named accumulators, not an array: gcc 12 kept an array of them in memory as well, storing all
 * twelve every K step (3x slower). */
#define RC_ROW(r)                                                                                  \
    if (rows > r) {                                                                                \
        const __m256 av = _mm256_broadcast_ss(a + r * lda + j);                                    \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);                                                \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);                                                \
    }
#define RC_OUT(r)                                                                                  \
    if (rows > r) {                                                                                \
        _mm256_storeu_ps(c + r * NR, c##r##0);                                                     \
        _mm256_storeu_ps(c + r * NR + 8, c##r##1);                                                 \
    }
static inline __attribute__((always_inline)) void micro(const float *a, int64_t lda,
                                                        const float *b, int64_t k, float *c,
                                                        const int rows)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t j = 0; j < k; j++) {
        const __m256 b0 = _mm256_loadu_ps(b + j * NR), b1 = _mm256_loadu_ps(b + j * NR + 8);
        RC_ROW(0) RC_ROW(1) RC_ROW(2) RC_ROW(3) RC_ROW(4) RC_ROW(5)
    }
    RC_OUT(0) RC_OUT(1) RC_OUT(2) RC_OUT(3) RC_OUT(4) RC_OUT(5)
}
#undef RC_ROW
#undef RC_OUT

static void micro_any(const float *a, int64_t lda, const float *b, int64_t k, float *c,
                      int64_t rows)
{
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: micro(a, lda, b, k, c, r); break;
        RC_CASE(1) RC_CASE(2) RC_CASE(3) RC_CASE(4) RC_CASE(5)
#undef RC_CASE
    default: micro(a, lda, b, k, c, MR); break;
    }
}

/* Decode (M <= 2) on a packed weight: the panel is streamed from memory once, so the block is
 * memory-bound; software prefetch RC_PANEL_PF bytes ahead, and one row of x walks the panel's K
 * in two halves at once (two streams, twice the independent sums). */
#ifndef RC_PANEL_PF
#define RC_PANEL_PF 256
#endif

static inline __attribute__((always_inline)) void fma4(__m256 acc[4], __m256 a, const float *b)
{
    for (int q = 0; q < 4; q++)
        acc[q] = _mm256_fmadd_ps(a, _mm256_loadu_ps(b + 8 * q), acc[q]);
}

/* c (rows x 32, ld 32) = a (rows <= 2, ld lda) @ the fp32 panel b (k x 32). */
static void micro_few(const float *a, int64_t lda, const float *b, int64_t k, float *c,
                      int64_t rows)
{
    __m256 s0[4], s1[4];
    for (int q = 0; q < 4; q++)
        s0[q] = s1[q] = _mm256_setzero_ps();
    const int64_t half = rows == 1 ? k / 2 : 0;
    for (int64_t j = 0; j < half; j++) { /* one row, two halves of K */
        const float *p0 = b + j * NR, *p1 = b + (j + half) * NR;
        _mm_prefetch((const char *)((uintptr_t)p0 + RC_PANEL_PF), _MM_HINT_T0);
        _mm_prefetch((const char *)((uintptr_t)p1 + RC_PANEL_PF), _MM_HINT_T0);
        fma4(s0, _mm256_broadcast_ss(a + j), p0);
        fma4(s1, _mm256_broadcast_ss(a + j + half), p1);
    }
    for (int64_t j = 2 * half; j < k; j++) {
        const float *p0 = b + j * NR;
        _mm_prefetch((const char *)((uintptr_t)p0 + RC_PANEL_PF), _MM_HINT_T0);
        fma4(s0, _mm256_broadcast_ss(a + j), p0);
        if (rows == 2)
            fma4(s1, _mm256_broadcast_ss(a + lda + j), p0);
    }
    for (int q = 0; q < 4; q++) {
        if (rows == 1)
            s0[q] = _mm256_add_ps(s0[q], s1[q]);
        _mm256_storeu_ps(c + 8 * q, s0[q]);
        if (rows == 2)
            _mm256_storeu_ps(c + NR + 8 * q, s1[q]);
    }
}

/* As micro_few on panel p of an amx_bf16_vnni2 weight read in place: a tile row holds the pairs
 * (kk, kk + 1) of 16 columns, widened as two fp32 vectors per 8 columns. */
static void micro_vnni_few(const float *a, int64_t lda, const uint16_t *w, int64_t n, int64_t k,
                           int64_t p, float *c, int64_t rows)
{
    const int64_t kt = (k + 31) / 32, tiles = rc_min64(2, (n + 15) / 16 - 2 * p);
    const __m256i himask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 s[2][4];
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 4; q++)
            s[r][q] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk += 2) {
        const int64_t off = ((kk / 32) * 16 + (kk % 32) / 2) * 32;
        for (int64_t h = 0; h < tiles; h++) {
            const uint16_t *row = w + (2 * p + h) * kt * 512 + off;
            _mm_prefetch((const char *)((uintptr_t)row + RC_PANEL_PF), _MM_HINT_T0);
            for (int q = 0; q < 2; q++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(row + 16 * q));
                const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                const __m256 hi = _mm256_castsi256_ps(_mm256_and_si256(v, himask));
                for (int64_t r = 0; r < rows; r++) {
                    const float *ar = a + r * lda;
                    const __m256 a1 = _mm256_set1_ps(kk + 1 < k ? ar[kk + 1] : 0.0f);
                    __m256 *acc = &s[r][2 * h + q];
                    *acc = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + kk), lo, *acc);
                    *acc = _mm256_fmadd_ps(a1, hi, *acc);
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int q = 0; q < 4; q++)
            _mm256_storeu_ps(c + r * NR + 8 * q, s[r][q]);
}

/* y[i] = act(x[i] @ W[i] + b) + res[i] (x stride xs, w stride ws elements, 0 = shared; y and res
 * dense). wkind as rc_gemm_fix.h: 0 = w (N, K), 1 = packed, 2 = w (K, N). */
static int gemm(const void *x, const void *w, const void *b, const void *res, void *y,
                int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n, int64_t k, int wkind,
                int act, int nt, int bf16)
{
    const int threads = rc_threads(nt);
    const int64_t panels = (n + NR - 1) / NR, es = bf16 ? 2 : 4;
    const int64_t xrows = (xs ? batch : 1) * m; /* rows of x (one x shared when xs == 0) */
    const int direct = wkind == 1 && !bf16;     /* fp32 panels read in place */
    const int few = wkind == 1 && m <= 2;       /* decode: micro_few / micro_vnni_few */
    float *scratch = direct || few || !k ? NULL : aligned_alloc(64, (size_t)(threads * k * NR * 4));
    float *xf = bf16 && k ? malloc((size_t)(xrows * k * 4)) : NULL;
    if ((!direct && !few && k && !scratch) || (bf16 && k && !xf)) {
        free(scratch);
        free(xf);
        return -1; /* out of memory: the caller raises MemoryError */
    }
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        float *mine = scratch ? scratch + omp_get_thread_num() * k * NR : NULL;
        float c[MR * NR] __attribute__((aligned(32)));
        if (xf) {
            RC_PRAGMA(omp for schedule(static))
            for (int64_t r = 0; r < xrows; r++)
                for (int64_t j = 0; j < k; j += 8)
                    rc2_store_n(xf, r * k + j, k - j, rc2_load_n(x, r * k + j, k - j, 1), 0);
        }
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * panels; item++) {
            const int64_t bi = item / panels, p = item % panels;
            const char *wi = (const char *)w + bi * ws * es, *xo = (const char *)x + bi * xs * es;
            const float *xi = xf ? xf + (xs ? bi * m * k : 0) : (const float *)xo;
            const float *bp = mine;
            const int64_t n0 = p * NR, nr = rc_min64(NR, n - n0);
            const void *resi = res ? (const char *)res + bi * m * n * es : NULL;
            void *yi = (char *)y + bi * m * n * es;
            if (few) { /* decode on a packed weight: one block, the weight read in place */
                if (bf16)
                    micro_vnni_few(xi, k, (const uint16_t *)wi, n, k, p, c, m);
                else
                    micro_few(xi, k, (const float *)wi + p * k * NR, k, c, m);
                rc2_epilogue(c, NR, m, nr, b, resi, yi, n, 0, n0, act, bf16);
                if (!rc2_block_finite(c, NR, m, nr))
                    rc_fix_block(c, NR, m, nr, xo, wi, wkind, bf16, n, k, 0, n0, b, resi, yi, act);
                continue;
            }
            if (direct)
                bp = (const float *)wi + p * k * NR;
            else if (wkind == 1)
                pack_vnni((const uint16_t *)wi, n, k, p, mine);
            else if (k)
                (wkind == 2 ? pack_kn : pack_nk)(wi, bf16, n, k, p, mine);
            for (int64_t m0 = 0; m0 < m; m0 += MR) {
                const int64_t mr = rc_min64(MR, m - m0);
                micro_any(xi + m0 * k, k, bp, k, c, mr);
                if (nr > 16)
                    micro_any(xi + m0 * k, k, bp + 16, k, c + 16, mr);
                rc2_epilogue(c, NR, mr, nr, b, resi, yi, n, m0, n0, act, bf16);
                if (!rc2_block_finite(c, NR, mr, nr))
                    rc_fix_block(c, NR, mr, nr, xo, wi, wkind, bf16, n, k, m0, n0, b, resi, yi,
                                 act);
            }
        }
    }
    free(scratch);
    free(xf);
    return 0;
}

void rc_gemm_pack_f32_avx2(const void *w, void *wp, int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
        pack_nk(w, 0, n, k, p, (float *)wp + p * k * NR);
}

int rc_gemm_f32_avx2(const void *x, const void *w, const void *b, const void *res, void *y,
                     int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt, 0);
}

int rc_matmul_f32_avx2(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                       int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt, 0);
}

int rc_gemm_bf16_avx2(const void *x, const void *w, const void *b, const void *res, void *y,
                      int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt, 1);
}

int rc_matmul_bf16_avx2(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                        int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt, 1);
}
