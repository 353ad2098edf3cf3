"""References for the int8 family (specs/int8.yaml): static and dynamic int8 quantization.

Activations are quantized affinely per tensor (``q = clamp(rint(x * (1 / scale)) + zp)``),
weights symmetrically per output channel, and a quantized linear sums ``(x - zp) * w`` exactly
in int32 before one float scale. Every float step is written out in float32 as the spec
declares it, so a kernel doing the same steps matches the reference bit for bit on integer
outputs. `minmax_qparams` is the min-max observer (torch's ``MinMaxObserver`` arithmetic) and
`x86_int8_weight` (and `x86_int8_weight_w7`) the x86 schemes' weight rules (specs/schemes.yaml).

Example:
    >>> import numpy as np
    >>> quantize_per_tensor(np.float32([0.5, -1.0, 300.0]), 0.5, 128, 0, 255, "uint8").tolist()
    [129, 126, 255]
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks, conv
from refcore.tensors import round_to

_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
_AT_LEAST_1D = range(1, 65)
#: qlinear sums (x - zp) * w in int32: |x - zp| <= 255, |w| <= 128, so K up to 65536 is exact
MAX_K = 65536
_F32_EPS = float(np.finfo(np.float32).eps)
#: the x86 recipe's smallest scale (X86InductorQuantizer's observers take eps=2**-12)
X86_EPS = 2.0**-12


def _check_qparams(op: str, scale: float, zero_point: int, quant_min: int, quant_max: int,
                   dtype: str) -> None:  # fmt: skip
    if dtype not in _RANGES:
        _checks.fail(op, "dtype", "'uint8' or 'int8'", repr(dtype))
    lo, hi = _RANGES[dtype]
    if not lo <= quant_min <= quant_max <= hi:
        _checks.fail(op, "quant_min, quant_max", f"{lo} <= quant_min <= quant_max <= {hi}",
                     f"({quant_min}, {quant_max})")  # fmt: skip
    if not quant_min <= zero_point <= quant_max:
        _checks.fail(op, "zero_point", f"in [quant_min, quant_max] = [{quant_min}, {quant_max}]",
                     zero_point)  # fmt: skip
    if not (np.isfinite(scale) and np.float32(scale) > 0):
        _checks.fail(op, "scale", "a finite float > 0 (as float32)", scale)


def check_quantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                              quant_max: int, dtype: str) -> None:  # fmt: skip
    op = "quantize_per_tensor"
    if input.dtype.kind in "biu":
        _checks.fail(op, "input", "a floating tensor", f"dtype {input.dtype}", TypeError)
    _check_qparams(op, scale, zero_point, quant_min, quant_max, dtype)


def quantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                        quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
    """clamp(rint(float32(x * float32(1 / scale))) + zero_point, quant_min, quant_max) in
    ``dtype``; x in float32 (a bf16 input widened exactly), rint half to even; NaN gives
    quant_min."""
    check_quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype)
    inv = np.float32(1.0 / scale)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.rint(input.astype(np.float32) * inv).astype(np.float64) + zero_point
    v = np.where(np.isnan(v), quant_min, np.clip(v, quant_min, quant_max))
    return v.astype(dtype)


def check_dequantize_per_tensor(input: np.ndarray, scale: float, zero_point: int,
                                quant_min: int, quant_max: int, dtype: str) -> None:  # fmt: skip
    op = "dequantize_per_tensor"
    _check_qparams(op, scale, zero_point, quant_min, quant_max, dtype)
    if input.dtype != np.dtype(dtype):
        _checks.fail(op, "input", f"dtype {dtype} (the dtype argument)", f"dtype {input.dtype}",
                     TypeError)  # fmt: skip


def dequantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                          quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
    """float32(q - zero_point) * float32(scale), in float32 (q - zp is exact)."""
    check_dequantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype)
    return (input.astype(np.int32) - zero_point).astype(np.float32) * np.float32(scale)


def _check_channels(op: str, input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                    axis: int, quant_min: int, quant_max: int, dtype: str) -> int:  # fmt: skip
    """The per-channel checks; returns the axis made non-negative."""
    _check_qparams(op, 1.0, quant_min, quant_min, quant_max, dtype)
    if input.ndim == 0:
        _checks.fail(op, "input", "at least one dim (the channel axis)", "a 0-d tensor")
    axis = _checks.normalize_dim(op, "axis", axis, input.ndim)
    c = input.shape[axis]
    _checks.shape(op, "scales", scales, (c,), f" (one per channel along axis {axis})")
    _checks.shape(op, "zero_points", zero_points, (c,), f" (one per channel along axis {axis})")
    s = scales.astype(np.float32)
    if not (np.isfinite(s) & (s > 0)).all():
        _checks.fail(op, "scales", "finite floats > 0", "a zero, negative or non-finite scale")
    if zero_points.size and not (quant_min <= zero_points.min() <= zero_points.max() <= quant_max):
        _checks.fail(op, "zero_points", f"in [quant_min, quant_max] = [{quant_min}, {quant_max}]",
                     f"[{zero_points.min()}, {zero_points.max()}]")  # fmt: skip
    return axis


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along ``axis``."""
    return v.reshape([-1 if d == axis else 1 for d in range(ndim)])


