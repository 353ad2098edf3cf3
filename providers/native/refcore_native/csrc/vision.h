/* vision family (specs/vision.yaml): roi_align.
 *
 * x: the (N, C, H, W) map at element strides (sn, sc, sh, sw) (channels-last: sc = 1, the case
 * the channel loop vectorizes), float32 or bf16 (the kernel's tag). boxes: k rows of 5 float32
 * (batch index, x1, y1, x2, y2; bf16 boxes are widened exactly by the caller). y: (k, C, oh, ow)
 * at element strides (yk, yc, yh, yw). ratio > 0: samples per bin side, else adaptive. The box
 * geometry and sample positions are float32, operation by operation without fused multiply-adds
 * (refcore/ops/vision.py); weights and sums are float32, the average is rounded once.
 * Returns 0, or 1 + the first box whose batch index is not in [0, N) or whose geometry is not
 * finite, or whose samples per bin side exceed max_grid (nothing is read for it; y is undefined).
 * nt: threads (1 = serial, 0 = OpenMP default); boxes are split over the threads.
 * This header is also the cffi cdef: plain prototypes only, one per statement.
 */
#ifndef RC_VISION_H
#define RC_VISION_H
#include <stdint.h>

int64_t rc_roi_align_f32_portable(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                  int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                  const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                  float scale, int64_t ratio, int aligned, int64_t max_grid,
                                  void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);
int64_t rc_roi_align_bf16_portable(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                   int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                   const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                   float scale, int64_t ratio, int aligned, int64_t max_grid,
                                   void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);

int64_t rc_roi_align_f32_avx2(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                              int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                              const void *boxes, int64_t k, int64_t oh, int64_t ow,
                              float scale, int64_t ratio, int aligned, int64_t max_grid,
                              void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);
int64_t rc_roi_align_bf16_avx2(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                               int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                               const void *boxes, int64_t k, int64_t oh, int64_t ow,
                               float scale, int64_t ratio, int aligned, int64_t max_grid,
                               void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);

int64_t rc_roi_align_f32_avx512(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                float scale, int64_t ratio, int aligned, int64_t max_grid,
                                void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);
int64_t rc_roi_align_bf16_avx512(const void *x, int64_t n, int64_t c, int64_t h, int64_t w,
                                 int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                                 const void *boxes, int64_t k, int64_t oh, int64_t ow,
                                 float scale, int64_t ratio, int aligned, int64_t max_grid,
                                 void *y, int64_t yk, int64_t yc, int64_t yh, int64_t yw, int nt);

#endif
