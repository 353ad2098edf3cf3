"""Backward references of the embedding family (refcore.ops.grad): embedding."""

from __future__ import annotations

import numpy as np

from refcore.tensors import round_to

f64 = np.float64


def embedding(grad_output: np.ndarray, *, input: np.ndarray,
              weight: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """Each looked-up row's gradient added into that row (repeated indices accumulate); rows
    never looked up get 0 (torch's dense embedding_backward)."""
    d = weight.shape[1]
    acc = np.zeros(weight.shape, np.float64)
    idx = np.asarray(input).reshape(-1)
    np.add.at(acc, idx, np.asarray(grad_output, np.float64).reshape(idx.size, d))
    return {"weight": round_to(acc, weight.dtype)}


def embedding_bag(grad_output: np.ndarray, *, input: np.ndarray, weight: np.ndarray,
                  offsets: np.ndarray | None = None, mode: str = "mean",
                  per_sample_weights: np.ndarray | None = None,
                  include_last_offset: bool = False) -> dict[str, np.ndarray]:  # fmt: skip
    """Each bag's gradient back to its rows: sum adds it to every row (times the sample's
    weight, whose own gradient is the row . bag gradient), mean adds it / the bag's size, max
    to the row that gave each column's maximum (the first such row); empty bags give nothing."""
    from refcore.ops.embedding import _bags

    g = f64(grad_output)
    idx = np.asarray(input, np.int64).reshape(-1)
    rows = f64(weight)[idx]
    acc = np.zeros(weight.shape)
    dpsw = np.zeros(idx.size)
    psw = None if per_sample_weights is None else f64(per_sample_weights).reshape(-1)
    starts, ends = _bags(input, offsets, include_last_offset)
    for b, (s, e) in enumerate(zip(starts, ends)):
        if e <= s:
            continue
        if mode == "max":
            pick = s + np.argmax(rows[s:e], axis=0)  # per column
            np.add.at(acc, (idx[pick], np.arange(weight.shape[1])), g[b])
            continue
        share = g[b] / (e - s) if mode == "mean" else g[b]
        scale = psw[s:e, None] if psw is not None else 1.0
        np.add.at(acc, idx[s:e], share * scale)
        if psw is not None:
            dpsw[s:e] = rows[s:e] @ g[b]
    out = {"weight": round_to(acc, weight.dtype)}
    if per_sample_weights is not None:
        out["per_sample_weights"] = round_to(dpsw.reshape(per_sample_weights.shape),
                                             per_sample_weights.dtype)  # fmt: skip
    return out
