/* gemm family, AMX: bf16 GEMM on tiles (TDPBF16PS), fp32 accumulation, fused epilogue.
 *
 * Tiles: C 0-3 (a 32 x 32 fp32 output block as 2 x 2 tiles of 16 x 16), A 4-5 (two 16-row
 * slices of x, 32 bf16 of K each), B 6-7 (two VNNI-2 weight tiles of 16 columns). Work items
 * are (batch, chunk of up to 8 x 32 rows, one 32-column panel of N, or all panels when there
 * are >= 2 chunks per thread), handed out dynamically. x's whole 32-row blocks are read in
 * place as A tiles when K is a multiple of 32; the other blocks are packed per thread into
 * contiguous, zero-padded A tile pairs (once per chunk). A plain weight is packed panel by
 * panel, once per call, into a buffer the threads share (a prepacked one is read in place; with
 * M < N the roles swap, see gemm()). K beyond 384 is walked in chunks of 8 steps: a 16 KB
 * chunk of the panel stays in L1 while the chunk's row blocks pass over it, their fp32 sums
 * parked in a per-thread buffer between K chunks. A finished block's epilogue (bias,
 * activation, residual, bf16 rounding) runs in slices between the next block's tile
 * instructions. gcc's AMX intrinsics are inline asm: tile numbers are literals.
 */
#include <stdlib.h>

#include "gemm.h"
#include "rc_gemm.h"
#define RC_VNNI_DPBF16 1
#include "rc_gemm_vnni.h"

#ifndef __AMX_BF16__
#error "gemm_amx.c needs -mamx-tile -mamx-bf16"
#endif

/* K steps per chunk (8: 16 KB of a panel) and 32-row blocks per chunk of M. Measured at M = 128,
 * N = K = 768, one thread: 1.05 TFLOP/s without K chunks (the whole 48 KB panel from L2), ~1.4
 * with; KC 4 or 16 measured the same as 8; MC 4 cost 5-20% at M = 512-1024 (plain weights).
 * Up to KWHOLE steps (K <= 384) the sums stay in tiles over the whole K (no round trip through
 * the buffer): ~4% faster than chunks of 8 at M = 512-1024, N = K = 384 (one thread, prepacked,
 * x read in place); chunks of 12 at K = 768-3072 were no faster than 8. Software prefetch of
 * the next K step's A tiles cost ~10%. */
enum { KC = 8, MC = 8, KWHOLE = 12 };

/* Below this many rows of x a prepacked weight goes to the vdpbf16ps driver (rc_gemm_vnni.h), not
 * the tiles: with one row (decode) a tile product uses 1 of its 16 rows, and the vector driver
 * streams the packed panel at memory speed. Single thread, cold weights, GB/s of weight at M = 1
 * (tiles / vdpbf16ps): N = K = 4096 11.1 / 17.5; N 2816 K 1024 9.3 / 12.9; N 1024 K 2816
 * 10.8 / 18.3; N 32000 K 1024 11.1 / 14.2. N = K = 4096, us (tiles / vdpbf16ps): M 2 2125 /
 * 2118, M 4 2945 / 2582, M 6 2884 / 3212, M 8 2939 / 3800. */
#define RC_AMX_MIN_M_PACKED 5

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

/* Where a 32-row block's A tiles are: rows 0-15 of K step kb at a + kb * step, rows 16-31 at
 * a + hi + kb * step (elements), ld bytes between rows. Packed (pack_rows): hi TILE, step
 * 2 TILE, ld 64; read in place from a row-major (rows, K) matrix: hi 16 K, step 32, ld 2 K. */
typedef struct {
    const uint16_t *a;
    int64_t hi, step, ld;
} rc_asrc;

/* rows [m0, m0 + mr) x columns [n0, n0 + 32) of y (ld n) from c (mr x 32 fp32, ld 32):
 * y = act(c + b) + res as rc_epilogue, a row at a time: two fp32 vectors rounded into one
 * vector of 32 bf16 (vcvtne2ps2bf16), one 64-byte store. */
