"""Backward references of the sparse family (refcore.ops.grad): spmm_reduce."""

from __future__ import annotations

import numpy as np

from refcore.tensors import round_to

f64 = np.float64


def _winners(prods: np.ndarray, counts: np.ndarray, reduce: str) -> np.ndarray:
    """For each (nonzero, feature): 1 where that nonzero gives its row's amax / amin, by torch's
    rule: a running extreme starting at -inf (amax) / +inf (amin) taken over by a product
    strictly beyond it or by a NaN. So the first of equal extremes wins, the last NaN wins over
    everything, and a row whose products are all -inf (amax) / +inf (amin) has no winner."""
    hit = np.zeros(prods.shape, bool)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    cols = np.arange(prods.shape[1])
    for s, n in zip(starts, counts):
        if n == 0:
            continue
        p = prods[s : s + n]
        nan = np.isnan(p)
        bound = -np.inf if reduce == "amax" else np.inf
        filled = np.where(nan, bound, p)
        best = filled.max(0) if reduce == "amax" else filled.min(0)
        first = np.argmax(filled == best, 0)
        last_nan = n - 1 - np.argmax(nan[::-1], 0)
        won = np.where(nan.any(0), last_nan, first)
        some = nan.any(0) | (best != bound)
        hit[s + won[some], cols[some]] = True
    return hit


def spmm_reduce(grad_output: np.ndarray, *, crow_indices: np.ndarray, col_indices: np.ndarray,
                values: np.ndarray, dense: np.ndarray,
                reduce: str = "sum") -> dict[str, np.ndarray]:  # fmt: skip
    """d dense[k] = sum over the nonzeros j in column k of w_j * g[row(j)]: w_j = values[j]
    for sum, values[j] / (nonzeros of row(j)) for mean; for amax / amin, values[j] where
    nonzero j won its row's result in that feature by torch's rule (`_winners`, on the products in
    the inputs' precision: float32 for float32 and bf16), else 0.
    Rows with no nonzeros pass nothing back."""
    counts = np.diff(crow_indices.astype(np.int64))
    rows = np.repeat(np.arange(counts.size), counts)
    v, g = f64(values)[:, None], f64(grad_output)[rows]
    with np.errstate(invalid="ignore", over="ignore"):
        if reduce in ("amax", "amin"):
            # products in the inputs' precision, at least float32, as torch compares them (bf16
            # products are exact in float32; a float64 call compares float64 products)
            wide = np.result_type(values.dtype, dense.dtype, np.float32)
            prods = values.astype(wide)[:, None] * dense.astype(wide)[col_indices]
            won = _winners(prods, counts, reduce)
            terms = np.where(won, v * g, 0.0)
        else:
            terms = v * g / (counts[rows][:, None] if reduce == "mean" else 1.0)
        acc = np.zeros(dense.shape)
        np.add.at(acc, col_indices.astype(np.int64), terms)
    return {"dense": round_to(acc, dense.dtype)}