def check_quantize_per_channel(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                               axis: int, quant_min: int, quant_max: int,
                               dtype: str) -> None:  # fmt: skip
    op = "quantize_per_channel"
    if input.dtype.kind in "biu":
        _checks.fail(op, "input", "a floating tensor", f"dtype {input.dtype}", TypeError)
    _check_channels(op, input, scales, zero_points, axis, quant_min, quant_max, dtype)


def quantize_per_channel(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                         axis: int, quant_min: int, quant_max: int,
                         dtype: str) -> np.ndarray:  # fmt: skip
    """`quantize_per_tensor` per channel along ``axis``: channel c's values with float32(1 /
    scales[c]) and zero_points[c]."""
    check_quantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype)
    axis = axis % input.ndim
    inv = _along(np.float32(1) / scales.astype(np.float32), axis, input.ndim)
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.rint(input.astype(np.float32) * inv).astype(np.float64)
    v = v + _along(zero_points.astype(np.float64), axis, input.ndim)
    v = np.where(np.isnan(v), quant_min, np.clip(v, quant_min, quant_max))
    return v.astype(dtype)


def check_dequantize_per_channel(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                                 axis: int, quant_min: int, quant_max: int,
                                 dtype: str) -> None:  # fmt: skip
    op = "dequantize_per_channel"
    _check_channels(op, input, scales, zero_points, axis, quant_min, quant_max, dtype)
    if input.dtype != np.dtype(dtype):
        _checks.fail(op, "input", f"dtype {dtype} (the dtype argument)", f"dtype {input.dtype}",
                     TypeError)  # fmt: skip


def dequantize_per_channel(input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                           axis: int, quant_min: int, quant_max: int,
                           dtype: str) -> np.ndarray:  # fmt: skip
    """float32(q - zero_points[c]) * scales[c] per channel c along ``axis``, in float32."""
    check_dequantize_per_channel(input, scales, zero_points, axis, quant_min, quant_max, dtype)
    axis = axis % input.ndim
    d = input.astype(np.int64) - _along(zero_points.astype(np.int64), axis, input.ndim)
    return d.astype(np.float32) * _along(scales.astype(np.float32), axis, input.ndim)


def check_qlinear(input: np.ndarray, input_scale: float, input_zero_point: int,
                  weight: np.ndarray, weight_scales: np.ndarray,
                  bias: np.ndarray | None = None) -> None:  # fmt: skip
    _check_qparams("qlinear", input_scale, input_zero_point, 0, 255, "uint8")
    _check_int8_linear("qlinear", input, weight, weight_scales, bias)


def _check_int8_linear(op: str, input: np.ndarray, weight: np.ndarray,
                       weight_scales: np.ndarray, bias: np.ndarray | None) -> None:  # fmt: skip
    """The shapes of an int8 linear's input (*, K), weight (N, K), scales (N,), bias (N,)."""
    _checks.rank(op, "input", input, _AT_LEAST_1D)
    _checks.rank(op, "weight", weight, (2,), " (out_features, in_features)")
    k = input.shape[-1]
    if weight.shape[1] != k:
        _checks.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])",
                     f"shape {weight.shape}")  # fmt: skip
    if k > MAX_K:
        _checks.fail(op, "input", f"in_features <= {MAX_K} (int32 sums stay exact)", k)
    n = weight.shape[0]
    _checks.shape(op, "weight_scales", weight_scales, (n,), " (one per output channel)")
    _checks.shape(op, "bias", bias, (n,), " (out_features,)")


