/* The bf16 GEMM driver below AMX, over the amx_bf16_vnni2 layout (gemm_avx512_bf16.c with
 * vdpbf16ps; gemm_avx512.c widening each bf16 pair to two fp32 FMAs).
 *
 * A tile row of the layout (16 columns of N x one pair of K) is exactly vdpbf16ps' second
 * operand; the first is a pair of x broadcast to all 16 lanes. An MR x 32 register block (MR <=
 * 12: 24 accumulators) walks the K pairs of a 32-column panel, x read in place (an odd K's last
 * element is broadcast with a zero partner, never the element after it). Threads take
 * (batch, panel) items; a plain weight is packed per panel into a per-thread buffer. Before a
 * block runs, the y lines of the next block are prefetched (rc_prefetch_rows).
 * The includer defines RC_VNNI_DPBF16 (1: vdpbf16ps, 0: widen + FMA) and RC_VNNI_NAME(x).
 */
#ifndef RC_GEMM_VNNI_H
#define RC_GEMM_VNNI_H

#include <stdlib.h>

#include "rc_gemm.h"
#include "rc_gemm_fix.h"

enum { VMR = 12 };

static inline __attribute__((always_inline)) __m512 rc_lo_bf16(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); /* the even (first) bf16 of each pair */
}

static inline __attribute__((always_inline)) __m512 rc_hi_bf16(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000u)));
}

/* The pair of x at p broadcast to 16 lanes; an odd K's last element with a zero partner. */
static inline __attribute__((always_inline)) __m512i rc_pair(const uint16_t *p, int last)
{
    int32_t v;
    if (last)
        v = p[0];
    else
        memcpy(&v, p, 4); /* folds into the broadcast's memory operand */
    return _mm512_set1_epi32(v);
}

/* acc[r][0..1] += the pair j of row r of a times pair row j of the panel's two tiles. */
static inline __attribute__((always_inline)) void vnni_step(__m512 acc[][2], const uint16_t *a,
                                                            int64_t lda, const uint16_t *b0,
                                                            const uint16_t *b1, int64_t j,
                                                            const int rows, const int last)
{
    const __m512i bv0 = _mm512_loadu_si512(b0 + j * 32), bv1 = _mm512_loadu_si512(b1 + j * 32);
#if RC_VNNI_DPBF16
    for (int r = 0; r < rows; r++) {
        const __m512bh av = (__m512bh)rc_pair(a + r * lda + 2 * j, last);
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, (__m512bh)bv0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, (__m512bh)bv1);
    }
#else
    const __m512 b0l = rc_lo_bf16(bv0), b0h = rc_hi_bf16(bv0);
    const __m512 b1l = rc_lo_bf16(bv1), b1h = rc_hi_bf16(bv1);
    for (int r = 0; r < rows; r++) {
        const __m512i av = rc_pair(a + r * lda + 2 * j, last);
        const __m512 al = rc_lo_bf16(av), ah = rc_hi_bf16(av);
        acc[r][0] = _mm512_fmadd_ps(ah, b0h, _mm512_fmadd_ps(al, b0l, acc[r][0]));
        acc[r][1] = _mm512_fmadd_ps(ah, b1h, _mm512_fmadd_ps(al, b1l, acc[r][1]));
    }
#endif
}

/* c (rows x 32, ld 32) = a (rows x k bf16, ld lda) @ the panel's tiles b0, b1 (pair j at j * 32),
 * prefetching the first pfrows rows of the next block (pf, ld lda; pfrows 0: none): its x is
 * read at 4 bytes per row and step from 12 rows, which the hardware prefetchers do not bring
 * from memory in time (Zen 4, 1024 x 384 x 384, 2 threads, x cold: 893-906 us without, 797-820
 * with, as fast as with x in cache). */
static inline __attribute__((always_inline)) void vnni_micro(const uint16_t *a, int64_t lda,
                                                             const uint16_t *b0,
                                                             const uint16_t *b1, int64_t k,
                                                             float *c, const int rows,
                                                             const uint16_t *pf, int64_t pfrows)
{
    __m512 acc[VMR][2];
    for (int r = 0; r < rows; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k / 2; j++) {
        if (j / VMR * 32 < k && j % VMR < pfrows) /* a line of the next block's rows per step */
            __builtin_prefetch(pf + (j % VMR) * lda + j / VMR * 32, 0, 3);
        vnni_step(acc, a, lda, b0, b1, j, rows, 0);
    }
    if (k & 1) /* an odd K's final element has no partner */
        vnni_step(acc, a, lda, b0, b1, k / 2, rows, 1);
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_ps(c + r * 32, acc[r][0]);
        _mm512_storeu_ps(c + r * 32 + 16, acc[r][1]);
    }
}