static inline __attribute__((always_inline)) void epilogue32_act(
    const float *c, int64_t mr, const void *b, const uint16_t *res, uint16_t *y, int64_t n,
    int64_t m0, int64_t n0, const int act)
{
    const __m512 b0 = b ? rc_load(b, n0, 1) : _mm512_setzero_ps();
    const __m512 b1 = b ? rc_load(b, n0 + 16, 1) : _mm512_setzero_ps();
    for (int64_t r = 0; r < mr; r++) {
        __m512 v0 = rc_act(rc_round_to(_mm512_add_ps(_mm512_load_ps(c + r * 32), b0), 1), act);
        __m512 v1 =
            rc_act(rc_round_to(_mm512_add_ps(_mm512_load_ps(c + r * 32 + 16), b1), 1), act);
        const int64_t at = (m0 + r) * n + n0;
        if (res) { /* each intermediate rounded as rc_epi1 (rc_gemm_fix.h) */
            v0 = _mm512_add_ps(rc_round_to(v0, 1), rc_load(res, at, 1));
            v1 = _mm512_add_ps(rc_round_to(v1, 1), rc_load(res, at + 16, 1));
        }
        _mm512_storeu_si512(y + at, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
    }
}

static void epilogue32(const float *c, int64_t mr, const void *b, const uint16_t *res,
                       uint16_t *y, int64_t n, int64_t m0, int64_t n0, int act)
{
    switch (act) {
#define RC_EPI(a)                                                                                  \
    case a: epilogue32_act(c, mr, b, res, y, n, m0, n0, a); break;
        RC_EPI(RC_ACT_RELU) RC_EPI(RC_ACT_GELU) RC_EPI(RC_ACT_GELU_TANH) RC_EPI(RC_ACT_SILU)
#undef RC_EPI
    default: epilogue32_act(c, mr, b, res, y, n, m0, n0, RC_ACT_NONE); break;
    }
}

/* A finished 32 x 32 fp32 block waiting for its epilogue: batch bi, row block mb, panel p. */
typedef struct {
    const float *c;
    int64_t bi, mb, p;
} rc_done;

/* What the epilogue writes: y[bi] = act(C + b) + res[bi] (tr: C transposed, see gemm()); x, w
 * (batch strides xs, ws; w read as wkind, rc_gemm_fix.h) are gemm()'s operands, for the
 * float64 recomputation of non-finite sums. */
typedef struct {
    const void *b;
    const uint16_t *res;
    uint16_t *y;
    int64_t m, n;
    int act, tr;
    const uint16_t *x, *w;
    int64_t xs, ws, k;
    int wkind;
} rc_out;

/* The epilogue of rows [r0, r1) of block d (tr: the whole block, when r0 is 0). */
static inline void finish(const rc_out *o, const rc_done *d, int64_t r0, int64_t r1)
{
    const int64_t m = o->m, n = o->n, mr = rc_min64(32, m - d->mb * 32);
    const int64_t n0 = d->p * 32, nr = rc_min64(32, n - n0);
    const uint16_t *ri = o->res ? o->res + d->bi * m * n : NULL;
    uint16_t *yi = o->y + d->bi * m * n;
    const uint16_t *xi = o->x + d->bi * o->xs, *wi = o->w + d->bi * o->ws;
    if (!o->tr) {
        r1 = rc_min64(r1, mr);
        if (r0 >= r1)
            return;
        const float *c = d->c + r0 * 32;
        if (nr == 32)
            epilogue32(c, r1 - r0, o->b, ri, yi, n, d->mb * 32 + r0, n0, o->act);
        else
            rc_epilogue(c, 32, r1 - r0, nr, o->b, ri, yi, n, d->mb * 32 + r0, n0, o->act, 1);
        if (!rc_block_finite(c, 32, r1 - r0, nr)) /* overflowed sums: float64 (rc_gemm_fix.h) */
            rc_fix_block(c, 32, r1 - r0, nr, xi, wi, o->wkind, 1, n, o->k, d->mb * 32 + r0, n0,
                         o->b, ri, yi, o->act);
        return;
    }
    if (r0)
        return;
    float ct[32 * 32] __attribute__((aligned(64)));
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            rc_transpose16((const char *)(d->c + i * 16 * 32 + j * 16), 128, 16, 0xffffffffu,
                           (char *)(ct + j * 16 * 32 + i * 16), 128, 16);
    rc_epilogue(ct, 32, nr, mr, o->b, ri, yi, m, n0, d->mb * 32, o->act, 1);
    if (!rc_block_finite(ct, 32, nr, mr)) /* tr: x is the weight (plain), w the input */
        rc_fix_block(ct, 32, nr, mr, wi, xi, 0, 1, m, o->k, n0, d->mb * 32, o->b, ri, yi, o->act);
}

/* The 32 x 32 fp32 block (+)= A @ b over K steps [k0, k1): A the block's rows (src), b0 / b1
 * the panel's two weight tiles per step; the sums start from cin (ld 32 floats; NULL: zeros) and
 * are stored to cout. */
static inline void block_2x2(rc_asrc src, const uint16_t *b0, const uint16_t *b1, int64_t k0,
                             int64_t k1, const float *cin, float *cout, const rc_out *o,
                             const rc_done *pd)
{
    const uint16_t *a = src.a;
    if (!cin) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, cin, 128);
        _tile_loadd(1, cin + 16, 128);
        _tile_loadd(2, cin + 16 * 32, 128);
        _tile_loadd(3, cin + 16 * 32 + 16, 128);
    }
    for (int64_t kb = k0; kb < k1; kb++) {
        _tile_loadd(4, a + kb * src.step, src.ld);
        _tile_loadd(6, b0 + kb * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b1 + kb * TILE, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + src.hi + kb * src.step, src.ld);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        if (pd) /* a slice of the previous block's epilogue between the tile instructions */
            finish(o, pd, (kb - k0) * 32 / (k1 - k0), (kb - k0 + 1) * 32 / (k1 - k0));
    }
    if (pd && k1 == k0)
        finish(o, pd, 0, 32);
    _tile_stored(0, cout, 128);
    _tile_stored(1, cout + 16, 128);
    _tile_stored(2, cout + 16 * 32, 128);
    _tile_stored(3, cout + 16 * 32 + 16, 128);
}

