"""Kernels composed from a provider's own kernels: one recipe, used by every provider that has
the parts, so the recipe is written once (the providers register the results as their kernels,
and the generated suites test them like any other).

- `segment_reduce_from_spmm`: segment_reduce (PyG's segment over a CSR pointer) as spmm_reduce of
  the pattern (bounds, rows in order, ones): each segment is a CSR row whose nonzeros are its
  data rows, times 1 (exact). Then an empty segment's result, and ``initial`` for max / min.
  `segment_rule` says which calls the recipe takes: not prod (spmm_reduce has none), and for
  sum / mean only initial None or 0 (PyG's mean passes 0: then (0 + sum) / rows is spmm's
  mean, and an empty segment 0 is spmm's); another initial would add a rounding after the sum.
- `gather_scatter_backward_from`: gather_scatter's x-gradient for sum / mean as the provider's
  gather_scatter of grad_output along the reversed edges (`sum_or_mean` says which calls).
- `index_add_from_gather_scatter`: index_add as input + alpha * gather_scatter(source along dim,
  rows in order, index): the summed slices come rounded once, then input is added, a second
  rounding: fine in float32 (an ulp of the sum), not in bf16 (where input and the sum cancel the
  error is the sum's bf16 ulp), so the providers register it for float32 only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from refcore.call import Call
from refcore.provider import YES, Verdict, no

#: segment_reduce's reduce -> spmm_reduce's
_SPMM = {"sum": "sum", "mean": "mean", "max": "amax", "amax": "amax", "min": "amin",
         "amin": "amin"}  # fmt: skip


def segment_rule(call: Call) -> Verdict:
    a = call.arguments
    reduce, initial = a["reduce"], a.get("initial")
    if reduce not in _SPMM:
        return no(f"reduce {reduce!r}: spmm_reduce has no such reduction")
    if reduce in ("sum", "mean") and initial not in (None, 0):
        return no(f"initial {initial!r} for {reduce}: a rounding more than the reference's")
    return YES


def segment_reduce_from_spmm(spmm: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A segment_reduce kernel from ``spmm`` (a provider's spmm_reduce function, positional
    (crow_indices, col_indices, values, dense, reduce)); data is viewed as (rows, features),
    copied first where it is not C-contiguous."""
    from refcore.ops.sparse import segment_bounds

    def segment_reduce(data: np.ndarray, reduce: str, *, lengths: Any = None,
                       offsets: Any = None, axis: int = 0, unsafe: bool = False,
                       initial: float | None = None) -> np.ndarray:  # fmt: skip
        op = "segment_reduce"
        bounds = segment_bounds(op, data, lengths, offsets, unsafe)
        if reduce not in _SPMM or (reduce in ("sum", "mean") and initial not in (None, 0)):
            raise ValueError(f"{op}: argument 'reduce' expected sum, mean, max, min, amax or "
                             f"amin (initial None or 0 for sum / mean); got {reduce!r}, "
                             f"initial {initial!r}")  # fmt: skip
        rest = data.shape[1:]
        width = int(np.prod(rest, dtype=np.int64))
        flat = np.ascontiguousarray(data).reshape(data.shape[0], width)
        crow = bounds - bounds[0]
        col = np.arange(bounds[0], bounds[-1], dtype=np.int64)
        ones = np.ones(col.size, data.dtype)
        out = spmm(crow, col, ones, flat, _SPMM[reduce])
        empty = crow[1:] == crow[:-1]
        extreme = _SPMM[reduce] in ("amax", "amin")
        if extreme and initial is not None:
            pick = np.maximum if _SPMM[reduce] == "amax" else np.minimum
            init = np.asarray(initial, np.float32)
            with np.errstate(invalid="ignore"):
                wide = out.astype(np.float32)
                fixed = np.where(np.isnan(wide), wide, pick(wide, init))
            fixed[empty] = init
            out = fixed.astype(data.dtype)
        elif empty.any() and initial is None and reduce != "sum":
            out[empty] = {"mean": np.nan, "amax": -np.inf, "amin": np.inf}[_SPMM[reduce]]
        return out.reshape((crow.size - 1, *rest))

    return segment_reduce


