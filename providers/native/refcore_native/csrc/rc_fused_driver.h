/* The thread drivers of the fused family, shared by fused_<level>.c.
 *
 * The includer defines RC_LEVEL (the symbol suffix, see RC_FN), RC_CHUNK (elements per flat
 * chunk), span(a, b, y, lo, hi, op, bf16) (y = act(a + b) over [lo, hi)) and
 * ln_row(a, b, w, bias, y, d, eps, bf16) (one add + layer_norm row), then includes this file and
 * instantiates RC_ADD_ACT / RC_ADD_LN per op and dtype.
 *
 * The parallel loops are written out in each exported function: gcc outlines an OpenMP region
 * before inlining, so a region inside a shared always_inline helper would see `op` and `bf16` as
 * variables and test them for every vector.
 */
#ifndef RC_FUSED_DRIVER_H
#define RC_FUSED_DRIVER_H

#define RC_ROW(p, i, rs) ((const char *)(p) + (i) * (rs) * esz)

#define RC_ADD_ACT(name, tag, op, bf16)                                                            \
    void RC_FN(rc_##name##_##tag)(const void *a, const void *b, void *y, int64_t rows,             \
        int64_t d, int64_t a_rs, int64_t b_rs, int nt)                                             \
    {                                                                                              \
        const int64_t esz = bf16 ? 2 : 4, n = rows * d;                                            \
        if (a_rs == d && b_rs == d) {                                                              \
            RC_PARALLEL_FOR(nt, 1)                                                                 \
            for (int64_t c = 0; c < (n + RC_CHUNK - 1) / RC_CHUNK; c++)                            \
                span(a, b, y, c * RC_CHUNK, rc_min64(n, (c + 1) * RC_CHUNK), op, bf16);            \
            return;                                                                                \
        }                                                                                          \
        RC_PARALLEL_FOR(nt, rc_rows_per_chunk(d * esz))                                            \
        for (int64_t i = 0; i < rows; i++)                                                         \
            span(RC_ROW(a, i, a_rs), RC_ROW(b, i, b_rs), (char *)y + i * d * esz, 0, d, op, bf16); \
    }

#define RC_ADD_LN(tag, bf16)                                                                       \
    void RC_FN(rc_add_layer_norm_##tag)(const void *a, const void *b, const void *w,               \
        const void *bias, void *y, int64_t rows, int64_t d, int64_t a_rs, int64_t b_rs,            \
        double eps, int nt)                                                                        \
    {                                                                                              \
        const int64_t esz = bf16 ? 2 : 4;                                                          \
        RC_PARALLEL_FOR(nt, rc_rows_per_chunk(2 * d * esz))                                        \
        for (int64_t i = 0; i < rows; i++)                                                         \
            ln_row(RC_ROW(a, i, a_rs), RC_ROW(b, i, b_rs), w, bias, (char *)y + i * d * esz, d,    \
                   eps, bf16);                                                                     \
    }

#endif
