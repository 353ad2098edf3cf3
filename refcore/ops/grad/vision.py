"""Backward references of the vision family (refcore.ops.grad): roi_align."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from refcore.ops.vision import geometry, grid_size, output_pair, sample_positions, taps
from refcore.tensors import round_to


def roi_align(grad_output: np.ndarray, *, input: np.ndarray, boxes: np.ndarray,
              output_size: int | Sequence[int], spatial_scale: float = 1.0,
              sampling_ratio: int = -1,
              aligned: bool = False) -> dict[str, np.ndarray]:  # fmt: skip
    """roi_align is linear in the map: each output bin is the mean of its samples' bilinear
    taps, so d input scatters each bin's gradient / count back to the four taps of each of its
    samples inside the map, times the tap's weight (torchvision's roi_align_backward; the
    positions and weights are the forward reference's). Boxes get no gradient (torchvision's)."""
    oh, ow = output_pair(output_size)
    n, c, h, w = input.shape
    dx = np.zeros((n, c, h, w))
    g = np.asarray(grad_output, np.float64)
    geo = geometry(boxes, spatial_scale, aligned)
    for k in range(boxes.shape[0]):
        x1, y1, bw, bh = geo[k]
        gh, gw = grid_size(bh, oh, sampling_ratio), grid_size(bw, ow, sampling_ratio)
        if gh * gw == 0:
            continue
        vy, yl, yh, ly = taps(sample_positions(y1, bh, oh, gh), h)
        vx, xl, xh, lx = taps(sample_positions(x1, bw, ow, gw), w)
        # each sample's share of its bin's gradient: (C, oh * gh, ow * gw), bin-major as the
        # positions are; samples outside the map took no part
        share = np.repeat(np.repeat(g[k], gh, axis=1), gw, axis=2) / (gh * gw)
        share = share * (vy[:, None] & vx[None, :])
        hy, hx = 1.0 - ly, 1.0 - lx
        img = dx[int(boxes[k, 0])]
        for ys, xs, wy, wx in ((yl, xl, hy, hx), (yl, xh, hy, lx), (yh, xl, ly, hx),
                               (yh, xh, ly, lx)):  # fmt: skip
            np.add.at(img, (slice(None), ys[:, None], xs[None, :]), share * np.outer(wy, wx))
    return {"input": round_to(dx, input.dtype)}
