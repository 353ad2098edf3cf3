"""Backward references of the linalg family (refcore.ops.grad): linear, matmul."""

from __future__ import annotations

import numpy as np

from refcore.ops.grad.elementwise import unbroadcast as _unbroadcast
from refcore.tensors import round_to

f64 = np.float64


def linear(grad_output: np.ndarray, *, input: np.ndarray, weight: np.ndarray,
           bias: np.ndarray | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """y = x W^T + b: dx = g W, dW = g^T x and db = g summed over every leading dim."""
    rows = int(np.prod(input.shape[:-1]))
    g = f64(grad_output).reshape(rows, weight.shape[0])
    x = f64(input).reshape(rows, weight.shape[1])
    out = {
        "input": round_to((g @ f64(weight)).reshape(input.shape), input.dtype),
        "weight": round_to(g.T @ x, weight.dtype),
    }
    if bias is not None:
        out["bias"] = round_to(g.sum(axis=0), bias.dtype)
    return out


def matmul(grad_output: np.ndarray, *, input: np.ndarray,
           other: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """torch.matmul's gradients: a 1-D operand is a row (left) or column (right) vector, batch
    dims broadcast; each gradient is g against the other operand, summed back over broadcast."""
    a, b, g = f64(input), f64(other), f64(grad_output)
    if b.ndim == 1:  # first: a scalar output (both 1-D) gains the column's axis, then the row's
        b, g = b[:, None], g[..., None]
    if a.ndim == 1:
        a, g = a[None, :], g[..., None, :]
    ga = _unbroadcast(g @ np.swapaxes(b, -1, -2), a.shape)
    gb = _unbroadcast(np.swapaxes(a, -1, -2) @ g, b.shape)
    return {
        "input": round_to(ga.reshape(input.shape), input.dtype),
        "other": round_to(gb.reshape(other.shape), other.dtype),
    }
