/* gemm family, AVX-512: fp32 GEMM with an MR x 32 FMA register block (MR <= 12: 24 accumulators,
 * two weight vectors and a broadcast in the 32 zmm registers), fused epilogue.
 *
 * The weight is read in the avx512_f32_panel32 layout: panels of 32 columns of N, K rows of 32
 * floats. Threads take panels (dynamically) and run every MR-row block of M against theirs: a
 * panel (K x 128 B: 96 KB at K = 768) stays in L2 and each block's rows of x (12 x K floats) in
 * L1. A plain weight is transposed into a per-thread panel just before use (rc_transpose16).
 */
#include <stdlib.h>

#include "gemm.h"
#include "rc_gemm.h"
#include "rc_gemm_fix.h"

#define RC_VNNI_DPBF16 0 /* bf16: each pair widened to fp32, two FMAs */
#include "rc_gemm_vnni.h"

enum { MR = 12, NR = 32 };

/* Few rows of x (decode): the kernel streams the panel at memory speed, and one sequential
 * stream per thread with the hardware prefetcher alone keeps too few lines in flight. */
#ifndef RC_PANEL_PF
#define RC_PANEL_PF 1024
#endif
#define RC_PANEL_PF_ROWS 4

/* Columns [32 p, 32 p + 32) of w (K, N) (matmul's other) as a K x 32 panel (zeros past N). */
static void pack_panel_kn(const float *w, int64_t n, int64_t k, int64_t p, float *dst)
{
    const int64_t left = n - p * NR;
    const __mmask16 m0 = rc_tail16(left), m1 = left > 16 ? rc_tail16(left - 16) : 0;
    const float *src = w + p * NR;
    for (int64_t j = 0; j < k; j++) {
        _mm512_storeu_ps(dst + j * NR, _mm512_maskz_loadu_ps(m0, src + j * n));
        _mm512_storeu_ps(dst + j * NR + 16, _mm512_maskz_loadu_ps(m1, src + j * n + 16));
    }
}

void rc_gemm_pack_f32_avx512(const void *w, void *wp, int64_t n, int64_t k, int nt)
{
    RC_PARALLEL_FOR(nt, 1)
    for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
        rc_pack_panel32(w, n, k, p, (float *)wp + p * k * NR);
}

/* c (rows x 32, ld 32) = a (rows x k, ld lda floats) @ panel b (k x 32); rows a constant. */
static inline __attribute__((always_inline)) void micro(const float *a, int64_t lda,
                                                        const float *b, int64_t k, float *c,
                                                        const int rows)
{
    __m512 acc[MR][2];
    for (int r = 0; r < rows; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j++) {
        const __m512 b0 = _mm512_loadu_ps(b + j * NR), b1 = _mm512_loadu_ps(b + j * NR + 16);
        for (int r = 0; r < rows; r++) {
            const __m512 av = _mm512_set1_ps(a[r * lda + j]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(c + r * NR, acc[r][0]);
        _mm512_storeu_ps(c + r * NR + 16, acc[r][1]);
    }
}

/* micro for rows <= RC_PANEL_PF_ROWS (decode): KP parts of the panel's K walked at once (KP
 * streams, KP times the independent sums) with software prefetch RC_PANEL_PF bytes ahead in each.
 * One thread, cold packed weights, M = 1, GB/s: N = K = 4096 12.8 -> 16.7-19.1 (plain-weight
 * GEMV 16.2-16.7); N 2816 K 1024 11.2 -> 16.1 (17.1); N 1024 K 2816 11.5 -> 16.2 (18.2). */
static inline __attribute__((always_inline)) void micro_few(const float *a, int64_t lda,
                                                            const float *b, int64_t k, float *c,
                                                            const int rows)
{
    const int KP = rows <= 2 ? 4 : 2; /* at most 16 accumulators */
    __m512 acc[4][RC_PANEL_PF_ROWS][2];
    for (int h = 0; h < KP; h++)
        for (int r = 0; r < rows; r++)
            acc[h][r][0] = acc[h][r][1] = _mm512_setzero_ps();
    const int64_t half = k / KP;
    for (int64_t j = 0; j < half; j++)
        for (int h = 0; h < KP; h++) {
            const int64_t jj = j + h * half;
            const float *bp = b + jj * NR;
            /* a prefetch never faults: the address is formed as an integer */
            _mm_prefetch((const char *)((uintptr_t)bp + RC_PANEL_PF), _MM_HINT_T0);
            const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
            for (int r = 0; r < rows; r++) {
                const __m512 av = _mm512_set1_ps(a[r * lda + jj]);
                acc[h][r][0] = _mm512_fmadd_ps(av, b0, acc[h][r][0]);
                acc[h][r][1] = _mm512_fmadd_ps(av, b1, acc[h][r][1]);
            }
        }
    for (int64_t j = KP * half; j < k; j++) {
        const float *bp = b + j * NR;
        const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
        for (int r = 0; r < rows; r++) {
            const __m512 av = _mm512_set1_ps(a[r * lda + j]);
            acc[0][r][0] = _mm512_fmadd_ps(av, b0, acc[0][r][0]);
            acc[0][r][1] = _mm512_fmadd_ps(av, b1, acc[0][r][1]);
        }
    }
    for (int h = 1; h < KP; h++)
        for (int r = 0; r < rows; r++) {
            acc[0][r][0] = _mm512_add_ps(acc[0][r][0], acc[h][r][0]);
            acc[0][r][1] = _mm512_add_ps(acc[0][r][1], acc[h][r][1]);
        }
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(c + r * NR, acc[0][r][0]);
        _mm512_storeu_ps(c + r * NR + 16, acc[0][r][1]);
    }
}

static void micro_any(const float *a, int64_t lda, const float *b, int64_t k, float *c,
                      int64_t rows)
{
    switch (rows) {
    case 1: micro_few(a, lda, b, k, c, 1); return;
    case 2: micro_few(a, lda, b, k, c, 2); return;
    case 3: micro_few(a, lda, b, k, c, 3); return;
    case 4: micro_few(a, lda, b, k, c, 4); return;
    default: break;
    }
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: micro(a, lda, b, k, c, r); break;
        RC_CASE(5) RC_CASE(6) RC_CASE(7) RC_CASE(8) RC_CASE(9) RC_CASE(10) RC_CASE(11)
#undef RC_CASE
    default: micro(a, lda, b, k, c, MR); break;
    }
}