static void vnni_micro_any(const uint16_t *a, int64_t lda, const uint16_t *b0,
                           const uint16_t *b1, int64_t k, float *c, int64_t rows,
                           const uint16_t *pf, int64_t pfrows)
{
    switch (rows) {
#define RC_CASE(r)                                                                                 \
    case r: vnni_micro(a, lda, b0, b1, k, c, r, pf, pfrows); break;
        RC_CASE(1) RC_CASE(2) RC_CASE(3) RC_CASE(4) RC_CASE(5) RC_CASE(6)
        RC_CASE(7) RC_CASE(8) RC_CASE(9) RC_CASE(10) RC_CASE(11)
#undef RC_CASE
    default: vnni_micro(a, lda, b0, b1, k, c, VMR, pf, pfrows); break;
    }
}

/* y[i] = act(x[i] @ W[i] + b) + res[i], as gemm() in gemm_amx.c (wkind 0: w (N, K), 1: packed
 * amx_bf16_vnni2, 2: w (K, N)). */
static int gemm_vnni(const uint16_t *x, const uint16_t *w, const void *b, const uint16_t *res,
                     uint16_t *y, int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n,
                     int64_t k, int wkind, int act, int nt)
{
    const int64_t kt = (k + TK - 1) / TK, ntiles = (n + TN - 1) / TN, panel = 2 * kt * TILE;
    const int64_t npanels = (ntiles + 1) / 2;
    const int threads = rc_threads(nt);
    uint16_t *panels = wkind == 1 || !kt ? NULL : aligned_alloc(64, (size_t)(threads * panel * 2));
    if (wkind != 1 && kt && !panels)
        return -1; /* out of memory: the caller raises MemoryError */
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        uint16_t *mine = panels ? panels + omp_get_thread_num() * panel : NULL;
        float c[VMR * 32] __attribute__((aligned(64)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * npanels; item++) {
            const int64_t bi = item / npanels, p = item % npanels;
            const int two = 2 * p + 1 < ntiles;
            const uint16_t *wi = w + bi * ws, *xi = x + bi * xs;
            const uint16_t *b0 = mine, *b1 = mine ? mine + kt * TILE : NULL;
            if (wkind == 1) {
                b0 = wi + 2 * p * kt * TILE;
                b1 = b0 + kt * TILE;
            } else if (mine) {
                void (*pk)(const uint16_t *, int64_t, int64_t, int64_t, uint16_t *) =
                    wkind == 2 ? rc_pack_vnni_kn : rc_pack_vnni_nk;
                pk(wi, n, k, 2 * p, mine);
                if (two)
                    pk(wi, n, k, 2 * p + 1, mine + kt * TILE);
            }
            if (!two) /* an odd last tile: its block computes the 16 columns twice, stores once */
                b1 = b0;
            const int64_t n0 = p * 32, nr = rc_min64(32, n - n0);
            const uint16_t *resi = res ? res + bi * m * n : NULL;
            for (int64_t m0 = 0; m0 < m; m0 += VMR) {
                const int64_t mr = rc_min64(VMR, m - m0);
                rc_prefetch_rows(y + bi * m * n, n, 2, m0 + VMR, rc_min64(m, m0 + 2 * VMR), n0, nr);
                const int64_t next = rc_min64(VMR, m - m0 - VMR);
                vnni_micro_any(xi + m0 * k, k, b0, b1, k, c, mr,
                               next > 0 ? xi + (m0 + VMR) * k : NULL, next > 0 ? next : 0);
                rc_epilogue(c, 32, mr, nr, b, resi, y + bi * m * n, n, m0, n0, act, 1);
                if (!rc_block_finite(c, 32, mr, nr))
                    rc_fix_block(c, 32, mr, nr, xi, wi, wkind, 1, n, k, m0, n0, b, resi,
                                 y + bi * m * n, act);
            }
        }
    }
    free(panels);
    return 0;
}

#endif
