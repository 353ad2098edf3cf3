"""Pointwise references: relu, gelu, silu, sigmoid, add, mul.

Precision policy: upcast to float64, compute, round once to the input dtype.
NOTE: torch's CPU kernels for bf16 upcast to fp32 and round once (RNE); computing in float64
rounds the same way except at exact ties of the fp32 result, within one bf16 ulp.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def check_relu(input: np.ndarray) -> None:
    pass  # any shape; dtype checked from the spec


def relu(input: np.ndarray) -> np.ndarray:
    """max(input, 0); NaN stays NaN (torch.relu propagates NaN)."""
    x = _f64(input)
    return round_to(np.where(np.isnan(x), x, np.maximum(x, 0.0)), input.dtype)


def check_gelu(input: np.ndarray, *, approximate: str = "none") -> None:
    pass  # approximate's choices are declared in the spec


def gelu(input: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """x * Phi(x); ``approximate="tanh"`` uses 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))."""
    x = _f64(input)
    with np.errstate(over="ignore", invalid="ignore"):
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
            y = 0.5 * x * (1.0 + np.tanh(inner))
        else:
            y = 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    return round_to(y, input.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| never overflows; both branches agree with 1 / (1 + exp(-x)).
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def check_sigmoid(input: np.ndarray) -> None:
    pass


def sigmoid(input: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x))."""
    return round_to(_sigmoid(_f64(input)), input.dtype)


def check_silu(input: np.ndarray) -> None:
    pass


def silu(input: np.ndarray) -> np.ndarray:
    """x * sigmoid(x)."""
    x = _f64(input)
    with np.errstate(invalid="ignore"):
        return round_to(x * _sigmoid(x), input.dtype)


def check_add(input: np.ndarray, other: np.ndarray, *, alpha: float = 1.0) -> None:
    _checks.broadcast("add", input.shape, other.shape)
    # torch converts alpha to the tensors' dtype and raises when a finite one overflows it
    # (inf is taken: 0 * inf is NaN); a kernel scaling in fp32 would turn 0 * alpha into NaN
    top = float(ml_dtypes.finfo(input.dtype).max) if input.dtype.kind in "fV" else math.inf
    if math.isfinite(alpha) and abs(alpha) > top:
        _checks.fail("add", "alpha", f"a value {input.dtype} holds (|alpha| <= {top:.4g})", alpha)


def add(input: np.ndarray, other: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    """input + alpha * other, with broadcasting."""
    check_add(input, other, alpha=alpha)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _f64(input) + alpha * _f64(other) if alpha != 1 else _f64(input) + _f64(other)
    return round_to(y, input.dtype)


def check_mul(input: np.ndarray, other: np.ndarray) -> None:
    _checks.broadcast("mul", input.shape, other.shape)


def mul(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    """input * other, with broadcasting."""
    check_mul(input, other)
    with np.errstate(invalid="ignore", over="ignore"):
        return round_to(_f64(input) * _f64(other), input.dtype)