/* The driver of linear (batch 1) and matmul: y[i] = act(x[i] @ W[i] + b) + res[i] (x stride xs,
 * w stride ws elements, 0 = shared; y and res dense). wkind: 0 = w (N, K), 1 = packed
 * avx512_f32_panel32, 2 = w (K, N). Work items are (batch, 32-column panel) pairs. */
static int gemm(const float *x, const float *w, const void *b, const float *res, float *y,
                int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n, int64_t k, int wkind,
                int act, int nt)
{
    const int threads = rc_threads(nt);
    const int64_t panels = (n + NR - 1) / NR;
    float *scratch = wkind == 1 || !k ? NULL : aligned_alloc(64, (size_t)(threads * k * NR * 4));
    if (wkind != 1 && k && !scratch)
        return -1; /* out of memory: the caller raises MemoryError */
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        float *mine = scratch ? scratch + omp_get_thread_num() * k * NR : NULL;
        float c[MR * NR] __attribute__((aligned(64)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * panels; item++) {
            const int64_t bi = item / panels, p = item % panels;
            const float *wi = w + bi * ws, *xi = x + bi * xs, *bp = wi + p * k * NR;
            if (mine) {
                (wkind == 2 ? pack_panel_kn : rc_pack_panel32)(wi, n, k, p, mine);
                bp = mine;
            }
            const int64_t n0 = p * NR, nr = rc_min64(NR, n - n0);
            const float *resi = res ? res + bi * m * n : NULL;
            for (int64_t m0 = 0; m0 < m; m0 += MR) {
                const int64_t mr = rc_min64(MR, m - m0);
                rc_prefetch_rows(y + bi * m * n, n, 4, m0 + MR, rc_min64(m, m0 + 2 * MR), n0, nr);
                micro_any(xi + m0 * k, k, bp, k, c, mr);
                rc_epilogue(c, NR, mr, nr, b, resi, y + bi * m * n, n, m0, n0, act, 0);
                if (!rc_block_finite(c, NR, mr, nr))
                    rc_fix_block(c, NR, mr, nr, xi, wi, wkind, 0, n, k, m0, n0, b, resi,
                                 y + bi * m * n, act);
            }
        }
    }
    free(scratch);
    return 0;
}

int rc_gemm_f32_avx512(const void *x, const void *w, const void *b, const void *res, void *y,
                       int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt);
}

int rc_matmul_f32_avx512(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                         int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt);
}

int rc_gemm_bf16_avx512(const void *x, const void *w, const void *b, const void *res, void *y,
                        int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm_vnni(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt);
}

int rc_matmul_bf16_avx512(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                          int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm_vnni(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt);
}