/* The same with one weight tile (the last 16 columns of an odd tile count). */
static inline void block_2x1(rc_asrc src, const uint16_t *b0, int64_t k0, int64_t k1,
                             const float *cin, float *cout, const rc_out *o, const rc_done *pd)
{
    const uint16_t *a = src.a;
    if (!cin) {
        _tile_zero(0);
        _tile_zero(2);
    } else {
        _tile_loadd(0, cin, 128);
        _tile_loadd(2, cin + 16 * 32, 128);
    }
    for (int64_t kb = k0; kb < k1; kb++) {
        _tile_loadd(4, a + kb * src.step, src.ld);
        _tile_loadd(5, a + src.hi + kb * src.step, src.ld);
        _tile_loadd(6, b0 + kb * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (pd)
            finish(o, pd, (kb - k0) * 32 / (k1 - k0), (kb - k0 + 1) * 32 / (k1 - k0));
    }
    if (pd && k1 == k0)
        finish(o, pd, 0, 32);
    _tile_stored(0, cout, 128);
    _tile_stored(2, cout + 16 * 32, 128);
}

/* Rows [32 mb, 32 mb + 32) of x (M, K) as kt pairs of A tiles at dst: K step kb is 2 KB, rows
 * 0-15 then 16-31, 64 B (32 bf16 of K) per row; zeros past M and K. For the blocks that cannot
 * be read in place (the last, partial one; any K not a multiple of 32): reading whole blocks of
 * x in place instead of packing them measured ~1.15x faster at M = 1024, N = K = 384 (the
 * copy, ~12% of the call, is gone; the strided tile loads cost no more). */
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

/* Panel key of a plain weight (0 = w (N, K), 2 = w (K, N)) packed into the shared buffer wp
 * once per call: the first thread to need it claims it (flag 0 -> 1), packs, publishes (2);
 * another thread needing it meanwhile waits (a panel packs in ~2 us). Packing per item instead
 * repeated it once per chunk of M rows: ~35% of the compute at M >= 256. */
static const uint16_t *shared_panel(const uint16_t *w, int64_t n, int64_t k, int64_t p,
                                    int wkind, uint16_t *wp, int *flag)
{
    const int64_t kt = (k + TK - 1) / TK, ntiles = (n + TN - 1) / TN;
    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 2)
        return wp;
    int expect = 0;
    if (__atomic_compare_exchange_n(flag, &expect, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        void (*pk)(const uint16_t *, int64_t, int64_t, int64_t, uint16_t *) =
            wkind == 2 ? rc_pack_vnni_kn : rc_pack_vnni_nk;
        pk(w, n, k, 2 * p, wp);
        if (2 * p + 1 < ntiles)
            pk(w, n, k, 2 * p + 1, wp + kt * TILE);
        __atomic_store_n(flag, 2, __ATOMIC_RELEASE);
        return wp;
    }
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) != 2)
        _mm_pause();
    return wp;
}

