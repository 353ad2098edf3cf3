"""Normalisation references: batch_norm (inference), layer_norm, rms_norm, group_norm.

Precision policy: upcast every tensor to float64, compute the statistics, the normalisation and the
weight/bias step there, round once to the input dtype.
NOTE: torch 2.13's CPU kernels for bf16 compute these norms in fp32 (statistics, rsqrt, weight and
bias included) and round the output to bf16 once; float64 rounds the same way except at exact ties
of the fp32 result, within one bf16 ulp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from refcore.ops import _checks
from refcore.tensors import fp32_scalar, round_to

#: numpy arrays have at most 64 dims; ``range(k, 65)`` reads as "k-D or more" in messages.
_ANY_RANK_FROM_2 = range(2, 65)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _normalized_axes(
    op: str, input: np.ndarray, normalized_shape: Sequence[int]
) -> tuple[int, ...]:
    """Check that ``normalized_shape`` is the non-empty tail of ``input.shape``; return its axes."""
    ns = tuple(normalized_shape)
    if not ns:
        _checks.fail(op, "normalized_shape", "at least one dimension", "()")
    k = len(ns)
    if input.ndim < k or tuple(input.shape[input.ndim - k :]) != ns:
        _checks.fail(op, "normalized_shape", f"the trailing dims of input {tuple(input.shape)}", ns)
    return tuple(range(input.ndim - k, input.ndim))


def _eps32(eps: float) -> float:
    """``eps`` as the fp32 value the kernels add.

    NOTE: torch 2.13's CPU norm kernels add eps in their fp32 compute type (float32 and bf16
    inputs alike), so an eps past FLT_MAX (1e300) is inf there: rstd 0, the output the bias (NaN
    where x or the weight is inf). Rounding it here keeps that meaning; in float64 the reference
    gave (x - mean) * 1e-150 * weight instead, which no fp32 kernel can form (found by
    refcore.fuzz). Below FLT_MAX the rounding changes the result by ~1e-8 relative at most.
    """
    return fp32_scalar(eps)


def _mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    # sum / count, so an empty normalised extent gives an empty result without a warning.
    count = int(np.prod([x.shape[a] for a in axes]))
    return x.sum(axis=axes, keepdims=True) / max(count, 1)


def _exact_mean(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """`_mean` with each finite slice summed exactly (`math.fsum`): a float64 sum loses a row's
    small values beside +-3e38 (float64 holds 53 bits; fp32 values span 277 binades), and where
    the large ones cancel, those small values are the whole mean (found by refcore.fuzz: the
    plain sum gave mean 0 for a row whose exact mean is 0.0125, outputs 2.5% off at weights
    near 1e37). Slices holding inf or NaN keep the plain sum (inf - inf is NaN, as in torch)."""
    mean = _mean(x, axes)
    if x.size == 0 or mean.size == 0:
        return mean
    rows = np.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim)))
    rows = rows.reshape(mean.size, -1)
    flat = mean.reshape(-1).copy()
    for i in np.flatnonzero(np.isfinite(flat)):
        flat[i] = math.fsum(rows[i]) / rows.shape[1]
    return flat.reshape(mean.shape)


def check_batch_norm(
    input: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> None:
    op = "batch_norm"
    _checks.rank(op, "input", input, _ANY_RANK_FROM_2, " (N, C, *)")
    channels = (input.shape[1],)
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):  # fmt: skip
        _checks.shape(op, name, t, channels, " (one value per channel, input.shape[1])")
    _checks.positive(op, "eps", eps, strict=False)


def batch_norm(
    input: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> np.ndarray:
    """(x - running_mean) / sqrt(running_var + eps) * weight + bias, per channel (axis 1).

    Inference only: ``training`` is always False (spec choices), so ``momentum`` is unused and the
    running statistics are read, never updated.
    """
    check_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    per_channel = (1, input.shape[1]) + (1,) * (input.ndim - 2)

    def chan(t: np.ndarray) -> np.ndarray:
        return _f64(t).reshape(per_channel)

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = (_f64(input) - chan(running_mean)) / np.sqrt(chan(running_var) + _eps32(eps))
        if weight is not None:
            y = y * chan(weight)
        if bias is not None:
            y = y + chan(bias)
    return round_to(y, input.dtype)


def check_layer_norm(
    input: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> None:
    op = "layer_norm"
    _normalized_axes(op, input, normalized_shape)
    ns = tuple(normalized_shape)
    _checks.shape(op, "weight", weight, ns, " (normalized_shape)")
    _checks.shape(op, "bias", bias, ns, " (normalized_shape)")
    _checks.positive(op, "eps", eps, strict=False)


def layer_norm(
    input: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims.

    ``var`` is the biased (population) variance, as torch uses.
    """
    check_layer_norm(input, normalized_shape, weight, bias, eps)
    axes = _normalized_axes("layer_norm", input, normalized_shape)
    x = _f64(input)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        centered = x - _exact_mean(x, axes)
        y = centered / np.sqrt(_mean(centered * centered, axes) + _eps32(eps))
        if weight is not None:
            y = y * _f64(weight)
        if bias is not None:
            y = y + _f64(bias)
    return round_to(y, input.dtype)