def index_add_from_gather_scatter(gather_scatter: Callable[..., np.ndarray]
                                  ) -> Callable[..., np.ndarray]:  # fmt: skip
    """An index_add kernel from ``gather_scatter`` (a provider's, positional (x, src_index,
    dst_index, edge_weight, dim_size, reduce)); dim is moved to the front (a copy unless it
    is already there and the arrays are C-contiguous)."""
    from refcore.ops.sparse import check_index_add

    def index_add(input: np.ndarray, dim: int, index: np.ndarray, source: np.ndarray, *,
                  alpha: float = 1.0) -> np.ndarray:  # fmt: skip
        check_index_add(input, dim, index, source, alpha=alpha)
        d = dim % input.ndim
        x = np.ascontiguousarray(np.moveaxis(input, d, 0))
        s = np.ascontiguousarray(np.moveaxis(source, d, 0))
        width = int(np.prod(x.shape[1:], dtype=np.int64))
        src, dst = np.arange(s.shape[0], dtype=np.int64), index.astype(np.int64, copy=False)
        sums = gather_scatter(s.reshape(s.shape[0], width), src, dst, None, x.shape[0], "sum")
        with np.errstate(invalid="ignore", over="ignore"):
            out = x.reshape(x.shape[0], width) + np.float32(alpha) * sums
        return np.moveaxis(out.reshape(x.shape), 0, d)

    return index_add


def gather_scatter_backward_from(forward: Callable[..., np.ndarray],
                                 forward32: Callable[..., np.ndarray] | None = None
                                 ) -> Callable[..., np.ndarray]:  # fmt: skip
    """A gather_scatter_backward kernel for sum / mean (`sum_or_mean`) from ``forward``, a
    provider's gather_scatter (positional (x, src_index, dst_index, edge_weight, dim_size,
    reduce)): grad_output gathered along the reversed edges, weighted by edge_weight; for mean
    grad_output / (edges into the node) in float32 first, then ``forward32`` (a float32
    gather_scatter: ``forward`` itself unless that one takes bf16 only), rounded once."""
    from refcore import tensors
    from refcore.ops.sparse import check_gather_scatter_backward

    wide = forward32 or forward

    def gather_scatter_backward(grad_output: np.ndarray, x: np.ndarray, src_index: np.ndarray,
                                dst_index: np.ndarray, edge_weight: np.ndarray | None,
                                dim_size: int, reduce: str = "sum") -> np.ndarray:  # fmt: skip
        op = "gather_scatter_backward"
        check_gather_scatter_backward(grad_output, x, src_index, dst_index, edge_weight,
                                      dim_size, reduce)  # fmt: skip
        if reduce not in ("sum", "mean"):
            raise ValueError(f"{op}: argument 'reduce' expected 'sum' or 'mean' (amax / amin: "
                             f"the reference's); got {reduce!r}")  # fmt: skip
        if grad_output.dtype != x.dtype:
            raise TypeError(f"{op}: argument 'grad_output' expected x's dtype {x.dtype}; got "
                            f"{grad_output.dtype}")  # fmt: skip
        nodes = x.shape[0]
        if reduce == "sum":
            return forward(grad_output, dst_index, src_index, edge_weight, nodes, "sum")
        count = np.bincount(dst_index, minlength=dim_size)[:dim_size]
        g = grad_output.astype(np.float32) / np.maximum(count, 1).astype(np.float32)[:, None]
        w = None if edge_weight is None else edge_weight.astype(np.float32)
        out = wide(g, dst_index, src_index, w, nodes, "sum")
        return out if x.dtype == np.float32 else tensors.round_to(out, x.dtype)

    return gather_scatter_backward


def sum_or_mean(call: Call) -> Verdict:
    """gather_scatter_backward's recipe: sum and mean (amax / amin's winners are not a walk)."""
    reduce = call.arguments["reduce"]
    return YES if reduce in ("sum", "mean") else no(
        f"reduce {reduce!r}: the winners' gradient is left to the reference")
