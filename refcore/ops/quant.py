"""References for the quant family (specs/quant.yaml): weight-only quantized linear.

The weight's value is exactly ``int8 * scale``, or ``q4 * scale + min`` (float64 is exact for
both), so the references are `refcore.ops.linalg.linear`'s float64 product on that weight.
`woq_int8_weight` and `woq_int4_weight` are the schemes' rules for making such weights from a
float one (specs/schemes.yaml, `refcore.quantize`).

Example:
    >>> import numpy as np
    >>> woq_linear(np.float32([[1.0, 2.0]]), np.int8([[1, -2]]), np.float32([0.5])).tolist()
    [[-1.5]]
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to

_AT_LEAST_1D = range(1, 65)


def check_woq_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray,
                     bias: np.ndarray | None = None) -> None:  # fmt: skip
    op = "woq_linear"
    _checks.rank(op, "input", input, _AT_LEAST_1D)
    _checks.rank(op, "weight", weight, (2,), " (out_features, in_features)")
    k = input.shape[-1]
    if weight.shape[1] != k:
        _checks.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])",
                     f"shape {weight.shape}")  # fmt: skip
    n = weight.shape[0]
    if scales.ndim != 2:
        _checks.shape(op, "scales", scales, (n,), " (one per output channel, or (N, groups))")
    elif scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        want = f"shape (N, groups) = ({n}, g) with g dividing in_features {k}"
        _checks.fail(op, "scales", want, f"shape {scales.shape}")
    _checks.shape(op, "bias", bias, (n,), " (out_features,)")


def woq_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray,
               bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """input @ (weight * scale).T + bias: (*, K) x int8 (N, K) -> (*, N); the scale of
    weight[n, k] is scales[n] (per channel) or scales[n, k // (K / groups)] (per group)."""
    check_woq_linear(input, weight, scales, bias)
    w = weight.astype(np.float64) * _per_value(scales, weight.shape[1])
    with np.errstate(invalid="ignore", over="ignore"):
        y = input.astype(np.float64) @ w.T
        if bias is not None:
            y = y + bias.astype(np.float64)
    return round_to(y, input.dtype)


def _per_value(scales: np.ndarray, k: int) -> np.ndarray:
    """The scale of each weight value, float64, broadcastable to (N, K)."""
    s = scales.astype(np.float64)
    if s.ndim == 1:
        return s[:, None]
    return np.repeat(s, k // s.shape[1], axis=1) if s.shape[1] else s


def check_woq_int4_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray,
                          mins: np.ndarray, bias: np.ndarray | None = None) -> None:  # fmt: skip
    op = "woq_int4_linear"
    _checks.rank(op, "input", input, _AT_LEAST_1D)
    _checks.rank(op, "weight", weight, (2,), " (out_features, in_features / 2)")
    k = input.shape[-1]
    if k % 2:
        _checks.fail(op, "input", "an even in_features (two 4-bit weights per byte)", f"{k}")
    if weight.shape[1] != k // 2:
        _checks.fail(op, "weight", f"shape (N, {k // 2}) (in_features / 2 bytes per row)",
                     f"shape {weight.shape}")  # fmt: skip
    n = weight.shape[0]
    _checks.rank(op, "scales", scales, (2,), " (out_features, groups)")
    g = scales.shape[1]
    if scales.shape[0] != n or (k and (g == 0 or k % g or (k // g) % 2)):
        want = (
            f"shape (N, groups) = ({n}, g), g dividing in_features {k} into groups of an even size"
        )
        _checks.fail(op, "scales", want, f"shape {scales.shape}")
    _checks.shape(op, "mins", mins, scales.shape, " (as scales: one per group)")
    _checks.shape(op, "bias", bias, (n,), " (out_features,)")


def woq_int4_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray, mins: np.ndarray,
                    bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """input @ W.T + bias with W[n, k] = q[n, k] * scales[n, g] + mins[n, g] (g = k's group), q
    the 4-bit codes of ``weight`` (low nibble first: `unpack_int4`); exact in float64."""
    check_woq_int4_linear(input, weight, scales, mins, bias)
    k = input.shape[-1]
    q = unpack_int4(weight).astype(np.float64)
    w = q * _per_value(scales, k) + _per_value(mins, k)
    with np.errstate(invalid="ignore", over="ignore"):
        y = input.astype(np.float64) @ w.T
        if bias is not None:
            y = y + bias.astype(np.float64)
    return round_to(y, input.dtype)


def unpack_int4(weight: np.ndarray) -> np.ndarray:
    """uint8 (N, K / 2) -> the codes (N, K) in 0..15: byte j gives k = 2j (its low nibble) and
    k = 2j + 1 (its high nibble)."""
    w = np.asarray(weight, np.uint8)
    return np.stack([w & 0x0F, w >> 4], axis=-1).reshape(w.shape[0], 2 * w.shape[1])


def pack_int4(q: np.ndarray) -> np.ndarray:
    """Codes (N, K) in 0..15, K even -> uint8 (N, K / 2); the inverse of `unpack_int4`."""
    q = np.asarray(q, np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


#: the woq_int4 scheme's code range: 0..15
QMAX4 = 15


def woq_int4_weight(weight: np.ndarray, group_size: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The ``woq_int4`` scheme: a float weight (N, K) -> (uint8 (N, K / 2), float32 scales and
    mins (N, K / group_size)).

    Asymmetric, per group of ``group_size`` (even) consecutive values along K: min = the
    group's smallest value and scale = fp32((max - min) / 15) (1 where max == min), both fp32;
    q = clamp(round_half_to_even((w - min) / scale), 0, 15) in float64. A group whose values are
    GGUF Q4_1 codes (q * d + m, with 0 and 15 used) comes back exactly. Non-finite weights are an
    error.
    """
    op = "woq_int4"
    _checks.rank(op, "weight", weight, (2,), " (out_features, in_features)")
    n, k = weight.shape
    if group_size < 2 or group_size % 2 or k % group_size:
        _checks.fail(op, "group_size", f"an even divisor of in_features {k}", group_size)
    w = weight.astype(np.float64)
    if not np.isfinite(w).all():
        _checks.fail(op, "weight", "finite values", "inf or NaN")
    g = w.reshape(n, k // group_size, group_size)
    lo = g.min(axis=2) if k else np.zeros(g.shape[:2])
    hi = g.max(axis=2) if k else np.zeros(g.shape[:2])
    mins = lo.astype(np.float32)
    scales = np.where(hi > lo, (hi - lo) / QMAX4, 1.0).astype(np.float32)
    q = np.rint((g - mins.astype(np.float64)[:, :, None]) / scales.astype(np.float64)[:, :, None])
    q = np.clip(q, 0, QMAX4).reshape(n, k)
    return pack_int4(q), scales, mins


#: the woq_int8 scheme's int8 range: symmetric, so -128 is never produced (q and -q both fit)
QMAX = 127


def woq_int8_weight(weight: np.ndarray, group_size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The ``woq_int8`` scheme: a float weight (N, K) -> (int8 (N, K), float32 scales).

    Symmetric, per output channel (scales (N,)), or per group of ``group_size`` consecutive
    values along K (scales (N, K / group_size)): scale = fp32(max |w| / 127) over the channel or
    group (1 where all are 0), q = clamp(round_half_to_even(float32(w * float32(1 / scale))),
    -127, 127), as torch.quantize_per_channel computes it (a float32 reciprocal and product,
    then nearbyint). Non-finite weights are an error: no scale represents them.
    """
    op = "woq_int8"
    _checks.rank(op, "weight", weight, (2,), " (out_features, in_features)")
    n, k = weight.shape
    if group_size is not None and (group_size < 1 or k % group_size):
        _checks.fail(op, "group_size", f"a divisor of in_features {k}", group_size)
    w = weight.astype(np.float64)
    if not np.isfinite(w).all():
        _checks.fail(op, "weight", "finite values", "inf or NaN")
    g = w.reshape(n, k // group_size, group_size) if group_size else w.reshape(n, 1, k)
    amax = np.abs(g).max(axis=2) if k else np.zeros(g.shape[:2])
    scales = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    inv = np.float32(1) / scales  # float32 division, as torch's 1.0f / scale
    g32 = weight.astype(np.float32).reshape(g.shape)
    q = np.clip(np.rint(g32 * inv[:, :, None]), -QMAX, QMAX)
    return q.reshape(n, k).astype(np.int8), (scales if group_size else scales[:, 0])
