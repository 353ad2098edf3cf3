"""Backward references of the norm family (refcore.ops.grad): layer_norm, rms_norm, batch_norm,
group_norm."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from refcore.ops.norm import _eps32, _mean, _normalized_axes
from refcore.tensors import round_to

f64 = np.float64


def _lead_sum(a: np.ndarray, nlead: int) -> np.ndarray:
    return a.sum(axis=tuple(range(nlead)))


def layer_norm(grad_output: np.ndarray, *, input: np.ndarray, normalized_shape: Sequence[int],
               weight: np.ndarray | None = None, bias: np.ndarray | None = None,
               eps: float = 1e-5) -> dict[str, np.ndarray]:  # fmt: skip
    """xhat = (x - mean) rstd over the normalized dims; dW = sum g xhat, db = sum g over the
    leading dims; dx = rstd (h - mean(h) - xhat mean(h xhat)) with h = g W."""
    axes = _normalized_axes("layer_norm", input, normalized_shape)
    x, g = f64(input), f64(grad_output)
    mean = _mean(x, axes)
    rstd = 1 / np.sqrt(_mean((x - mean) ** 2, axes) + _eps32(eps))
    xhat = (x - mean) * rstd
    h = g * f64(weight) if weight is not None else g
    dx = rstd * (h - _mean(h, axes)
                 - xhat * _mean(h * xhat, axes))  # fmt: skip
    out = {"input": round_to(dx, input.dtype)}
    nlead = x.ndim - len(axes)
    if weight is not None:
        out["weight"] = round_to(_lead_sum(g * xhat, nlead), weight.dtype)
    if bias is not None:
        out["bias"] = round_to(_lead_sum(g, nlead), bias.dtype)
    return out


def rms_norm(grad_output: np.ndarray, *, input: np.ndarray, normalized_shape: Sequence[int],
             weight: np.ndarray | None = None,
             eps: float | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """rstd = 1 / sqrt(mean(x^2) + eps); dW = sum g x rstd over the leading dims;
    dx = rstd (h - x rstd^2 mean(h x)) with h = g W."""
    axes = _normalized_axes("rms_norm", input, normalized_shape)
    x, g = f64(input), f64(grad_output)
    e = float(np.finfo(np.float32).eps) if eps is None else eps  # as the forward reference
    rstd = 1 / np.sqrt(_mean(x * x, axes) + _eps32(e))
    h = g * f64(weight) if weight is not None else g
    dx = rstd * (h - x * rstd * rstd * _mean(h * x, axes))
    out = {"input": round_to(dx, input.dtype)}
    if weight is not None:
        out["weight"] = round_to(_lead_sum(g * x * rstd, x.ndim - len(axes)), weight.dtype)
    return out


def batch_norm(grad_output: np.ndarray, *, input: np.ndarray, running_mean: np.ndarray,
               running_var: np.ndarray, weight: np.ndarray | None = None,
               bias: np.ndarray | None = None, training: bool = False, momentum: float = 0.1,
               eps: float = 1e-5) -> dict[str, np.ndarray]:  # fmt: skip
    """Inference batch_norm (the running statistics are constants): dx = g W rstd,
    dW = sum g xhat, db = sum g over every dim but the channels (axis 1)."""
    x, g = f64(input), f64(grad_output)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    rstd = 1 / np.sqrt(f64(running_var).reshape(shape) + _eps32(eps))
    xhat = (x - f64(running_mean).reshape(shape)) * rstd
    w = f64(weight).reshape(shape) if weight is not None else 1.0
    axes = tuple(i for i in range(x.ndim) if i != 1)
    out = {"input": round_to(g * w * rstd, input.dtype)}
    if weight is not None:
        out["weight"] = round_to((g * xhat).sum(axis=axes), weight.dtype)
    if bias is not None:
        out["bias"] = round_to(g.sum(axis=axes), bias.dtype)
    return out


def group_norm(grad_output: np.ndarray, *, input: np.ndarray, num_groups: int,
               weight: np.ndarray | None = None, bias: np.ndarray | None = None,
               eps: float = 1e-5) -> dict[str, np.ndarray]:  # fmt: skip
    """layer_norm's gradient over each (sample, group) block: xhat = (x - mean) rstd per block;
    h = g W[c]; dx = rstd (h - mean(h) - xhat mean(h xhat)) per block; dW[c] = sum g xhat and
    db[c] = sum g over every dim but the channels (axis 1)."""
    if input.size == 0:  # sums over no values (no (N, num_groups) statistics: see the forward)
        out = {"input": np.zeros(input.shape, input.dtype)}
        out.update({k: np.zeros(t.shape, t.dtype) for k, t in (("weight", weight), ("bias", bias))
                    if t is not None})  # fmt: skip
        return out
    n, c = input.shape[:2]
    block = (n, num_groups, (c // num_groups) * math.prod(input.shape[2:]))
    shape = (1, c) + (1,) * (input.ndim - 2)
    x, g = f64(input), f64(grad_output)
    xb = x.reshape(block)
    mean = _mean(xb, (2,))
    rstd = 1 / np.sqrt(_mean((xb - mean) ** 2, (2,)) + _eps32(eps))
    xhat = ((xb - mean) * rstd).reshape(x.shape)
    h = (g * f64(weight).reshape(shape) if weight is not None else g).reshape(block)
    hx = (h * xhat.reshape(block))
    dx = rstd * (h - _mean(h, (2,)) - xhat.reshape(block) * _mean(hx, (2,)))
    out = {"input": round_to(dx.reshape(x.shape), input.dtype)}
    axes = tuple(i for i in range(x.ndim) if i != 1)
    if weight is not None:
        out["weight"] = round_to((g * xhat).sum(axis=axes), weight.dtype)
    if bias is not None:
        out["bias"] = round_to(g.sum(axis=axes), bias.dtype)
    return out
