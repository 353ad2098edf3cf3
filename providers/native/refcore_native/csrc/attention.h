/* attention family (specs/attention.yaml): scaled_dot_product_attention, one prototype per
 * kernel and ISA level.
 *
 * q (nb, L, E), k (nb, S, E), v (nb, S, Ev), mask (nb, L, S) or NULL, out (nb, L, Ev): any
 * element strides (out's columns dense). Element (b, i, j) of tensor t (0 q, 1 k, 2 v, 3 mask,
 * 4 out) lies at element offs[t * nb + b] + i * st[2t] + j * st[2t + 1] from its base pointer
 * (offs: int64 (5, nb), st: int64 (10,), st[9] = 1). mask_kind: 0 none, 1 bool (uint8, nonzero =
 * attend), 2 float (the dtype of q, added to the scores). causal: top-left aligned (query i sees
 * keys j <= i). Rows of out do not overlap. L, S, Ev >= 1, E >= 0, scale finite. nt: threads
 * (1 = serial, 0 = OpenMP default).
 * Returns 0, or -1 when scratch memory could not be allocated (out is then incomplete).
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_ATTENTION_H
#define RC_ATTENTION_H
#include <stdint.h>

int rc_scaled_dot_product_attention_f32_portable(const void *q, const void *k, const void *v,
                                                  const void *mask, void *out, const void *offs,
                                                  const void *st, int64_t nb, int64_t L,
                                                  int64_t S, int64_t E, int64_t Ev,
                                                  int mask_kind, int causal, double scale,
                                                  int nt);
int rc_scaled_dot_product_attention_bf16_portable(const void *q, const void *k, const void *v,
                                                   const void *mask, void *out, const void *offs,
                                                   const void *st, int64_t nb, int64_t L,
                                                   int64_t S, int64_t E, int64_t Ev,
                                                   int mask_kind, int causal, double scale,
                                                   int nt);

int rc_scaled_dot_product_attention_f32_avx2(const void *q, const void *k, const void *v,
                                              const void *mask, void *out, const void *offs,
                                              const void *st, int64_t nb, int64_t L, int64_t S,
                                              int64_t E, int64_t Ev, int mask_kind, int causal,
                                              double scale, int nt);
int rc_scaled_dot_product_attention_bf16_avx2(const void *q, const void *k, const void *v,
                                               const void *mask, void *out, const void *offs,
                                               const void *st, int64_t nb, int64_t L, int64_t S,
                                               int64_t E, int64_t Ev, int mask_kind, int causal,
                                               double scale, int nt);

int rc_scaled_dot_product_attention_f32_avx512(const void *q, const void *k, const void *v,
                                                const void *mask, void *out, const void *offs,
                                                const void *st, int64_t nb, int64_t L, int64_t S,
                                                int64_t E, int64_t Ev, int mask_kind, int causal,
                                                double scale, int nt);
int rc_scaled_dot_product_attention_bf16_avx512(const void *q, const void *k, const void *v,
                                                 const void *mask, void *out, const void *offs,
                                                 const void *st, int64_t nb, int64_t L,
                                                 int64_t S, int64_t E, int64_t Ev, int mask_kind,
                                                 int causal, double scale, int nt);

int rc_scaled_dot_product_attention_bf16_avx512_bf16(const void *q, const void *k, const void *v,
                                                      const void *mask, void *out,
                                                      const void *offs, const void *st,
                                                      int64_t nb, int64_t L, int64_t S, int64_t E,
                                                      int64_t Ev, int mask_kind, int causal,
                                                      double scale, int nt);

int rc_scaled_dot_product_attention_bf16_amx(const void *q, const void *k, const void *v,
                                             const void *mask, void *out, const void *offs,
                                             const void *st, int64_t nb, int64_t L, int64_t S,
                                             int64_t E, int64_t Ev, int mask_kind, int causal,
                                             double scale, int nt);

#endif
