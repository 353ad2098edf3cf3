"""Backward references of the reduction family (refcore.ops.grad): softmax, log_softmax."""

from __future__ import annotations

import numpy as np

from refcore.tensors import round_to

f64 = np.float64


def _log_probs(x: np.ndarray, dim: int) -> np.ndarray:
    """log_softmax in float64 (the forward reference's arithmetic, kept unrounded)."""
    x = f64(x)
    m = np.max(x, axis=dim, keepdims=True) if x.size else x
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # empty rows
        z = x - m
        return z - np.log(np.sum(np.exp(z), axis=dim, keepdims=True))


def softmax(grad_output: np.ndarray, *, input: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """y (g - sum(g y)) along ``dim``, y = softmax(x)."""
    y, g = np.exp(_log_probs(input, dim)), f64(grad_output)
    return {"input": round_to(y * (g - np.sum(g * y, axis=dim, keepdims=True)), input.dtype)}


def log_softmax(grad_output: np.ndarray, *, input: np.ndarray, dim: int) -> dict[str, np.ndarray]:
    """g - exp(y) sum(g) along ``dim``, y = log_softmax(x)."""
    y, g = _log_probs(input, dim), f64(grad_output)
    return {"input": round_to(g - np.exp(y) * np.sum(g, axis=dim, keepdims=True), input.dtype)}
