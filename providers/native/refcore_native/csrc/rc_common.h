/* Shared by every kernel file: scalar bf16 conversion, thread count, small helpers.
 *
 * Everything here is `static inline`: each translation unit (one per family x ISA level, each
 * compiled with its own -m flags) gets its own copy, so no AVX-512 code can leak into the
 * portable objects through a shared (COMDAT) symbol.
 *
 * Preconditions for every kernel (checked in Python before the call): pointers are to
 * C-contiguous buffers of the stated sizes and dtypes, sizes are >= 0, optional pointers are NULL
 * when absent. Kernels write only to their output buffer.
 */
#ifndef RC_COMMON_H
#define RC_COMMON_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* RC_FN(rc_gelu_f32) names the function for the level being compiled (rc_gelu_f32_avx512): a
 * file compiled at several levels (per-file flags) defines RC_LEVEL before including itself. */
#define RC_CAT_(a, b) a##_##b
#define RC_CAT(a, b) RC_CAT_(a, b)
#define RC_FN(name) RC_CAT(name, RC_LEVEL)

/* bf16 travels as its bit pattern (uint16_t). Widening is exact. */
static inline float rc_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch and ml_dtypes do; a NaN stays a (quiet) NaN. */
static inline uint16_t rc_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* v rounded to the dtype and widened back (the identity for fp32): what a store then a load
 * gives. Fused epilogues round each intermediate the unfused ops would store (refcore.derive). */
static inline float rc_round1(float v, int bf16)
{
    return bf16 ? rc_bf16_to_f32(rc_f32_to_bf16(v)) : v;
}

static inline float rc_ld(const void *p, int64_t i, int bf16)
{
    return bf16 ? rc_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void rc_st(void *p, int64_t i, float v, int bf16)
{
    if (bf16)
        ((uint16_t *)p)[i] = rc_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* Threads for a parallel region: the caller passes torch.get_num_threads() (1 for small work);
 * 0 means OpenMP's default (OMP_NUM_THREADS). The library binds to the libgomp torch loaded, so
 * both share one pool. */
static inline int rc_threads(int nt)
{
    return nt > 0 ? nt : omp_get_max_threads();
}

/* Rows per dynamically scheduled chunk: ~64 KB of input. Dynamic scheduling (one atomic per
 * chunk) keeps both threads busy when the OS preempts one of them, which a static split cannot:
 * on a shared machine the whole call would wait for the descheduled thread. */
static inline int64_t rc_rows_per_chunk(int64_t row_bytes)
{
    int64_t r = (int64_t)65536 / (row_bytes > 0 ? row_bytes : 1);
    return r > 0 ? r : 1;
}

/* The parallel loop of every kernel: chunks of `chunk` iterations handed out dynamically to nt
 * threads (1 = serial, no parallel region; 0 = OpenMP's default). OpenMP 4.5 only: the library
 * must load next to the libgomp torch ships. */
#define RC_PRAGMA(x) _Pragma(#x)
#define RC_PARALLEL_FOR(nt, chunk)                                                                 \
    RC_PRAGMA(omp parallel for schedule(dynamic, chunk) num_threads(rc_threads(nt)) if (nt != 1))

static inline int64_t rc_min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* Prefetch the cache lines of rows [r0, r1) x elements [c0, c0 + cols) of a row-major y (ld
 * elements of esize bytes each): the lines a GEMM's next register block will store. Without
 * it each block's stores wait for their lines to come from L3 or memory, and the store buffer
 * holds back the next block's dot products (Zen 4, bf16 1024 x 384 x 1536, one thread: 167-174
 * GFLOP/s without, 191-195 with). Every address lies inside y; a prefetch never faults. */
static inline void rc_prefetch_rows(const void *y, int64_t ld, int64_t esize, int64_t r0,
                                    int64_t r1, int64_t c0, int64_t cols)
{
    for (int64_t r = r0; r < r1; r++) {
        const char *row = (const char *)y + (r * ld + c0) * esize;
        for (int64_t off = 0; off < cols * esize; off += 64)
            __builtin_prefetch(row + off, 0, 3);
    }
}

#endif
