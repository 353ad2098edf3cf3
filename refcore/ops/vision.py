"""Detection references: roi_align (torchvision.ops.roi_align's meaning).

Precision policy: the sample positions are computed in float32, operation by operation and
without fused multiply-adds, exactly as torchvision's kernel computes them for float32 input
(bf16 boxes are widened to float32 first): its per-bin grid size is the ceiling of a float32
quotient and a sample at the edge of the map is dropped by a comparison, so the positions decide
discrete things that a float64 geometry would decide differently. The interpolation weights,
the sums and the average are float64 from those positions, rounded once to the input dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to

_F32 = np.float32


#: samples per bin side above which a call is rejected (an adaptive grid follows the box size:
#: a box of 1e30 pixels would take forever, in torchvision as here)
MAX_GRID = 4096


def check_roi_align(
    input: np.ndarray,
    boxes: np.ndarray,
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> None:
    op = "roi_align"
    _checks.rank(op, "input", input, (4,), " (N, C, H, W)")
    if input.shape[2] < 1 or input.shape[3] < 1:
        _checks.fail(op, "input", "a feature map of height and width >= 1", input.shape)
    _checks.rank(op, "boxes", boxes, (2,), " (K, 5): batch index, x1, y1, x2, y2")
    _checks.shape(op, "boxes", boxes, (boxes.shape[0], 5), " (batch index, x1, y1, x2, y2)")
    oh, ow = output_pair(output_size)
    _checks.positive(op, "output_size", oh)
    _checks.positive(op, "output_size", ow)
    if not (np.isfinite(spatial_scale) and spatial_scale > 0):
        _checks.fail(op, "spatial_scale", "a finite value > 0", spatial_scale)
    if sampling_ratio > MAX_GRID:
        _checks.fail(op, "sampling_ratio", f"at most {MAX_GRID} samples per bin side",
                     sampling_ratio)  # fmt: skip
    b = boxes.astype(np.float64)
    if not np.isfinite(b).all():
        _checks.fail(op, "boxes", "finite values", "a non-finite value")
    idx = b[:, 0]
    frac = idx[idx != np.round(idx)]
    if frac.size:
        _checks.fail(op, "boxes", "whole numbers in column 0 (the batch index)", frac[0])
    if idx.size and (idx.min() < 0 or idx.max() >= input.shape[0]):
        _checks.fail(op, "boxes", f"batch indices (column 0) in [0, {input.shape[0]})",
                     f"range [{int(idx.min())}, {int(idx.max())}]", IndexError)  # fmt: skip
    with np.errstate(over="ignore", invalid="ignore"):
        geo = geometry(boxes, spatial_scale, aligned)
        if not np.isfinite(geo).all():
            _checks.fail(op, "boxes", "coordinates finite once scaled by spatial_scale",
                         "an overflow to infinity")  # fmt: skip
        if sampling_ratio <= 0 and boxes.shape[0]:
            most = max(grid_size(geo[:, 3].max(), oh, 0), grid_size(geo[:, 2].max(), ow, 0))
            if most > MAX_GRID:
                _checks.fail(op, "boxes", f"boxes of at most {MAX_GRID} adaptive samples per "
                             "bin side", f"{most}")  # fmt: skip


def boxes_of(boxes: Any) -> Any:
    """torchvision's two box formats as roi_align's (K, 5) rows: a (K, 5) tensor as it is, a
    list of per-image (L_i, 4) tensors (image i's boxes) with i prepended as the batch index
    (torchvision.ops._utils.convert_boxes_to_roi_format). Torch tensors or NumPy arrays."""
    if not isinstance(boxes, (list, tuple)):
        return boxes
    if any(b.ndim != 2 or b.shape[1] != 4 for b in boxes):
        _checks.fail("roi_align", "boxes", "a (K, 5) tensor or a list of (L, 4) tensors",
                     [tuple(b.shape) for b in boxes])  # fmt: skip
    if boxes and hasattr(boxes[0], "new_full"):  # torch
        import torch

        ids = [b.new_full((b.shape[0], 1), i) for i, b in enumerate(boxes)]
        return torch.cat([torch.cat(ids), torch.cat(list(boxes))], dim=1)
    ids = [np.full((b.shape[0], 1), i, dtype=b.dtype) for i, b in enumerate(boxes)]
    if not boxes:
        return np.zeros((0, 5), np.float32)
    return np.concatenate([np.concatenate(ids), np.concatenate(boxes)], axis=1)


def output_pair(output_size: int | Sequence[int]) -> tuple[int, int]:
    """``output_size`` as (height, width): an int is both."""
    if isinstance(output_size, (int, np.integer)):
        return int(output_size), int(output_size)
    return int(output_size[0]), int(output_size[1])


def geometry(boxes: np.ndarray, spatial_scale: float, aligned: bool) -> np.ndarray:
    """(K, 4) float32 (x1, y1, width, height) of each box on the map: torchvision's
    ``box * spatial_scale - offset`` in float32, sides at least 1 when not aligned."""
    b = boxes.astype(_F32)
    scale, offset = _F32(spatial_scale), _F32(0.5 if aligned else 0.0)
    x1, y1, x2, y2 = (b[:, i] * scale - offset for i in range(1, 5))
    bw, bh = x2 - x1, y2 - y1
    if not aligned:
        bw, bh = np.maximum(bw, _F32(1.0)), np.maximum(bh, _F32(1.0))
    return np.stack([x1, y1, bw, bh], axis=1).astype(_F32)


def sample_positions(lo: np.float32, size: np.float32, bins: int, grid: int) -> np.ndarray:
    """(bins * grid,) float32 sample positions along one axis of one box: torchvision's
    ``lo + b * bin_size + (i + 0.5) * bin_size / grid`` evaluated left to right in float32."""
    bin_size = _F32(size / _F32(bins))
    b = np.arange(bins, dtype=_F32)[:, None]
    i = (np.arange(grid, dtype=_F32) + _F32(0.5))[None, :]
    return ((lo + b * bin_size) + (i * bin_size) / _F32(grid)).reshape(-1)


def grid_size(size: np.float32, bins: int, sampling_ratio: int) -> int:
    """Samples per bin along one axis: ``sampling_ratio`` when > 0, else ceil(size / bins) in
    float32 (torchvision's adaptive rule; 0 for an empty or inverted box)."""
    if sampling_ratio > 0:
        return int(sampling_ratio)
    return max(int(np.ceil(_F32(size / _F32(bins)))), 0)


def taps(pos: np.ndarray, extent: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per position: inside [-1, extent], its low and high neighbour (both the last pixel at
    and past it) and the high one's float64 weight (positions below 0 read pixel 0)."""
    inside = (pos >= -1.0) & (pos <= extent)
    p = np.maximum(np.where(inside, pos, 0).astype(np.float64), 0.0)
    low = np.floor(p).astype(np.int64)
    edge = low >= extent - 1
    low = np.where(edge, extent - 1, low)
    high = np.where(edge, extent - 1, low + 1)
    return inside, low, high, np.where(edge, 0.0, p - low)


def roi_align(
    input: np.ndarray,
    boxes: np.ndarray,
    output_size: int | Sequence[int],
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> np.ndarray:
    """Average of bilinear samples of ``input`` over each box's output bins: (K, C, oh, ow).

    Box k = (batch index, x1, y1, x2, y2) in input-image coordinates, scaled by spatial_scale
    (and shifted by half a pixel when aligned); without aligned a box is at least 1 x 1. Each of
    the oh x ow bins averages grid_h x grid_w samples (`grid_size`; the count is at least 1); a
    sample outside [-1, H] x [-1, W] counts as 0, one inside is its four bilinear taps, each
    weight times its pixel (so a zero weight times an infinite pixel is NaN, as torchvision).
    """
    check_roi_align(input, boxes, output_size, spatial_scale, sampling_ratio, aligned)
    oh, ow = output_pair(output_size)
    _, c, h, w = input.shape
    out = np.zeros((boxes.shape[0], c, oh, ow))
    x = input.astype(np.float64)
    geo = geometry(boxes, spatial_scale, aligned)
    for k in range(boxes.shape[0]):
        x1, y1, bw, bh = geo[k]
        gh, gw = grid_size(bh, oh, sampling_ratio), grid_size(bw, ow, sampling_ratio)
        vy, yl, yh, ly = taps(sample_positions(y1, bh, oh, gh), h)
        vx, xl, xh, lx = taps(sample_positions(x1, bw, ow, gw), w)
        f = x[int(boxes[k, 0])]
        hy, hx = (1.0 - ly)[:, None], (1.0 - lx)[None, :]
        ly, lx = ly[:, None], lx[None, :]
        yl, yh, xl, xh = yl[:, None], yh[:, None], xl[None, :], xh[None, :]
        with np.errstate(invalid="ignore"):  # 0 * inf is NaN, as in torchvision
            v = (hy * hx * f[:, yl, xl] + hy * lx * f[:, yl, xh]
                 + ly * hx * f[:, yh, xl] + ly * lx * f[:, yh, xh])  # fmt: skip
        v = np.where(vy[:, None] & vx[None, :], v, 0.0)
        total = v.reshape(c, oh, gh, ow, gw).sum(axis=(2, 4))
        out[k] = total / max(gh * gw, 1)
    return round_to(out, input.dtype)
