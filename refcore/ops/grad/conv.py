"""Backward references of the conv family (refcore.ops.grad): conv2d."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from refcore.ops.conv import IntPair, pads, pair
from refcore.tensors import round_to

f64 = np.float64


def conv2d(grad_output: np.ndarray, *, input: np.ndarray, weight: np.ndarray,
           bias: np.ndarray | None = None, stride: IntPair = 1, padding: IntPair | str = 0,
           dilation: IntPair = 1, groups: int = 1) -> dict[str, np.ndarray]:  # fmt: skip
    """The forward's windows again (zero-padded input, stride, dilation, groups): dW correlates
    them with g, dx adds each window's share g W back where the window read (then the padding is
    cut off), db sums g over batch and space."""
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    n, c = input.shape[:2]
    o, cg, kh, kw = weight.shape
    (pt, pb), (pl, pr) = pads(padding, weight, (dh, dw))
    x = np.pad(f64(input), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    hp, wp = x.shape[2:]
    xg = x.reshape(n, groups, cg, hp, wp)
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = sliding_window_view(xg, span, axis=(3, 4))[:, :, :, ::sh, ::sw, ::dh, ::dw]
    oh, ow = win.shape[3:5]
    g = f64(grad_output).reshape(n, groups, o // groups, oh, ow)
    wg = f64(weight).reshape(groups, o // groups, cg, kh, kw)
    dwin = np.einsum("ngoyx,gocij->ngcyxij", g, wg, optimize=True)
    dx = np.zeros((n, groups, cg, hp, wp))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            dx[:, :, :, rows, cols] += dwin[..., i, j]
    dx = dx.reshape(n, c, hp, wp)[:, :, pt : hp - pb, pl : wp - pr]
    dweight = np.einsum("ngoyx,ngcyxij->gocij", g, win, optimize=True).reshape(weight.shape)
    out = {"input": round_to(dx, input.dtype), "weight": round_to(dweight, weight.dtype)}
    if bias is not None:
        out["bias"] = round_to(g.reshape(n, o, oh, ow).sum(axis=(0, 2, 3)), bias.dtype)
    return out
