/* gemm family, AMX: bf16 GEMM on tiles (TDPBF16PS), fp32 accumulation, fused epilogue.
 *
 * Tiles: C 0-3 (a 32 x 32 fp32 output block as 2 x 2 tiles of 16 x 16), A 4-5 (two 16-row
 * slices of x, 32 bf16 of K each), B 6-7 (two VNNI-2 weight tiles of 16 columns). Work items
 * are (batch, chunk of up to 8 x 32 rows, 32-column panel of N), handed out dynamically. Each
 * thread packs the rows of x of its item's chunk into contiguous, zero-padded A tile pairs
 * (once per chunk) and the item's weight panel (plain weights; a prepacked one is read in
 * place), then walks K in chunks of 8 steps: a 16 KB chunk of the panel stays in L1 while the
 * chunk's row blocks pass over it, their fp32 sums parked in a per-thread buffer between K
 * chunks. gcc's AMX intrinsics are inline asm: tile numbers are literals.
 */
#include <stdlib.h>

#include "gemm.h"
#include "rc_gemm.h"

#ifndef __AMX_BF16__
#error "gemm_amx.c needs -mamx-tile -mamx-bf16"
#endif

/* K steps per chunk (8: 16 KB of a panel) and 32-row blocks per chunk of M. Measured at M = 128,
 * N = K = 768, one thread: 1.05 TFLOP/s without K chunks (the whole 48 KB panel from L2), ~1.4
 * with; KC 4 or 16 measured the same as 8; MC 4 cost 5-20% at M = 512-1024 (plain weights). */
enum { KC = 8, MC = 8 };

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

void rc_gemm_pack_bf16_amx(const void *w, void *wp, int64_t n, int64_t k, int nt)
{
    const int64_t kt = (k + TK - 1) / TK;
    RC_PARALLEL_FOR(nt, 4)
    for (int64_t nb = 0; nb < (n + TN - 1) / TN; nb++)
        rc_pack_vnni_nk(w, n, k, nb, (uint16_t *)wp + nb * kt * TILE);
}

/* c (32 x 32 fp32, ld 32) (+)= a @ b over K steps [k0, k1): a holds the block's packed A tile
 * pairs (2 KB per K step), b0 / b1 the panel's two weight tiles per step; first: c starts at 0. */