/* The driver of linear (batch 1) and matmul: batch products y[i] = act(x[i] @ W[i] + b) + res[i]
 * (x stride xs, w stride ws elements, 0 = shared; y and res dense). wkind: 0 = w (N, K),
 * 1 = packed amx_bf16_vnni2, 2 = w (K, N). Work items are (batch, chunk of MC x 32 rows,
 * 32-column panel), handed out dynamically; each thread packs the rows of x its item needs and
 * cannot read in place into its own buffer (again only when the chunk changes); a plain weight
 * is packed once per call into a shared buffer (shared_panel). No barrier: on a shared machine
 * a thread the OS parks holds up only the item it is on, not the whole call.
 * tr: the roles swapped, for a plain weight at M < N (rc_gemm_bf16_amx passes the weight as x
 * and the activation as w): y (n, m) = act(x @ w.T + b[row of x]).T + res, each fp32 block
 * transposed before its epilogue. The VNNI transpose (~140 cycles per 1 KB tile) then costs
 * M x K, not N x K: at M = 128, N = K = 768 it was ~45% of the call. */
static int gemm(const uint16_t *x, const uint16_t *w, const void *b, const uint16_t *res,
                uint16_t *y, int64_t batch, int64_t xs, int64_t ws, int64_t m, int64_t n,
                int64_t k, int wkind, int act, int nt, int tr)
{
    const int direct = k % TK == 0;
    const int64_t kt = (k + TK - 1) / TK, ntiles = (n + TN - 1) / TN, panel = 2 * kt * TILE;
    const int64_t npanels = (ntiles + 1) / 2, mbs = (m + 31) / 32, chunks = (mbs + MC - 1) / MC;
    const int64_t ablock = 2 * kt * TILE; /* one 32-row block of x, packed */
    const int64_t scratch = MC * ablock; /* per thread */
    const int64_t wpanels = wkind == 1 ? 0 : (ws ? batch : 1) * npanels; /* shared, packed once */
    const int threads = rc_threads(nt);
    /* panels per work item: all of them when there are chunks enough for every thread to
     * take whole ones (x is then packed once per call, not once per thread), else one (M
     * small: the threads split N) */
    const int64_t gsize = batch * chunks >= 2 * threads ? npanels : 1;
    const int64_t groups = (npanels + gsize - 1) / gsize;
    const size_t wbytes = (size_t)(wpanels * panel * 2), xbytes = (size_t)(threads * scratch * 2);
    const size_t fbytes = ((size_t)wpanels * sizeof(int) + 63) / 64 * 64;
    char *buf = kt ? aligned_alloc(64, (wbytes + xbytes + fbytes + 63) / 64 * 64) : NULL;
    if (kt && !buf)
        return -1; /* out of memory: the caller raises MemoryError */
    uint16_t *wshared = buf ? (uint16_t *)buf : NULL, *xbuf = buf ? (uint16_t *)(buf + wbytes) : NULL;
    int *flags = buf ? (int *)(buf + wbytes + xbytes) : NULL;
    if (flags)
        memset(flags, 0, (size_t)wpanels * sizeof(int));

    const int64_t kc = kt == 0 ? 1 : kt <= KWHOLE ? kt : KC;
    RC_PRAGMA(omp parallel num_threads(threads) if (nt != 1))
    {
        tiles_on();
        uint16_t *ap = xbuf ? xbuf + omp_get_thread_num() * scratch : NULL;
        int64_t packed_x = -1; /* (x batch, chunk) whose rows ap holds */
        float c[MC * 32 * 32] __attribute__((aligned(64)));
        float done[2][32 * 32] __attribute__((aligned(64))); /* finished blocks, alternating */
        rc_done pend = {NULL, 0, 0, 0};
        int par = 0;
        const rc_out out = {b, res, y, m, n, act, tr, x, w, xs, ws, k, wkind};
        RC_PRAGMA(omp for schedule(dynamic, 1))
        for (int64_t item = 0; item < batch * chunks * groups; item++) {
            const int64_t bi = item / (chunks * groups), ch = item / groups % chunks;
            const int64_t g = item % groups, mc = ch * MC, mce = rc_min64(mbs, mc + MC);
            const int64_t xkey = (xs ? bi : 0) * chunks + ch;
            if (ap && xkey != packed_x) {
                for (int64_t mb = mc; mb < mce; mb++)
                    if (!direct || 32 * mb + 32 > m)
                        pack_rows(x + bi * xs, m, k, mb, ap + (mb - mc) * ablock);
                packed_x = xkey;
            }
            /* threads start their panels at different points: with a plain weight each then
             * packs its own share first rather than waiting for the other to pack panel 0 */
            const int64_t cnt = rc_min64(npanels, g * gsize + gsize) - g * gsize;
            const int64_t rot = cnt * omp_get_thread_num() / threads;
            for (int64_t j = 0; j < cnt; j++) {
                const int64_t p = g * gsize + (j + rot) % cnt;
                const int two = 2 * p + 1 < ntiles;
                const uint16_t *wi = w + bi * ws, *b0 = NULL, *b1 = NULL;
                if (wkind == 1) {
                    b0 = tile_at(wi, kt, 2 * p, 0);
                    b1 = tile_at(wi, kt, 2 * p + two, 0);
                } else if (kt) {
                    const int64_t key = (ws ? bi : 0) * npanels + p;
                    b0 = shared_panel(wi, n, k, p, wkind, wshared + key * panel, flags + key);
                    b1 = b0 + kt * TILE;
                }
                /* K in chunks of kc steps: the chunk of the panel stays in L1 while the row
                 * blocks pass over it; their fp32 sums wait in c between chunks. A finished
                 * block's epilogue runs in slices between the next block's tile instructions
                 * (independent of them). */
                for (int64_t k0 = 0; k0 < kt || k0 == 0; k0 += kc) {
                    const int64_t k1 = rc_min64(kt, k0 + kc);
                    for (int64_t mb = mc; mb < mce; mb++) {
                        rc_asrc a = {ap ? ap + (mb - mc) * ablock : NULL, TILE, 2 * TILE, 64};
                        if (direct && 32 * mb + 32 <= m)
                            a = (rc_asrc){x + bi * xs + 32 * mb * k, 16 * k, TK, 2 * k};
                        float *cb = c + (mb - mc) * 32 * 32, *dst = k1 == kt ? done[par] : cb;
                        const float *cin = k0 ? cb : NULL;
                        /* the pending block's epilogue runs in slices between this block's
                         * tile instructions (tr: after them) */
                        const rc_done *pd = pend.c && !out.tr ? &pend : NULL;
                        if (two)
                            block_2x2(a, b0, b1, k0, k1, cin, dst, &out, pd);
                        else
                            block_2x1(a, b0, k0, k1, cin, dst, &out, pd);
                        if (pd)
                            pend.c = NULL;
                        if (dst == cb)
                            continue;
                        if (pend.c)
                            finish(&out, &pend, 0, 32);
                        pend = (rc_done){dst, bi, mb, p};
                        par ^= 1;
                    }
                }
            }
        }
        if (pend.c)
            finish(&out, &pend, 0, 32);
        _tile_release();
    }
    free(buf);
    return 0;
}

int rc_gemm_bf16_amx(const void *x, const void *w, const void *b, const void *res, void *y,
                     int64_t m, int64_t n, int64_t k, int packed, int act, int nt)
{
    if (packed && m < RC_AMX_MIN_M_PACKED)
        return gemm_vnni(x, w, b, res, y, 1, 0, 0, m, n, k, 1, act, nt);
    if (!packed && m < n) /* transpose the smaller operand: x */
        return gemm(w, x, b, res, y, 1, 0, 0, n, m, k, 0, act, nt, 1);
    return gemm(x, w, b, res, y, 1, 0, 0, m, n, k, packed ? 1 : 0, act, nt, 0);
}

int rc_matmul_bf16_amx(const void *x, const void *w, void *y, int64_t batch, int64_t xs,
                       int64_t ws, int64_t m, int64_t n, int64_t k, int nt)
{
    return gemm(x, w, NULL, NULL, y, batch, xs, ws, m, n, k, 2, RC_ACT_NONE, nt, 0);
}
