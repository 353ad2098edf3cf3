"""Backward references of the sparse family (refcore.ops.grad): spmm_reduce, gather_scatter,
segment_reduce, index_add."""

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


def gather_scatter(grad_output: np.ndarray, *, x: np.ndarray, src_index: np.ndarray,
                   dst_index: np.ndarray, edge_weight: np.ndarray | None, dim_size: int,
                   reduce: str = "sum") -> dict[str, np.ndarray]:  # fmt: skip
    """The gradients of gather_scatter as torch's autograd gives them through PyG's composition:
    edge e passes back t[e] = c[e] * grad_output[dst[e]] (per feature), c[e] = 1 for sum,
    1 / (edges into dst[e]) for mean, and for amax / amin 1 / (messages equal to the node's
    result in that feature) where e's message is that result, else 0 (torch's scatter_reduce
    shares a tie evenly). Then d x[s] = sum over edges from s of w[e] * t[e] (w = 1 without
    weights) and d edge_weight[e] = t[e] . x[src[e]]. Messages are compared in the inputs'
    precision, at least float32 (a float64 call compares float64 messages)."""
    ne = src_index.shape[0]
    src, dst = src_index.astype(np.int64), dst_index.astype(np.int64)
    g = f64(grad_output)[dst]
    w = np.ones(ne) if edge_weight is None else f64(edge_weight)
    with np.errstate(invalid="ignore", over="ignore"):
        if reduce in ("amax", "amin"):
            wide = np.result_type(x.dtype, np.float32)
            ew = np.ones(ne, wide) if edge_weight is None else edge_weight.astype(wide)
            msg = ew[:, None] * x.astype(wide)[src]
            best = np.full((dim_size, x.shape[1]), -np.inf if reduce == "amax" else np.inf, wide)
            (np.maximum if reduce == "amax" else np.minimum).at(best, dst, msg)
            won = msg == best[dst]
            ties = np.zeros(best.shape)
            np.add.at(ties, dst, won.astype(np.float64))
            t = np.where(won, g / np.maximum(ties[dst], 1.0), 0.0)
        elif reduce == "mean":
            count = np.bincount(dst, minlength=dim_size).astype(np.float64)
            t = g / count[dst][:, None]
        else:
            t = g
        dx = np.zeros(x.shape)
        np.add.at(dx, src, w[:, None] * t)
        grads = {"x": round_to(dx, x.dtype)}
        if edge_weight is not None:
            dw = np.einsum("ef,ef->e", t, f64(x)[src]) if ne else np.zeros(0)
            grads["edge_weight"] = round_to(dw, edge_weight.dtype)
    return grads


def index_add(grad_output: np.ndarray, *, input: np.ndarray, dim: int, index: np.ndarray,
              source: np.ndarray, alpha: float = 1.0) -> dict[str, np.ndarray]:  # fmt: skip
    """d input = grad_output; d source = alpha * grad_output's slices index[i] along dim."""
    g = np.moveaxis(f64(grad_output), dim % input.ndim, 0)
    ds = np.moveaxis(float(alpha) * g[index.astype(np.int64)], 0, dim % input.ndim)
    return {"input": round_to(f64(grad_output), input.dtype), "source": round_to(ds, source.dtype)}


def segment_reduce(grad_output: np.ndarray, *, data: np.ndarray, reduce: str,
                   lengths: np.ndarray | None = None, offsets: np.ndarray | None = None,
                   axis: int = 0, unsafe: bool = False,
                   initial: float | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """d data for a row in segment i: sum g[i]; mean g[i] / rows (initial or not); max / min
    g[i] / (rows equal to the result) where the row is the result, else 0 (torch shares a tie
    evenly; initial is no row of it); prod g[i] * initial * the product of the segment's other
    rows."""
    from refcore.ops.sparse import segment_bounds

    b = segment_bounds("segment_reduce", data, lengths, offsets, unsafe)
    x, g = f64(data), f64(grad_output)
    dx = np.zeros(x.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(b.size - 1):
            lo, hi = int(b[i]), int(b[i + 1])
            if hi == lo:
                continue
            seg = x[lo:hi]
            if reduce == "sum":
                dx[lo:hi] = g[i]
            elif reduce == "mean":
                dx[lo:hi] = g[i] / (hi - lo)
            elif reduce == "prod":
                ones = np.ones((1, *seg.shape[1:]))
                left = np.cumprod(np.concatenate([ones, seg[:-1]]), axis=0)
                right = np.cumprod(np.concatenate([ones, seg[:0:-1]]), axis=0)[::-1]
                scale = 1.0 if initial is None else float(initial)
                dx[lo:hi] = g[i] * left * right * scale
            else:
                top = seg.max(0) if reduce in ("max", "amax") else seg.min(0)
                if initial is not None:
                    top = np.maximum(top, initial) if reduce in ("max", "amax") \
                        else np.minimum(top, initial)  # fmt: skip
                won = seg == top
                dx[lo:hi] = np.where(won, g[i] / np.maximum(won.sum(0), 1), 0.0)
    return {"data": round_to(dx, data.dtype)}
