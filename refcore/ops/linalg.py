"""Matrix-multiply references: linear, matmul.

Precision policy: upcast every operand to float64, multiply and accumulate in float64, add the
bias in float64, round once to the input dtype.
NOTE: torch's CPU gemm for bf16 (oneDNN / mkldnn matmul) accumulates in fp32 and rounds the
result (bias included) once, RNE; float64 accumulation rounds the same way except where the fp32
sum and the exact sum straddle a bf16 rounding boundary (at most one bf16 ulp).
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to

_AT_LEAST_1D = range(1, 65)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def check_linear(input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> None:
    _checks.rank("linear", "input", input, _AT_LEAST_1D)
    # NOTE: torch also takes a 1-D weight (a dot product) and a bias broadcastable to the output;
    # refcore's linear is the layer: weight (N, K) and bias (N,) only.
    _checks.rank("linear", "weight", weight, (2,), " (out_features, in_features)")
    k = input.shape[-1]
    if weight.shape[1] != k:
        want = f"shape (N, {k}) (in_features = input.shape[-1])"
        _checks.fail("linear", "weight", want, f"shape {weight.shape}")
    _checks.shape("linear", "bias", bias, (weight.shape[0],), " (out_features,)")


def linear(input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """input @ weight.T + bias over the last dim of input: (*, K) x (N, K) -> (*, N)."""
    check_linear(input, weight, bias)
    with np.errstate(invalid="ignore", over="ignore"):
        y = _f64(input) @ _f64(weight).T
        if bias is not None:
            y = y + _f64(bias)
    return round_to(y, input.dtype)


def check_matmul(input: np.ndarray, other: np.ndarray) -> None:
    _checks.rank("matmul", "input", input, _AT_LEAST_1D)
    _checks.rank("matmul", "other", other, _AT_LEAST_1D)
    k = input.shape[-1]
    k_other = other.shape[-2] if other.ndim >= 2 else other.shape[0]
    if k_other != k:
        where = "shape[-2]" if other.ndim >= 2 else "shape[0]"
        _checks.fail("matmul", "other", f"{where} == {k} (input.shape[-1])", f"shape {other.shape}")
    batch, batch_other = input.shape[:-2], other.shape[:-2]
    try:
        np.broadcast_shapes(batch, batch_other)
    except ValueError:
        want = f"batch dims shape[:-2] broadcastable with input's {batch}"
        _checks.fail("matmul", "other", want, f"shape {other.shape}")


def matmul(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    """torch.matmul: 1-D operands are promoted to a row / column and dropped after; batch dims
    (all but the last two) broadcast. np.matmul has exactly these semantics."""
    check_matmul(input, other)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.matmul(_f64(input), _f64(other))
    return round_to(y, input.dtype)
