"""References for the quant family (specs/quant.yaml): weight-only quantized linear.

The weight's value is exactly ``int8 * scale`` (a float64 product is exact), so the reference is
`refcore.ops.linalg.linear`'s float64 product on that weight.

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
    _checks.shape(op, "scales", scales, (n,), " (one per output channel)")
    _checks.shape(op, "bias", bias, (n,), " (out_features,)")


def woq_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray,
               bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """input @ (weight * scales[:, None]).T + bias: (*, K) x int8 (N, K) -> (*, N)."""
    check_woq_linear(input, weight, scales, bias)
    w = weight.astype(np.float64) * scales.astype(np.float64)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):
        y = input.astype(np.float64) @ w.T
        if bias is not None:
            y = y + bias.astype(np.float64)
    return round_to(y, input.dtype)