def check_rms_norm(
    input: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    eps: float | None = None,
) -> None:
    op = "rms_norm"
    _normalized_axes(op, input, normalized_shape)
    _checks.shape(op, "weight", weight, tuple(normalized_shape), " (normalized_shape)")
    if eps is not None:
        _checks.positive(op, "eps", eps, strict=False)


def rms_norm(
    input: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    eps: float | None = None,
) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing ``normalized_shape`` dims."""
    check_rms_norm(input, normalized_shape, weight, eps)
    axes = _normalized_axes("rms_norm", input, normalized_shape)
    if eps is None:
        # NOTE: torch 2.13 takes eps=None as the machine epsilon of its compute type, which is fp32
        # for both float32 and bf16 inputs (2**-23), not finfo(bfloat16).eps; it also multiplies by
        # weight in fp32 before the single rounding to bf16.
        eps = float(np.finfo(np.float32).eps)
    x = _f64(input)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        y = x / np.sqrt(_mean(x * x, axes) + _eps32(eps))
        if weight is not None:
            y = y * _f64(weight)
    return round_to(y, input.dtype)


def check_group_norm(
    input: np.ndarray,
    num_groups: int,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> None:
    op = "group_norm"
    _checks.rank(op, "input", input, _ANY_RANK_FROM_2, " (N, C, *)")
    _checks.positive(op, "num_groups", num_groups)
    c = input.shape[1]
    if c % num_groups:
        _checks.fail(op, "num_groups", f"a divisor of the {c} channels (input.shape[1])",
                     num_groups)  # fmt: skip
    for name, t in (("weight", weight), ("bias", bias)):
        _checks.shape(op, name, t, (c,), " (one value per channel, input.shape[1])")
    _checks.positive(op, "eps", eps, strict=False)


def group_norm(
    input: np.ndarray,
    num_groups: int,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    """Normalise each (sample, group of C / num_groups channels) block of an (N, C, *) input by
    its mean and biased variance, then weight * . + bias per channel (axis 1).

    The block is viewed as one row (channels of a group are consecutive), so the statistics are
    layer_norm's over that row, the exact mean included; any input layout gives the same values.
    """
    check_group_norm(input, num_groups, weight, bias, eps)
    if input.size == 0:  # no block to normalise, so no (N, num_groups) statistics either: with
        return round_to(np.zeros(input.shape), input.dtype)  # C = 0 any num_groups divides C
    n, c = input.shape[:2]
    x = _f64(input).reshape(n, num_groups, (c // num_groups) * math.prod(input.shape[2:]))
    per_channel = (1, c) + (1,) * (input.ndim - 2)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        centered = x - _exact_mean(x, (2,))
        y = (centered / np.sqrt(_mean(centered * centered, (2,)) + _eps32(eps)))
        y = y.reshape(input.shape)
        if weight is not None:
            y = y * _f64(weight).reshape(per_channel)
        if bias is not None:
            y = y + _f64(bias).reshape(per_channel)
    return round_to(y, input.dtype)
