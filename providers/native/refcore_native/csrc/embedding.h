/* embedding family (specs/embedding.yaml): embedding (row gather), embedding_bag (pooled gather).
 *
 * w: (v, d) table, C-contiguous, float32 or bf16 (the kernel's tag). idx: n indices, int64 when
 * idx64 else int32, every one in [0, v). embedding: out (n, d) = w[idx], a row copy (memcpy:
 * one portable kernel serves both dtypes and every level, row_bytes = d * element size).
 * embedding_bag: bag b pools positions [bounds[b], bounds[b + 1]) of idx; bounds (bags + 1
 * int64) starts at 0, never decreases and ends at n. mode 0 sum, 1 mean, 2 max, 3 min (NaN
 * sticky); psw (n weights of the table's dtype) or NULL: each row is scaled by its weight before
 * it is pooled, in every mode (embedding_bag passes them with sum only; spmm_reduce, a CSR
 * matrix times a dense one, passes its values: bounds = crow, idx = col, w = dense). out (bags,
 * d); an empty bag is 0.
 * ahead: rows to prefetch ahead of the one being read (0: none). nt: threads (1 = serial, 0 =
 * OpenMP default).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_EMBEDDING_H
#define RC_EMBEDDING_H
#include <stdint.h>

void rc_embedding_rows_portable(const void *w, int64_t row_bytes, const void *idx, int idx64,
                                int64_t n, void *out, int ahead, int nt);
void rc_embedding_bag_f32_portable(const void *w, int64_t d, const void *idx, int idx64,
                                   const void *bounds, int64_t bags, const void *psw, int mode,
                                   void *out, int ahead, int nt);
void rc_embedding_bag_bf16_portable(const void *w, int64_t d, const void *idx, int idx64,
                                    const void *bounds, int64_t bags, const void *psw,
                                    int mode, void *out, int ahead, int nt);

void rc_embedding_bag_f32_avx2(const void *w, int64_t d, const void *idx, int idx64,
                               const void *bounds, int64_t bags, const void *psw, int mode,
                               void *out, int ahead, int nt);
void rc_embedding_bag_bf16_avx2(const void *w, int64_t d, const void *idx, int idx64,
                                const void *bounds, int64_t bags, const void *psw, int mode,
                                void *out, int ahead, int nt);

void rc_embedding_bag_f32_avx512(const void *w, int64_t d, const void *idx, int idx64,
                                 const void *bounds, int64_t bags, const void *psw, int mode,
                                 void *out, int ahead, int nt);
void rc_embedding_bag_bf16_avx512(const void *w, int64_t d, const void *idx, int idx64,
                                  const void *bounds, int64_t bags, const void *psw, int mode,
                                  void *out, int ahead, int nt);

void rc_embedding_bag_bf16_avx512_bf16(const void *w, int64_t d, const void *idx, int idx64,
                                       const void *bounds, int64_t bags, const void *psw,
                                       int mode, void *out, int ahead, int nt);

/* spmm_reduce_backward (rc_spmm_t.h): g (rows, d) = grad_output, crow (rows + 1 int64), col /
 * vals the CSR pattern, dense (K, d) (read for amax / amin only), mode 0 sum, 1 mean, 2 amax,
 * 3 amin; column blocks cbounds (nblocks + 1 int64) over the K output rows; arg (rows, d) int64
 * scratch for amax / amin (else NULL), acc (K, d) fp32 scratch, out (K, d) of the dtype (== acc
 * for fp32). */
void rc_spmm_reduce_backward_f32_portable(const void *g, int64_t d, const void *crow,
                                          int64_t rows, const void *col, int idx64,
                                          const void *vals, const void *dense, int mode,
                                          const void *cbounds, int64_t nblocks, void *arg,
                                          void *acc, void *out, int nt);
