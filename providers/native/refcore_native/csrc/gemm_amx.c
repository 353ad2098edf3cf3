/* gemm family, AMX: bf16 GEMM on tiles (TDPBF16PS), fp32 accumulation, fused epilogue.
 *
 * Tiles: C 0-3 (a 32 x 32 fp32 output block as 2 x 2 tiles of 16 x 16), A 4-5 (two 16-row
 * slices of x, 32 bf16 of K each), B 6-7 (two VNNI-2 weight tiles of 16 columns). Threads take
 * 32-column panels of N (dynamically); each runs every 32-row block of M against its panel, so a
 * panel (32 x K bf16: 48 KB at K = 768) is packed (per call) or read (prepacked) once and stays
 * in L1/L2 while x streams from L2. x is read in place when a block is whole; a tail block of M
 * (or every block, when K is not a multiple of 32) is copied zero-padded once, before the
 * threads start. gcc's AMX intrinsics are inline asm: tile numbers are literals.
 */
#include <stdlib.h>

#include "gemm.h"
#include "rc_gemm.h"

#ifndef __AMX_BF16__
#error "gemm_amx.c needs -mamx-tile -mamx-bf16"
#endif

enum { TK = 32, TN = 16, TILE = TN * TK }; /* bf16 per tile */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rc_tilecfg;