static inline void block_2x2(const uint16_t *a, const uint16_t *b0, const uint16_t *b1,
                             int64_t k0, int64_t k1, float *c, int first)
{
    if (first) {
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
    for (int64_t kb = k0; kb < k1; kb++) {
        _tile_loadd(4, a + kb * 2 * TILE, 64);
        _tile_loadd(5, a + kb * 2 * TILE + TILE, 64);
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
static inline void block_2x1(const uint16_t *a, const uint16_t *b0, int64_t k0, int64_t k1,
                             float *c, int first)
{
    if (first) {
        _tile_zero(0);
        _tile_zero(2);
    } else {
        _tile_loadd(0, c, 128);
        _tile_loadd(2, c + 16 * 32, 128);
    }
    for (int64_t kb = k0; kb < k1; kb++) {
        _tile_loadd(4, a + kb * 2 * TILE, 64);
        _tile_loadd(5, a + kb * 2 * TILE + TILE, 64);
        _tile_loadd(6, b0 + kb * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
    }
    _tile_stored(0, c, 128);
    _tile_stored(2, c + 16 * 32, 128);
}

/* Rows [32 mb, 32 mb + 32) of x (M, K) as kt pairs of A tiles at dst: K step kb is 2 KB, rows
 * 0-15 then 16-31, 64 B (32 bf16 of K) per row; zeros past M and K. Contiguous tiles keep the
 * tile loads on sequential lines (strided rows of x ran ~1.2x slower, L2-bound). */
static void pack_rows(const uint16_t *x, int64_t m, int64_t k, int64_t mb, uint16_t *dst)
{
    const int64_t kt = (k + TK - 1) / TK;
    for (int64_t r = 0; r < 32; r++) {
        const int64_t row = 32 * mb + r;
        for (int64_t kb = 0; kb < kt; kb++) {
            __m512i v = row < m ? _mm512_maskz_loadu_epi16(rc_tail32(k - kb * TK), x + row * k + kb * TK)
                                : _mm512_setzero_si512();
            _mm512_store_si512(dst + kb * 2 * TILE + r * TK, v);
        }
    }
}

/* The driver of linear (batch 1) and matmul: batch products y[i] = act(x[i] @ W[i] + b) + res[i]
 * (x stride xs, w stride ws elements, 0 = shared; y and res dense). wkind: 0 = w (N, K),
 * 1 = packed amx_bf16_vnni2, 2 = w (K, N). Work items are (batch, chunk of MC x 32 rows,
 * 32-column panel), handed out dynamically; each thread packs the rows of x its item needs into
 * its own buffer (again only when the chunk changes). No barrier: on a shared machine a thread
 * the OS parks holds up only the item it is on, not the whole call. */
static int gemm(const uint16_t *x, const uint16_t *w, const void *b, const uint16_t *res,
                uint16_t *y, int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n,
                int64_t k, int wkind, int act, int nt)
{
    const int64_t kt = (k + TK - 1) / TK, ntiles = (n + TN - 1) / TN, panel = 2 * kt * TILE;
    const int64_t npanels = (ntiles + 1) / 2, mbs = (m + 31) / 32, chunks = (mbs + MC - 1) / MC;
    const int64_t ablock = 2 * kt * TILE; /* one 32-row block of x, packed */
    const int64_t scratch = MC * ablock + (wkind == 1 ? 0 : panel); /* per thread */
    const int threads = rc_threads(nt);
    uint16_t *buf = kt ? aligned_alloc(64, (size_t)(threads * scratch * 2)) : NULL;
    if (kt && !buf)
        return -1; /* out of memory: the caller raises MemoryError */
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        tiles_on();
        uint16_t *ap = buf ? buf + omp_get_thread_num() * scratch : NULL;
        uint16_t *mine = buf && wkind != 1 ? ap + MC * ablock : NULL;
        int64_t packed_x = -1; /* (x batch, chunk) whose rows ap holds */
        float c[MC * 32 * 32] __attribute__((aligned(64)));
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * chunks * npanels; item++) {
            const int64_t bi = item / (chunks * npanels), ch = item / npanels % chunks;
            const int64_t p = item % npanels, mc = ch * MC, mce = rc_min64(mbs, mc + MC);
            const int64_t xkey = (xs ? bi : 0) * chunks + ch;
            if (ap && xkey != packed_x) {
                for (int64_t mb = mc; mb < mce; mb++)
                    pack_rows(x + bi * xs, m, k, mb, ap + (mb - mc) * ablock);
                packed_x = xkey;
            }
            const int two = 2 * p + 1 < ntiles;
            const uint16_t *wi = w + bi * ws;
            const uint16_t *b0 = mine, *b1 = mine ? mine + kt * TILE : NULL;
            if (wkind == 1) {
                b0 = tile_at(wi, kt, 2 * p, 0);
                b1 = tile_at(wi, kt, 2 * p + two, 0);
            } else if (mine) {
                void (*pk)(const uint16_t *, int64_t, int64_t, int64_t, uint16_t *) =
                    wkind == 2 ? rc_pack_vnni_kn : rc_pack_vnni_nk;
                pk(wi, n, k, 2 * p, mine);
                if (two)
                    pk(wi, n, k, 2 * p + 1, mine + kt * TILE);
            }
            const int64_t n0 = p * 32, nr = rc_min64(32, n - n0);
            /* K in chunks of KC steps: the chunk of the panel (KC x 2 KB) stays in L1 while the
             * row blocks pass over it; their fp32 sums wait in c between chunks */
            for (int64_t k0 = 0; k0 < kt || k0 == 0; k0 += KC) {
                const int64_t k1 = rc_min64(kt, k0 + KC);
                for (int64_t mb = mc; mb < mce; mb++) {
                    const uint16_t *a = ap ? ap + (mb - mc) * ablock : NULL;
                    float *cb = c + (mb - mc) * 32 * 32;
                    if (two)
                        block_2x2(a, b0, b1, k0, k1, cb, k0 == 0);
                    else
                        block_2x1(a, b0, k0, k1, cb, k0 == 0);
                }
            }
            for (int64_t mb = mc; mb < mce; mb++)
                rc_epilogue(c + (mb - mc) * 32 * 32, 32, rc_min64(32, m - mb * 32), nr, b,
                            res ? res + bi * m * n : NULL, y + bi * m * n, n, mb * 32, n0, act, 1);
        }
        _tile_release();
    }
    free(buf);
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
