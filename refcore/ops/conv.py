"""Convolution reference: conv2d (NCHW logical layout, any memory layout).

Precision policy: upcast input, weight and bias to float64, accumulate in float64, round once to
the input dtype.
NOTE: torch's CPU conv2d for bf16 (oneDNN) accumulates in fp32 and rounds the result, bias
included, once (RNE); float64 accumulation rounds the same way except where the fp32 sum and the
exact sum straddle a bf16 rounding boundary (at most one bf16 ulp).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from refcore.ops import _checks
from refcore.tensors import round_to

IntPair = int | Sequence[int]


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def pair(v: IntPair) -> tuple[int, int]:
    """A stride, dilation or padding as (height, width). Part of conv2d's declared meaning, as
    `pads` is: kernels and the packed layouts read the geometry through these, not their own."""
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


def pads(
    padding: IntPair | str, weight: np.ndarray, dilation: tuple[int, int]
) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) zero padding of ``padding`` (an int pair, ``"valid"`` or
    ``"same"``) for this weight and dilation."""
    if padding == "valid":
        return (0, 0), (0, 0)
    if padding == "same":
        # NOTE: torch pads d * (k - 1) in total and puts the odd element at the bottom / right.
        totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        (t0, b0), (t1, b1) = ((t // 2, t - t // 2) for t in totals)
        return (t0, b0), (t1, b1)
    ph, pw = pair(padding)
    return (ph, ph), (pw, pw)


def check_conv2d(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> None:
    op = "conv2d"
    # NOTE: torch also accepts unbatched (C, H, W) input; refcore's conv2d is batched NCHW only.
    _checks.rank(op, "input", input, (4,), " (N, C, H, W); unbatched input is not supported")
    _checks.rank(op, "weight", weight, (4,), " (out_channels, in_channels / groups, kH, kW)")
    stride, dilation = pair(stride), pair(dilation)
    if min(stride) <= 0:
        _checks.fail(op, "stride", "positive values", stride)
    if min(dilation) <= 0:
        _checks.fail(op, "dilation", "positive values", dilation)
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            _checks.fail(op, "padding", "'valid', 'same' or an int pair", repr(padding))
        if padding == "same" and stride != (1, 1):
            _checks.fail(op, "stride", "1 with padding='same' (as torch)", stride)
    elif min(pair(padding)) < 0:
        _checks.fail(op, "padding", "non-negative values", pair(padding))
    _checks.positive(op, "groups", groups)
    c, (o, cg, kh, kw) = input.shape[1], weight.shape
    # NOTE: torch 2.13 returns a malformed (N, 0, H_out, W_out) result for 0 input channels
    # instead of the bias; refcore rejects that input rather than give it a meaning torch lacks.
    if c == 0 or c % groups:
        want = f"channels (dim 1) a positive multiple of groups={groups}"
        _checks.fail(op, "input", want, f"{c} channels")
    if o == 0 or o % groups:
        _checks.fail(
            op, "weight", f"out_channels (dim 0) a positive multiple of groups={groups}", o
        )
    if cg * groups != c:
        want = f"shape[1] == {c // groups} (input channels {c} / groups {groups})"
        _checks.fail(op, "weight", want, f"shape {weight.shape}")
    if kh == 0 or kw == 0:  # torch raises too; a kernel would divide by its size
        _checks.fail(
            op, "weight", "a kernel of at least 1 x 1 (kH, kW >= 1)", f"shape {weight.shape}"
        )
    _checks.shape(op, "bias", bias, (o,), " (out_channels,)")
    widths = pads(padding, weight, dilation)
    padded = tuple(n + sum(p) for n, p in zip(input.shape[2:], widths))
    span = ((kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1)
    if padded[0] < span[0] or padded[1] < span[1]:
        want = f"padded spatial size >= dilated kernel size {span} (output size >= 1)"
        _checks.fail(op, "input", want, f"padded size {padded}")


def output_shape(
    input: np.ndarray,
    weight: np.ndarray,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
) -> tuple[int, int, int, int]:
    """(N, out_channels, H_out, W_out) of a valid conv2d call."""
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    (t, b), (lft, r) = pads(padding, weight, (dh, dw))
    kh, kw = weight.shape[2:]
    ho = (input.shape[2] + t + b - (kh - 1) * dh - 1) // sh + 1
    wo = (input.shape[3] + lft + r - (kw - 1) * dw - 1) // sw + 1
    return (input.shape[0], weight.shape[0], ho, wo)


def conv2d(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> np.ndarray:
    """Cross-correlation of zero-padded NCHW input with (O, C/groups, kH, kW) weight, plus bias."""
    check_conv2d(input, weight, bias, stride, padding, dilation, groups)
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    n = input.shape[0]
    o, cg, kh, kw = weight.shape
    x = np.pad(_f64(input), ((0, 0), (0, 0), *pads(padding, weight, (dh, dw))))
    x = x.reshape(n, groups, cg, *x.shape[2:])
    span = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    # windows: (n, g, cg, out_h, out_w, kh, kw)
    win = sliding_window_view(x, span, axis=(3, 4))[:, :, :, ::sh, ::sw, ::dh, ::dw]
    wg = _f64(weight).reshape(groups, o // groups, cg, kh, kw)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.einsum("ngcyxij,gocij->ngoyx", win, wg, optimize=True)
        y = y.reshape(n, o, *y.shape[3:])
        if bias is not None:
            y = y + _f64(bias)[:, None, None]
    return round_to(y, input.dtype)