def qlinear(input: np.ndarray, input_scale: float, input_zero_point: int, weight: np.ndarray,
            weight_scales: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """u8 (*, K) x s8 (N, K) -> float32 (*, N): acc = sum_k (x - zp) * w exactly (int32),
    s[n] = float32(float32(input_scale) * weight_scales[n]), y = float32(acc) * s[n] + bias[n],
    each step rounded to float32."""
    check_qlinear(input, input_scale, input_zero_point, weight, weight_scales, bias)
    x = input.astype(np.int64) - input_zero_point
    acc = x @ weight.astype(np.int64).T  # exact: |acc| < 2^31 by MAX_K
    s = np.float32(input_scale) * weight_scales.astype(np.float32)
    y = acc.astype(np.float32) * s
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y.astype(np.float32)


def check_dynamic_qlinear(input: np.ndarray, weight: np.ndarray, weight_scales: np.ndarray,
                          bias: np.ndarray | None = None) -> None:  # fmt: skip
    _check_int8_linear("dynamic_qlinear", input, weight, weight_scales, bias)


def token_qparams(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (token) of float32 ``x`` (M, K): `minmax_qparams` over [0, 255] of the row's
    range, float32 eps: (scales float32 (M,), zero points int32 (M,)), the same float32 steps
    vectorised. Rows with inf or NaN get scale NaN."""
    f32 = np.float32
    if x.shape[1]:
        with np.errstate(invalid="ignore"):
            lo = np.minimum(x.min(axis=1), f32(0))
            hi = np.maximum(x.max(axis=1), f32(0))
    else:
        lo = hi = np.zeros(x.shape[0], f32)
    with np.errstate(invalid="ignore", over="ignore"):
        scale = np.maximum((hi - lo).astype(f32) / f32(255), f32(_F32_EPS)).astype(f32)
        zp = np.clip(-np.rint(lo / scale), 0, 255)
    bad = ~np.isfinite(scale)
    return np.where(bad, f32(np.nan), scale), np.where(bad, 0, zp).astype(np.int32)


def dynamic_qlinear(input: np.ndarray, weight: np.ndarray, weight_scales: np.ndarray,
                    bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Dynamic int8 linear: each row (token) of ``input`` (*, K) quantized to uint8 at run time
    with `token_qparams` (q = clamp(rint(x * float32(1 / scale)) + zp, 0, 255), the reciprocal
    a float32 division), then qlinear's exact int32 sums and float32 steps with s[m, n] =
    float32(scale[m] * weight_scales[n]); the result rounded once to the input's dtype. A row
    holding inf or NaN gives NaN."""
    check_dynamic_qlinear(input, weight, weight_scales, bias)
    lead, k = input.shape[:-1], input.shape[-1]
    x = input.astype(np.float32).reshape(int(np.prod(lead)), k)
    scale, zp = token_qparams(x)
    f32 = np.float32
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inv = (f32(1) / scale).astype(f32)
        v = np.rint((x * inv[:, None]).astype(f32)).astype(np.float64) + zp[:, None]
    q = np.clip(np.nan_to_num(v), 0, 255).astype(np.int64)
    acc = (q - zp[:, None]) @ weight.astype(np.int64).T
    with np.errstate(invalid="ignore"):
        s = (scale[:, None] * weight_scales.astype(f32)[None, :]).astype(f32)
        y = (acc.astype(f32) * s).astype(f32)
        if bias is not None:
            y = (y + bias.astype(f32)).astype(f32)
    return round_to(y.reshape(*lead, weight.shape[0]), input.dtype)


def check_qconv2d(input: np.ndarray, input_scale: float, input_zero_point: int,
                  weight: np.ndarray, weight_scales: np.ndarray, bias: np.ndarray | None = None,
                  stride: conv.IntPair = 1, padding: conv.IntPair | str = 0,
                  dilation: conv.IntPair = 1, groups: int = 1) -> None:  # fmt: skip
    op = "qconv2d"
    _check_qparams(op, input_scale, input_zero_point, 0, 255, "uint8")
    try:
        conv.check_conv2d(input, weight, bias, stride, padding, dilation, groups)
    except ValueError as e:  # conv2d's shape rules, under this op's name
        raise type(e)(str(e).replace("conv2d:", f"{op}:", 1)) from None
    o, cg, kh, kw = weight.shape
    if cg * kh * kw > MAX_K:
        _checks.fail(op, "weight", f"C / groups * kH * kW <= {MAX_K} (int32 sums stay exact)",
                     f"shape {weight.shape}")  # fmt: skip
    _checks.shape(op, "weight_scales", weight_scales, (o,), " (one per output channel)")


def qconv2d(input: np.ndarray, input_scale: float, input_zero_point: int, weight: np.ndarray,
            weight_scales: np.ndarray, bias: np.ndarray | None = None,
            stride: conv.IntPair = 1, padding: conv.IntPair | str = 0,
            dilation: conv.IntPair = 1, groups: int = 1) -> np.ndarray:  # fmt: skip
    """conv2d of a uint8 NCHW input (per tensor: scale, zero point) with an int8 weight (O,
    C / groups, kH, kW) (per output channel: weight_scales) -> float32 (N, O, H_out, W_out):
    acc = conv2d(x - zp, w) exactly in int32, the padding being zero_point (0 after the
    subtraction), then qlinear's float32 steps per output channel."""
    check_qconv2d(input, input_scale, input_zero_point, weight, weight_scales, bias, stride,
                  padding, dilation, groups)  # fmt: skip
    x = input.astype(np.float64) - input_zero_point  # float64 sums of integers < 2^53: exact
    acc = conv.conv2d(x, weight.astype(np.float64), None, stride, padding, dilation, groups)
    s = np.float32(input_scale) * weight_scales.astype(np.float32)
    y = acc.astype(np.float32) * s[:, None, None]
    if bias is not None:
        y = y + bias.astype(np.float32)[:, None, None]
    return y.astype(np.float32)


def minmax_qparams(min_val: float, max_val: float, quant_min: int, quant_max: int,
                   symmetric: bool, eps: float = _F32_EPS) -> tuple[float, int]:  # fmt: skip
    """(scale, zero_point) covering [min_val, max_val] and 0, as torch's min-max observers
    compute them in float32: affine: scale = (max+ - min-) / (quant_max - quant_min),
    zero_point = quant_min - rint(min- / scale) clamped to the range; symmetric: scale =
    max(-min-, max+) / ((quant_max - quant_min) / 2), zero_point 0 for a signed range, else
    (quant_min + quant_max) // 2;
    scale at least ``eps`` (float32's by default, as torch's observers; the x86 recipe's is
    2^-12). (min- = min(min_val, 0), max+ = max(max_val, 0).)"""
    f32 = np.float32
    lo, hi = f32(min(min_val, 0.0)), f32(max(max_val, 0.0))
    if symmetric:
        scale = max(f32(max(-lo, hi)) / f32(f32(quant_max - quant_min) / f32(2)), f32(eps))
        return float(scale), (0 if quant_min < 0 else (quant_min + quant_max) // 2)
    scale = max(f32(f32(hi - lo) / f32(quant_max - quant_min)), f32(eps))
    zp = quant_min - int(np.rint(lo / scale))
    return float(scale), int(min(max(zp, quant_min), quant_max))


def x86_int8_weight(weight: np.ndarray, group_size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The ``x86_static_int8`` scheme's weight: a float linear (N, K) or conv (O, C, kH, kW)
    weight -> (int8 of its shape, float32 scales (N,)), symmetric per output channel over
    [-128, 127] as the x86 recipe's per-channel min-max observer: scale = `minmax_qparams` of
    the channel's range with its eps 2^-12, q = `quantize_per_channel` (clamp(rint(float32(w *
    float32(1 / scale))), -128, 127)).
    ``group_size`` is not supported (None)."""
    return _per_channel_weight("x86_static_int8", weight, group_size, -128, 127)


def x86_int8_weight_w7(weight: np.ndarray, group_size: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The ``x86_static_int8_w7`` scheme's weight: `x86_int8_weight` over [-64, 63] (the range
    torch's ``reduce_range`` gives a qint8 observer): scale = max |w| / 63.5 per channel."""
    return _per_channel_weight("x86_static_int8_w7", weight, group_size, -64, 63)


def _per_channel_weight(op: str, weight: np.ndarray, group_size: int | None, qmin: int,
                        qmax: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    _checks.rank(op, "weight", weight, (2, 4), " (out_features, in_features) or a conv's")
    if group_size is not None:
        _checks.fail(op, "group_size", "None (one scale per output channel)", group_size)
    w = weight.astype(np.float32).reshape(weight.shape[0], -1)
    if not np.isfinite(w).all():
        _checks.fail(op, "weight", "finite values", "inf or NaN")
    lo = w.min(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    hi = w.max(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    scales = np.float32([minmax_qparams(a, b, qmin, qmax, True, X86_EPS)[0]
                         for a, b in zip(lo, hi)])  # fmt: skip
    zeros = np.zeros(len(scales), np.int64)
    q = quantize_per_channel(w, scales, zeros, 0, qmin, qmax, "int8")
    return q.reshape(weight.shape), scales
