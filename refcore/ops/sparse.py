"""GNN message-passing references: scatter_reduce, gather, spmm_reduce, gather_scatter,
segment_reduce, index_add.

Precision policy: scatter_reduce and spmm_reduce upcast to float64, form every term (spmm_reduce:
values[j] * dense[col[j]]), reduce in float64 and round once to the input dtype. gather copies
elements and does no arithmetic, so it is exact. gather_scatter is spmm_reduce on the edge list
sorted (stably) by target node, so it shares that policy.
NOTE: torch's CPU scatter_reduce and sparse CSR reduce kernels accumulate bf16 in an fp32 buffer
and round once (RNE); float64 accumulation rounds the same way except where the fp32 sum and the
exact sum straddle a bf16 rounding boundary (at most one bf16 ulp).

Reductions (``reduce``): ``sum``, ``mean``, ``amax``, ``amin``. ``prod`` is not supported (a
product of many messages overflows or underflows, and no GNN layer uses it). amax/amin propagate
NaN, as torch's kernels do.
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks
from refcore.tensors import dtype_name, round_to

# ufunc and its identity for each reduction; mean accumulates a sum and divides by the count.
_REDUCE = {
    "sum": (np.add, 0.0),
    "mean": (np.add, 0.0),
    "amax": (np.maximum, -np.inf),
    "amin": (np.minimum, np.inf),
}


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _at_least_1d(a: np.ndarray) -> np.ndarray:
    # NOTE: torch treats a 0-D tensor as 1-D of size 1 in gather/scatter (dim 0 or -1).
    return a.reshape(a.shape or (1,))


def _check_index_shape(
    op: str, dim: int, input: np.ndarray, index: np.ndarray, src: np.ndarray | None = None
) -> int:
    """Same rank for all; index no larger than src anywhere and than input apart from ``dim``.

    Returns ``dim`` normalised. An empty index reads nothing: as torch, only ``dim`` is checked
    (against input's rank), not the shapes or ranks of index and src.
    """
    if index.size == 0:
        return _checks.normalize_dim(op, "dim", dim, input.ndim)
    like = f" (the rank of input, {input.ndim}-D)"
    _checks.rank(op, "index", index, (input.ndim,), like)
    if src is not None:
        _checks.rank(op, "src", src, (input.ndim,), like)
    d = _checks.normalize_dim(op, "dim", dim, input.ndim)
    i, x = _at_least_1d(index).shape, _at_least_1d(input).shape
    s = _at_least_1d(src).shape if src is not None else i
    bound = [sk if k == d else min(xk, sk) for k, (xk, sk) in enumerate(zip(x, s))]
    if any(n > b for n, b in zip(i, bound)):
        want = f"a shape no larger than input {input.shape} apart from dim {d}"
        if src is not None:
            want = f"a shape no larger than src {src.shape} and, apart from dim {d}, than input "
            want += str(input.shape)
        _checks.fail(op, "index", want, f"shape {index.shape}")
    _checks.index_range(op, "index", index, x[d])
    return d


def check_scatter_reduce(
    input: np.ndarray,
    dim: int,
    index: np.ndarray,
    src: np.ndarray,
    reduce: str,
    *,
    include_self: bool = True,
) -> None:
    _check_index_shape("scatter_reduce", dim, input, index, src)


def scatter_reduce(
    input: np.ndarray,
    dim: int,
    index: np.ndarray,
    src: np.ndarray,
    reduce: str,
    *,
    include_self: bool = True,
) -> np.ndarray:
    """out = input; out[..., index[p], ...] reduce= src[p] over every position p of index.

    Positions no index points at keep input. NOTE: as torch, ``include_self=False`` reduces over
    the scattered values only (input is ignored where something is scattered), and ``mean``
    divides by the number of scattered values, plus one for input when ``include_self``.
    """
    check_scatter_reduce(input, dim, index, src, reduce, include_self=include_self)
    if index.size == 0:  # nothing scattered (index and src may have any shape then)
        return input.copy()
    d = dim % max(input.ndim, 1)
    x, idx = _f64(_at_least_1d(input)), _at_least_1d(index)
    vals = _f64(_at_least_1d(src))[tuple(slice(0, n) for n in idx.shape)]
    where = list(np.indices(idx.shape, sparse=True))
    where[d] = idx
    where = tuple(np.broadcast_arrays(*where))
    count = np.zeros(x.shape)
    np.add.at(count, where, 1.0)
    ufunc, identity = _REDUCE[reduce]
    acc = np.full(x.shape, identity)
    with np.errstate(invalid="ignore", over="ignore"):
        ufunc.at(acc, where, vals)
        if include_self:
            acc, count = ufunc(acc, x), count + 1.0
        hit = count > (1.0 if include_self else 0.0)
        if reduce == "mean":
            # NOTE: torch rounds a bf16 mean twice (the sum, then the quotient, with the count
            # itself held in bf16); refcore divides in float64 and rounds once (~1 ulp apart).
            acc = acc / np.maximum(count, 1.0)
    y = np.where(hit, acc, x)
    return round_to(y.reshape(input.shape), input.dtype)


def check_gather(input: np.ndarray, dim: int, index: np.ndarray) -> None:
    _check_index_shape("gather", dim, input, index)


def gather(input: np.ndarray, dim: int, index: np.ndarray) -> np.ndarray:
    """out[p] = input[p with its dim coordinate replaced by index[p]]; out has index's shape."""
    check_gather(input, dim, index)
    if index.size == 0:  # nothing read (index may have another rank then)
        return np.empty(index.shape, input.dtype)
    d = dim % max(input.ndim, 1)
    x, idx = _at_least_1d(input), _at_least_1d(index)
    window = tuple(slice(None) if k == d else slice(0, n) for k, n in enumerate(idx.shape))
    return np.take_along_axis(x[window], idx, axis=d).reshape(index.shape)


def check_spmm_reduce(
    crow_indices: np.ndarray,
    col_indices: np.ndarray,
    values: np.ndarray,
    dense: np.ndarray,
    reduce: str = "sum",
) -> None:
    _check_csr_times_dense("spmm_reduce", crow_indices, col_indices, values, dense)


def _check_csr_times_dense(op: str, crow_indices: np.ndarray, col_indices: np.ndarray,
                           values: np.ndarray, dense: np.ndarray) -> None:  # fmt: skip
    _checks.rank(op, "crow_indices", crow_indices, (1,), " (rows + 1 row pointers)")
    _checks.rank(op, "col_indices", col_indices, (1,), " (nnz column indices)")
    _checks.rank(op, "values", values, (1,), " (nnz values)")
    _checks.rank(op, "dense", dense, (2,), " (K, F)")
    if col_indices.dtype != crow_indices.dtype:
        want = f"dtype {dtype_name(crow_indices)} (the dtype of 'crow_indices')"
        _checks.fail(op, "col_indices", want, f"dtype {dtype_name(col_indices)}", TypeError)
    if crow_indices.size == 0:
        _checks.fail(op, "crow_indices", "rows + 1 >= 1 row pointers", "length 0")
    nnz = col_indices.shape[0]
    _checks.shape(op, "values", values, (nnz,), " (one value per entry of col_indices)")
    crow = crow_indices.astype(np.int64)
    drops = np.flatnonzero(crow[1:] < crow[:-1])  # compared: np.diff of int64 wraps around
    if drops.size:
        i = int(drops[0])
        got = f"crow_indices[{i + 1}] = {crow[i + 1]} < crow_indices[{i}] = {crow[i]}"
        _checks.fail(op, "crow_indices", "non-decreasing row pointers", got)
    if crow[0] != 0:
        got = f"crow_indices[0] = {crow[0]}"
        _checks.fail(op, "crow_indices", "row pointers starting at 0", got)
    if crow[-1] != nnz:
        want = f"row pointers ending at nnz = {nnz} (the length of col_indices)"
        _checks.fail(op, "crow_indices", want, f"crow_indices[-1] = {crow[-1]}")
    _checks.index_range(op, "col_indices", col_indices, dense.shape[0])


def spmm_reduce(
    crow_indices: np.ndarray,
    col_indices: np.ndarray,
    values: np.ndarray,
    dense: np.ndarray,
    reduce: str = "sum",
) -> np.ndarray:
    """out[i] = reduce over the nonzeros j of CSR row i of values[j] * dense[col_indices[j]].

    The CSR matrix is (rows, K) with rows = len(crow_indices) - 1 and K = dense.shape[0]; out is
    (rows, F). Columns within a row may repeat or come in any order; each entry is its own term.
    NOTE: as torch.sparse.mm(csr, dense, reduce), a row with no nonzeros gives 0 for every reduce.
    """
    check_spmm_reduce(crow_indices, col_indices, values, dense, reduce)
    counts = np.diff(crow_indices.astype(np.int64))
    rows = np.repeat(np.arange(counts.size), counts)
    ufunc, identity = _REDUCE[reduce]
    acc = np.full((counts.size, dense.shape[1]), identity)
    with np.errstate(invalid="ignore", over="ignore"):
        ufunc.at(acc, rows, _f64(values)[:, None] * _f64(dense)[col_indices])
        if reduce == "mean":
            acc = acc / np.maximum(counts, 1)[:, None]
    y = np.where(counts[:, None] > 0, acc, 0.0)
    return round_to(y, dense.dtype)


def check_spmm_reduce_backward(
    grad_output: np.ndarray,
    crow_indices: np.ndarray,
    col_indices: np.ndarray,
    values: np.ndarray,
    dense: np.ndarray,
    reduce: str = "sum",
) -> None:
    _check_csr_times_dense("spmm_reduce_backward", crow_indices, col_indices, values, dense)
    want = (crow_indices.shape[0] - 1, dense.shape[1])
    _checks.shape("spmm_reduce_backward", "grad_output", grad_output, want,
                  " (rows, F): spmm_reduce's output")  # fmt: skip


def spmm_reduce_backward(
    grad_output: np.ndarray,
    crow_indices: np.ndarray,
    col_indices: np.ndarray,
    values: np.ndarray,
    dense: np.ndarray,
    reduce: str = "sum",
) -> np.ndarray:
    """The gradient of spmm_reduce's output with respect to ``dense``: the declared backward
    (refcore.ops.grad.sparse.spmm_reduce), as an op of its own so kernels can compute it."""
    from refcore.ops.grad import sparse as grad

    check_spmm_reduce_backward(grad_output, crow_indices, col_indices, values, dense, reduce)
    return grad.spmm_reduce(grad_output, crow_indices=crow_indices, col_indices=col_indices,
                            values=values, dense=dense, reduce=reduce)["dense"]  # fmt: skip


def check_gather_scatter(
    x: np.ndarray,
    src_index: np.ndarray,
    dst_index: np.ndarray,
    edge_weight: np.ndarray | None,
    dim_size: int,
    reduce: str = "sum",
) -> None:
    _check_edges("gather_scatter", x, src_index, dst_index, edge_weight, dim_size)


def _check_edges(op: str, x: np.ndarray, src_index: np.ndarray, dst_index: np.ndarray,
                 edge_weight: np.ndarray | None, dim_size: int) -> None:  # fmt: skip
    _checks.rank(op, "x", x, (2,), " (N, F)")
    _checks.rank(op, "src_index", src_index, (1,), " (one source node per edge)")
    _checks.shape(op, "dst_index", dst_index, src_index.shape, " (one target node per edge)")
    _checks.shape(op, "edge_weight", edge_weight, src_index.shape, " (one weight per edge)")
    _checks.positive(op, "dim_size", dim_size, strict=False)
    _checks.index_range(op, "src_index", src_index, x.shape[0])
    _checks.index_range(op, "dst_index", dst_index, dim_size)


def gather_scatter(
    x: np.ndarray,
    src_index: np.ndarray,
    dst_index: np.ndarray,
    edge_weight: np.ndarray | None,
    dim_size: int,
    reduce: str = "sum",
) -> np.ndarray:
    """out[i] = reduce over the edges e into node i (dst_index[e] == i) of edge_weight[e] *
    x[src_index[e]]; out is (dim_size, F) and a node without edges is 0.

    It is spmm_reduce of the (dim_size, N) matrix whose row i holds node i's edges in their
    order (a stable sort by target), the weights as its values (1 without weights: exact).
    """
    check_gather_scatter(x, src_index, dst_index, edge_weight, dim_size, reduce)
    if x.shape[1] == 0:  # no features: nothing to reduce, whatever dim_size (no O(dim_size) work)
        return np.zeros((dim_size, 0), x.dtype)
    order = np.argsort(dst_index, kind="stable")
    crow = np.zeros(dim_size + 1, np.int64)
    np.cumsum(np.bincount(dst_index, minlength=dim_size), out=crow[1:])
    w = np.ones(src_index.shape, x.dtype) if edge_weight is None else edge_weight
    return spmm_reduce(crow, src_index[order], w[order], x, reduce)


def check_gather_scatter_backward(
    grad_output: np.ndarray,
    x: np.ndarray,
    src_index: np.ndarray,
    dst_index: np.ndarray,
    edge_weight: np.ndarray | None,
    dim_size: int,
    reduce: str = "sum",
) -> None:
    _check_edges("gather_scatter_backward", x, src_index, dst_index, edge_weight, dim_size)
    _checks.shape("gather_scatter_backward", "grad_output", grad_output,
                  (dim_size, x.shape[1]), " (dim_size, F): gather_scatter's output")  # fmt: skip


def gather_scatter_backward(
    grad_output: np.ndarray,
    x: np.ndarray,
    src_index: np.ndarray,
    dst_index: np.ndarray,
    edge_weight: np.ndarray | None,
    dim_size: int,
    reduce: str = "sum",
) -> np.ndarray:
    """The gradient of gather_scatter's output with respect to ``x``: the declared backward
    (refcore.ops.grad.sparse.gather_scatter), as an op of its own so kernels can compute it."""
    from refcore.ops.grad import sparse as grad

    check_gather_scatter_backward(grad_output, x, src_index, dst_index, edge_weight, dim_size,
                                  reduce)  # fmt: skip
    return grad.gather_scatter(grad_output, x=x, src_index=src_index, dst_index=dst_index,
                               edge_weight=edge_weight,
                               dim_size=dim_size, reduce=reduce)["x"]  # fmt: skip


#: segment_reduce's reductions (max / min are amax / amin, as torch) -> an empty segment's result
_SEGMENT_EMPTY = {"sum": 0.0, "mean": np.nan, "max": -np.inf, "amax": -np.inf, "min": np.inf,
                  "amin": np.inf, "prod": 1.0}  # fmt: skip


def check_segment_reduce(
    data: np.ndarray,
    reduce: str,
    *,
    lengths: np.ndarray | None = None,
    offsets: np.ndarray | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> None:
    op = "segment_reduce"
    _checks.rank(op, "data", data, range(1, 65), " (segments along axis 0)")
    if lengths is None and offsets is None:
        _checks.fail(op, "lengths", "lengths or offsets (a tensor)", "neither")
    segment_bounds(op, data, lengths, offsets, unsafe)
    if axis not in (0, -data.ndim):
        _checks.fail(op, "axis", "0 (the axis of 1-D lengths / offsets)", axis)


def segment_bounds(op: str, data: np.ndarray, lengths: np.ndarray | None,
                    offsets: np.ndarray | None, unsafe: bool) -> np.ndarray:  # fmt: skip
    """The segments' row bounds (segments + 1,): from lengths when given (as torch), else
    offsets; checked to stay within data's rows."""
    n = data.shape[0]
    if lengths is not None:
        _checks.rank(op, "lengths", lengths, (1,), " (one length per segment)")
        ln = lengths.astype(np.int64)
        if ln.size and int(ln.min()) < 0:
            _checks.fail(op, "lengths", "non-negative lengths", f"min {int(ln.min())}")
        total = int(ln.sum())
        if total > n or (total != n and not unsafe):
            want = f"lengths summing to data.shape[0] = {n}" + ("" if not unsafe else " or less")
            _checks.fail(op, "lengths", want, f"sum {total}")
        return np.concatenate([[0], np.cumsum(ln)]).astype(np.int64)
    _checks.rank(op, "offsets", offsets, (1,), " (segments + 1 bounds)")
    if offsets.size == 0:
        _checks.fail(op, "offsets", "segments + 1 >= 1 bounds", "length 0")
    off = offsets.astype(np.int64)
    drops = np.flatnonzero(off[1:] < off[:-1])
    if drops.size:
        i = int(drops[0])
        _checks.fail(op, "offsets", "non-decreasing bounds",
                     f"offsets[{i + 1}] = {off[i + 1]} < offsets[{i}] = {off[i]}")  # fmt: skip
    if off[0] < 0 or off[-1] > n:
        _checks.fail(op, "offsets", f"bounds in [0, {n}] (data's rows)",
                     f"range [{off[0]}, {off[-1]}]", IndexError)  # fmt: skip
    return off


def segment_reduce(
    data: np.ndarray,
    reduce: str,
    *,
    lengths: np.ndarray | None = None,
    offsets: np.ndarray | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> np.ndarray:
    """out[i] = reduce over the rows data[b[i]:b[i+1]] (elementwise over the other dims), b =
    [0, cumsum(lengths)] when lengths is given, else offsets: PyG's segment over a CSR pointer.

    sum, mean (sum / rows), max / amax, min / amin (NaN propagates), prod; ``initial`` is one
    more term of every segment (mean: (initial + sum) / rows) and an empty segment's result;
    without it an empty segment gives sum 0, mean NaN, max -inf, min +inf, prod 1, as torch.
    """
    check_segment_reduce(data, reduce, lengths=lengths, offsets=offsets, axis=axis,
                         unsafe=unsafe, initial=initial)  # fmt: skip
    b = segment_bounds("segment_reduce", data, lengths, offsets, unsafe)
    x, rest = _f64(data), data.shape[1:]
    out = np.empty((b.size - 1, *rest))
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(b.size - 1):
            seg = x[b[i] : b[i + 1]]
            if initial is not None:  # one more term (and an empty segment's result)
                seg = np.concatenate([np.full((1, *rest), float(initial)), seg])
            if seg.shape[0] == 0:
                out[i] = _SEGMENT_EMPTY[reduce]
            elif reduce in ("max", "amax", "min", "amin"):  # NaN propagates (np.max / np.min)
                out[i] = seg.max(0) if reduce in ("max", "amax") else seg.min(0)
            elif reduce == "prod":
                out[i] = seg.prod(0)
            else:  # sum, mean: (initial +) the rows' sum, over the rows' count for a mean
                out[i] = seg.sum(0) / (max(int(b[i + 1] - b[i]), 1) if reduce == "mean" else 1)
    return round_to(out, data.dtype)


def check_index_add(
    input: np.ndarray,
    dim: int,
    index: np.ndarray,
    source: np.ndarray,
    *,
    alpha: float = 1.0,
) -> None:
    op = "index_add"
    _checks.rank(op, "input", input, range(1, 65))
    d = _checks.normalize_dim(op, "dim", dim, input.ndim)
    _checks.rank(op, "index", index, (1,), " (one input position per slice of source)")
    want = (*input.shape[:d], index.shape[0], *input.shape[d + 1 :])
    _checks.shape(op, "source", source, want, " (input's, with index's length along dim)")
    _checks.index_range(op, "index", index, input.shape[d])


def index_add(
    input: np.ndarray,
    dim: int,
    index: np.ndarray,
    source: np.ndarray,
    *,
    alpha: float = 1.0,
) -> np.ndarray:
    """out = input, then out[..., index[i], ...] += alpha * source[..., i, ...] along dim for
    every i (repeated indices add up), formed in float64 and rounded once."""
    check_index_add(input, dim, index, source, alpha=alpha)
    d = dim % input.ndim
    out = np.moveaxis(_f64(input).copy(), d, 0)
    with np.errstate(invalid="ignore", over="ignore"):
        np.add.at(out, index.astype(np.int64), np.moveaxis(_f64(source), d, 0) * float(alpha))
    return round_to(np.moveaxis(out, 0, d), input.dtype)
