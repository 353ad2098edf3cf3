"""Backward references of the elementwise family (refcore.ops.grad): relu, sigmoid, silu, gelu."""

from __future__ import annotations

import math

import numpy as np

from refcore.ops.elementwise import _erf
from refcore.tensors import round_to

f64 = np.float64


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def relu(grad_output: np.ndarray, *, input: np.ndarray) -> dict[str, np.ndarray]:
    """g where x > 0, else 0 (torch's threshold_backward: 0 at x = 0)."""
    g, x = f64(grad_output), f64(input)
    return {"input": round_to(np.where(x > 0, g, 0.0), input.dtype)}


def sigmoid(grad_output: np.ndarray, *, input: np.ndarray) -> dict[str, np.ndarray]:
    """g s (1 - s), s = sigmoid(x)."""
    s = _sigmoid(f64(input))
    return {"input": round_to(f64(grad_output) * s * (1 - s), input.dtype)}


def silu(grad_output: np.ndarray, *, input: np.ndarray) -> dict[str, np.ndarray]:
    """g s (1 + x (1 - s)), s = sigmoid(x)."""
    x = f64(input)
    s = _sigmoid(x)
    return {"input": round_to(f64(grad_output) * s * (1 + x * (1 - s)), input.dtype)}


def gelu(grad_output: np.ndarray, *, input: np.ndarray,
         approximate: str = "none") -> dict[str, np.ndarray]:  # fmt: skip
    """'none': g (Phi(x) + x phi(x)); 'tanh': the derivative of the tanh formula,
    0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2), t = tanh(inner)."""
    x, g = f64(input), f64(grad_output)
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            k, c = math.sqrt(2 / math.pi), 0.044715
            t = np.tanh(k * (x + c * x**3))
            d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x)
        else:
            cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
            d = cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return {"input": round_to(g * d, input.dtype)}


def add(grad_output: np.ndarray, *, input: np.ndarray, other: np.ndarray,
        alpha: float = 1.0) -> dict[str, np.ndarray]:  # fmt: skip
    """g to input and alpha g to other, each summed back over the dims it was broadcast in."""
    g = f64(grad_output)
    return {
        "input": round_to(unbroadcast(g, input.shape), input.dtype),
        "other": round_to(unbroadcast(alpha * g, other.shape), other.dtype),
    }


def mul(grad_output: np.ndarray, *, input: np.ndarray,
        other: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """g other to input and g input to other, summed back over broadcast dims."""
    g, a, b = f64(grad_output), f64(input), f64(other)
    return {
        "input": round_to(unbroadcast(g * b, input.shape), input.dtype),
        "other": round_to(unbroadcast(g * a, other.shape), other.dtype),
    }


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the dims broadcasting added or stretched to reach it from ``shape``."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead > 0 else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return (grad.sum(axis=stretched, keepdims=True) if stretched else grad).reshape(shape)
