"""Reductions along one dim: softmax, log_softmax.

Precision policy: upcast to float64, subtract the max along ``dim``, exponentiate and sum there,
round once to the input dtype.
NOTE: torch 2.13's CPU softmax for bf16 computes in fp32 and rounds once, as here. Its bf16
log_softmax rounds the sum of exponentials and its log to bf16 before the final subtraction; that
is an imprecision refcore does not mirror (the spec's bf16 oracle tolerance absorbs it).
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to


def _shifted(input: np.ndarray, axis: int) -> np.ndarray:
    """x - max(x) along ``axis`` in float64; a 0-D input is treated as 1-D.

    NOTE: as in torch, a slice that is all -inf (or holds +inf or NaN) gives NaN throughout,
    since -inf - (-inf) and inf - inf are NaN; initial=-inf only matters for size-0 dims.
    """
    x = np.asarray(input, dtype=np.float64).reshape(input.shape or (1,))
    with np.errstate(invalid="ignore"):
        return x - np.max(x, axis=axis, keepdims=True, initial=-np.inf)


def check_softmax(input: np.ndarray, dim: int) -> None:
    _checks.normalize_dim("softmax", "dim", dim, input.ndim)


def softmax(input: np.ndarray, dim: int) -> np.ndarray:
    """exp(x) / sum(exp(x)) along ``dim``, computed as exp(x - max) / sum(exp(x - max))."""
    check_softmax(input, dim)
    axis = _checks.normalize_dim("softmax", "dim", dim, input.ndim)
    z = _shifted(input, axis)
    with np.errstate(invalid="ignore"):
        e = np.exp(z)
        y = e / e.sum(axis=axis, keepdims=True)
    return round_to(y.reshape(input.shape), input.dtype)


def check_log_softmax(input: np.ndarray, dim: int) -> None:
    _checks.normalize_dim("log_softmax", "dim", dim, input.ndim)


def log_softmax(input: np.ndarray, dim: int) -> np.ndarray:
    """x - log(sum(exp(x))) along ``dim``, computed as (x - max) - log(sum(exp(x - max)))."""
    check_log_softmax(input, dim)
    axis = _checks.normalize_dim("log_softmax", "dim", dim, input.ndim)
    z = _shifted(input, axis)
    with np.errstate(invalid="ignore", divide="ignore"):  # log(0) only for size-0 slices
        y = z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    with np.errstate(over="ignore"):  # below the dtype's range (e.g. -6e38) rounds to -inf
        return round_to(y.reshape(input.shape), input.dtype)