void rc_spmm_reduce_backward_bf16_portable(const void *g, int64_t d, const void *crow,
                                           int64_t rows, const void *col, int idx64,
                                           const void *vals, const void *dense, int mode,
                                           const void *cbounds, int64_t nblocks, void *arg,
                                           void *acc, void *out, int nt);
void rc_spmm_reduce_backward_f32_avx2(const void *g, int64_t d, const void *crow,
                                      int64_t rows, const void *col, int idx64,
                                      const void *vals, const void *dense, int mode,
                                      const void *cbounds, int64_t nblocks, void *arg,
                                      void *acc, void *out, int nt);
void rc_spmm_reduce_backward_bf16_avx2(const void *g, int64_t d, const void *crow,
                                       int64_t rows, const void *col, int idx64,
                                       const void *vals, const void *dense, int mode,
                                       const void *cbounds, int64_t nblocks, void *arg,
                                       void *acc, void *out, int nt);
void rc_spmm_reduce_backward_f32_avx512(const void *g, int64_t d, const void *crow,
                                        int64_t rows, const void *col, int idx64,
                                        const void *vals, const void *dense, int mode,
                                        const void *cbounds, int64_t nblocks, void *arg,
                                        void *acc, void *out, int nt);
void rc_spmm_reduce_backward_bf16_avx512(const void *g, int64_t d, const void *crow,
                                         int64_t rows, const void *col, int idx64,
                                         const void *vals, const void *dense, int mode,
                                         const void *cbounds, int64_t nblocks, void *arg,
                                         void *acc, void *out, int nt);
void rc_spmm_reduce_backward_bf16_avx512_bf16(const void *g, int64_t d, const void *crow,
                                              int64_t rows, const void *col, int idx64,
                                              const void *vals, const void *dense, int mode,
                                              const void *cbounds, int64_t nblocks, void *arg,
                                              void *acc, void *out, int nt);

/* gather_scatter (rc_gather_scatter.h): x (N, d), src / dst (ne int64, src in [0, N), dst in
 * [0, dim_size)), w (ne weights of x's dtype) or NULL, mode 0 sum, 1 mean, 2 amax, 3 amin; node
 * blocks nbounds (nblocks + 1 int64, 0 to dim_size); count (dim_size int64) scratch for mean /
 * amax / amin (else NULL), acc (dim_size, d) fp32 scratch, out (dim_size, d) of the dtype (== acc
 * for fp32); ahead: listed edges to prefetch ahead (0: none). */
void rc_gather_scatter_f32_portable(const void *x, int64_t d, const void *src, const void *dst,
                                    int64_t ne, const void *w, int mode, const void *nbounds,
                                    int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                    int nt);
void rc_gather_scatter_bf16_portable(const void *x, int64_t d, const void *src, const void *dst,
                                     int64_t ne, const void *w, int mode, const void *nbounds,
                                     int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                     int nt);
void rc_gather_scatter_f32_avx2(const void *x, int64_t d, const void *src, const void *dst,
                                int64_t ne, const void *w, int mode, const void *nbounds,
                                int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                int nt);
void rc_gather_scatter_bf16_avx2(const void *x, int64_t d, const void *src, const void *dst,
                                 int64_t ne, const void *w, int mode, const void *nbounds,
                                 int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                 int nt);
void rc_gather_scatter_f32_avx512(const void *x, int64_t d, const void *src, const void *dst,
                                  int64_t ne, const void *w, int mode, const void *nbounds,
                                  int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                  int nt);
void rc_gather_scatter_bf16_avx512(const void *x, int64_t d, const void *src, const void *dst,
                                   int64_t ne, const void *w, int mode, const void *nbounds,
                                   int64_t nblocks, void *count, void *acc, void *out, int ahead,
                                   int nt);
void rc_gather_scatter_bf16_avx512_bf16(const void *x, int64_t d, const void *src,
                                        const void *dst, int64_t ne, const void *w, int mode,
                                        const void *nbounds, int64_t nblocks, void *count,
                                        void *acc, void *out, int ahead, int nt);

#endif