static void tiles_on(void)
{
    rc_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Tile (nb, kb) of the packed weight: nb < ceil(n/16), kb < kt = ceil(k/32). */
static inline const uint16_t *tile_at(const uint16_t *wp, int64_t kt, int64_t nb, int64_t kb)
{
    return wp + (nb * kt + kb) * TILE;
}

/* Columns [16 nb, 16 nb + 16) of w (N, K) as kt VNNI-2 tiles at dst (zeros past N and K). */
static void pack_tiles(const uint16_t *w, int64_t n, int64_t k, int64_t nb, uint16_t *dst)
{
    const int64_t kt = (k + TK - 1) / TK, rows = rc_min64(TN, n - nb * TN);
    const char *src = (const char *)(w + nb * TN * k);
    for (int64_t kb = 0; kb < kt; kb++)
        rc_transpose16(src + kb * TK * 2, k * 2, rows, rc_tail32(k - kb * TK),
                       (char *)(dst + kb * TILE), 64, 16);
}

void rc_gemm_pack_bf16_amx(const void *w, void *wp, int64_t n, int64_t k, int nt)
{
    const int64_t kt = (k + TK - 1) / TK;
    RC_PARALLEL_FOR(nt, 4)
    for (int64_t nb = 0; nb < (n + TN - 1) / TN; nb++)
        pack_tiles(w, n, k, nb, (uint16_t *)wp + nb * kt * TILE);
}

/* c (32 x 32 fp32, ld 32) = a (32 rows, ld lda bytes) @ two weight tiles per K step. */
static inline void block_2x2(const char *a, int64_t lda, const uint16_t *b0, const uint16_t *b1,
                             int64_t kt, float *c)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t kb = 0; kb < kt; kb++) {
        _tile_loadd(4, a + kb * 64, lda);
        _tile_loadd(5, a + 16 * lda + kb * 64, lda);
        _tile_loadd(6, b0 + kb * TILE, 64);
        _tile_loadd(7, b1 + kb * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
}

/* The same with one weight tile (the last 16 columns of an odd tile count). */
static inline void block_2x1(const char *a, int64_t lda, const uint16_t *b0, int64_t kt, float *c)
{
    _tile_zero(0);
    _tile_zero(2);
    for (int64_t kb = 0; kb < kt; kb++) {
        _tile_loadd(4, a + kb * 64, lda);
        _tile_loadd(5, a + 16 * lda + kb * 64, lda);
        _tile_loadd(6, b0 + kb * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
    }
    _tile_stored(0, c, 128);
    _tile_stored(2, c + 16 * 32, 128);
}

/* Columns [16 nb, 16 nb + 16) of w (K, N) (matmul's other) as kt VNNI-2 tiles at dst: tile row r
 * interleaves rows 2r and 2r + 1 of K (vpermw), zeros past N and K. */
static void pack_tiles_kn(const uint16_t *w, int64_t n, int64_t k, int64_t nb, uint16_t *dst)
{
    const int64_t kt = (k + TK - 1) / TK;
    const __mmask16 mk = rc_tail16(n - nb * TN);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t r = 0; r < kt * 16; r++) {
        const int64_t k0 = 2 * r;
        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
        if (k0 < k)
            lo = _mm256_maskz_loadu_epi16(mk, w + k0 * n + nb * TN);
        if (k0 + 1 < k)
            hi = _mm256_maskz_loadu_epi16(mk, w + (k0 + 1) * n + nb * TN);
        __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        _mm512_storeu_si512(dst + (r / 16) * TILE + (r % 16) * 32, _mm512_permutexvar_epi16(idx, v));
    }
}

/* Rows [m0, m) of each of nx x batches (stride xs elements) zero-padded to whole 32-row blocks
 * of kt * 32 bf16: the rows of x a tile cannot load in place. */
static uint16_t *padded_rows(const uint16_t *x, int64_t nx, int64_t xs, int64_t m0, int64_t m,
                             int64_t k, int64_t kt)
{
    const int64_t rows = (m - m0 + 31) / 32 * 32, ld = kt * TK;
    const size_t bytes = (size_t)(nx * rows * ld * 2);
    uint16_t *p = aligned_alloc(64, bytes);
    if (!p)
        return NULL;
    memset(p, 0, bytes);
    for (int64_t i = 0; i < nx; i++)
        for (int64_t r = m0; r < m; r++)
            memcpy(p + (i * rows + r - m0) * ld, x + i * xs + r * k, (size_t)(k * 2));
    return p;
}

/* The driver of linear (batch 1) and matmul: batch products y[i] = act(x[i] @ W[i] + b) + res[i]
 * (x stride xs, w stride ws elements, 0 = shared; y and res dense). wkind: 0 = w (N, K),
 * 1 = packed amx_bf16_vnni2, 2 = w (K, N). Work items are (batch, 32-column panel) pairs. */
static int gemm(const uint16_t *x, const uint16_t *w, const void *b, const uint16_t *res,
                uint16_t *y, int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n,
                int64_t k, int wkind, int act, int nt)
{
    const int64_t kt = (k + TK - 1) / TK, ntiles = (n + TN - 1) / TN, panel = 2 * kt * TILE;
    const int64_t npanels = (ntiles + 1) / 2, nx = xs ? batch : 1;
    const int threads = rc_threads(nt);
    /* x read in place for whole 32-row blocks when K is a multiple of 32; the rest padded */
    const int64_t direct = k % TK ? 0 : kt == 0 ? m : m / 32 * 32;
    const int64_t prows = (m - direct + 31) / 32 * 32;
    uint16_t *pad = direct < m ? padded_rows(x, nx, xs, direct, m, k, kt) : NULL;
    uint16_t *panels = wkind == 1 || !kt ? NULL : aligned_alloc(64, (size_t)(threads * panel * 2));
    if ((direct < m && !pad) || (wkind != 1 && kt && !panels)) {
        free(pad);
        free(panels);
        return -1; /* out of memory: the caller raises MemoryError */
    }
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        tiles_on();
        uint16_t *mine = panels ? panels + omp_get_thread_num() * panel : NULL;
        float c[32 * 32] __attribute__((aligned(64)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * npanels; item++) {
            const int64_t bi = item / npanels, p = item % npanels;
            const int two = 2 * p + 1 < ntiles;
            const uint16_t *wi = w + bi * ws, *xi = x + bi * xs;
            const uint16_t *b0 = mine, *b1 = mine ? mine + kt * TILE : NULL;
            if (wkind == 1) {
                b0 = tile_at(wi, kt, 2 * p, 0);
                b1 = tile_at(wi, kt, 2 * p + two, 0);
            } else if (mine) {
                void (*pk)(const uint16_t *, int64_t, int64_t, int64_t, uint16_t *) =
                    wkind == 2 ? pack_tiles_kn : pack_tiles;
                pk(wi, n, k, 2 * p, mine);
                if (two)
                    pk(wi, n, k, 2 * p + 1, mine + kt * TILE);
            }
            const int64_t n0 = p * 32, nr = rc_min64(32, n - n0);
            const uint16_t *padi = pad ? pad + (xs ? bi : 0) * prows * kt * TK : NULL;
            const uint16_t *resi = res ? res + bi * m * n : NULL;
            for (int64_t m0 = 0; m0 < m; m0 += 32) {
                const char *a = m0 < direct ? (const char *)(xi + m0 * k)
                                            : (const char *)(padi + (m0 - direct) * kt * TK);
                const int64_t lda = m0 < direct ? k * 2 : kt * TK * 2;
                if (two)
                    block_2x2(a, lda, b0, b1, kt, c);
                else
                    block_2x1(a, lda, b0, kt, c);
                rc_epilogue(c, 32, rc_min64(32, m - m0), nr, b, resi, y + bi * m * n, n, m0, n0,
                            act, 1);
            }
        }
        _tile_release();
    }
    free(pad);
    free(panels);
    return 0;
}

int rc_gemm_bf16_amx(const void *x, const void *w, const void *b, const void *res, void *y,
                     int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    return gemm(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt);
}

int rc_matmul_bf16_amx(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                       int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt);
}
