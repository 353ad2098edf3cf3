"""Backward references of the embedding family (refcore.ops.grad): embedding."""

from __future__ import annotations

import numpy as np

from refcore.tensors import round_to


def embedding(grad_output: np.ndarray, *, input: np.ndarray,
              weight: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """Each looked-up row's gradient added into that row (repeated indices accumulate); rows
    never looked up get 0 (torch's dense embedding_backward)."""
    d = weight.shape[1]
    acc = np.zeros(weight.shape, np.float64)
    idx = np.asarray(input).reshape(-1)
    np.add.at(acc, idx, np.asarray(grad_output, np.float64).reshape(idx.size, d))
    return {"weight": round_to(acc, weight.dtype)}
