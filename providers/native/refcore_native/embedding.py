"""Native kernels for the embedding family (specs/embedding.yaml): embedding, embedding_bag; and
spmm_reduce (specs/sparse.yaml), which is the same pooling.

C: ``csrc/embedding_<level>.c``. embedding copies rows (one portable memcpy kernel for both
dtypes); embedding_bag pools each bag's rows in fp32 in index order (as torch does) and rounds
once to the table's dtype. Bags are split over the threads; rows of a table too large for the
cache are prefetched a few positions ahead.

The C side trusts its indices, so every index and offset is checked here first, vectorised
(one pass over the indices: read as unsigned, a negative index is larger than any row count).
The offsets become one int64 array of bag bounds (CSR row pointers, ``bags + 1`` values), the
form the C kernel takes for 1-D input with or without ``include_last_offset`` and for 2-D
input alike.

spmm_reduce (a CSR matrix times a dense one, each row reduced) is a weighted pooling of the
dense matrix's rows: bag i is CSR row i (bounds = crow_indices), its positions the column indices,
each dense row scaled by its value before it is pooled, in every reduce (the C kernel's weights
with sum, mean, max and min), so GNN aggregations (PyG's ``torch.sparse.mm(adj_t, x, reduce)``)
run on the kernel DLRM's bags do.

spmm_reduce_backward (csrc/rc_spmm_t.h, one C body per level): the gradient of dense, a scatter
of w_j * grad_output[row(j)] into column col(j)'s row. Columns are split into one block per
thread of about equal (nonzeros + columns); each block walks every row in order and adds to its
own columns, so grad_output streams and each column sums in storage order. amax / amin first
find each (row, feature)'s winning nonzero (torch's rule), then add only the winners' terms.

gather_scatter (csrc/rc_gather_scatter.h, one C body per level): PyG's edge-list message
passing, out[i] = reduce over the edges e into node i of w[e] * x[src[e]], without the E x F
message. No sort and no atomics: the target nodes are split into one block per thread of about
equal (edges + nodes), balanced on a sample of dst_index as spmm_reduce_backward's columns are;
each block walks every edge in order, lists (branch-free) those into its own nodes and reduces
them into fp32 rows (out itself for fp32), counting each node's edges for mean and for amax /
amin's empty nodes; then it finalises its nodes (no edges: 0, mean: / count, bf16: rounded
once). A node's terms arrive in edge order whatever the thread count. Large x / acc rows are
prefetched a few listed edges ahead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.compose import (
    gather_scatter_backward_from,
    index_add_from_gather_scatter,
    segment_reduce_from_spmm,
    segment_rule,
    sum_or_mean,
)
from refcore.provider import Kernel, exact_sums
from refcore_native import _runtime as rt

INDEX_DTYPES = {np.dtype(np.int32): np.uint32, np.dtype(np.int64): np.uint64}
MODES = {"sum": 0, "mean": 1, "max": 2}
#: tables smaller than this likely stay in cache, where prefetch instructions cost more than they
#: hide (the numba provider measured -40% at 2 MB and +50% at 51 MB with 1 index per bag)
PREFETCH_MIN_BYTES = 8 << 20


def _indices(op: str, input: np.ndarray, rows: int) -> np.ndarray:
    """``input`` as a contiguous int32/int64 array whose every value is in [0, rows)."""
    if not isinstance(input, np.ndarray):
        rt.fail(op, "input", "a NumPy array", type(input).__name__, TypeError)
    if input.dtype not in INDEX_DTYPES:
        rt.fail(op, "input", "dtype int32 or int64", f"dtype {input.dtype}", TypeError)
    idx = rt.array(op, "input", input, input.dtype)
    # One reduction: viewed as unsigned, a negative index is larger than any valid one.
    if idx.size and int(idx.view(INDEX_DTYPES[idx.dtype]).max()) >= rows:
        got = f"range [{int(idx.min())}, {int(idx.max())}]"
        rt.fail(op, "input", f"indices in [0, {rows})", got, IndexError)
    return idx


def _table(op: str, weight: np.ndarray, names: dict[np.dtype, str]) -> np.ndarray:
    dt = rt.float_dtype(op, "weight", weight, names)
    w = rt.array(op, "weight", weight, dt)
    if w.ndim != 2:
        rt.fail(op, "weight", "a 2-D tensor (num_embeddings, embedding_dim)", f"shape {w.shape}")
    return w


def _row_bytes(w: np.ndarray) -> int:
    """Bytes per table row. Not ``w.strides[0]``: NumPy calls a (1, D) or (V, 1) array
    C-contiguous whatever the stride of its length-1 dim."""
    return w.shape[1] * w.itemsize


def _ahead(w: np.ndarray) -> int:
    """Rows to prefetch ahead: 0 for a table that likely stays in cache, else ~8 KB of rows."""
    if w.nbytes < PREFETCH_MIN_BYTES:
        return 0
    return min(16, max(4, 8192 // max(1, _row_bytes(w))))


# ---------------------------------------------------------------------------------------------
# embedding


def _embedding(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    # one C row copy serves every dtype: `names` only says which dtypes the kernel takes
    names = rt.symbols("embedding", level, dtypes)
    rows = f"rc_embedding_rows_{level}"

    def embedding(input: np.ndarray, weight: np.ndarray) -> np.ndarray:
        op = "embedding"
        w = _table(op, weight, names)
        idx = _indices(op, input, w.shape[0])
        out = buffers.empty((*idx.shape, w.shape[1]), w.dtype)
        if out.size:
            c = rt.c_function(rows)
            nt = rt.threads(2 * out.nbytes)
            i64 = int(idx.dtype == np.int64)
            c.fn(c.ptr(w), _row_bytes(w), c.ptr(idx), i64, idx.size, c.ptr(out), _ahead(w), nt)
        return out

    return embedding


# ---------------------------------------------------------------------------------------------
# embedding_bag


def _bounds(
    op: str, idx: np.ndarray, offsets: np.ndarray | None, include_last_offset: bool
) -> np.ndarray:
    """Bag bounds as int64 CSR row pointers: starts at 0, non-decreasing, ends at idx.size."""
    if idx.ndim == 2:
        if offsets is not None:
            rt.fail(op, "offsets", "None when input is 2-D (fixed-length bags)", offsets.shape)
        return np.arange(idx.shape[0] + 1, dtype=np.int64) * idx.shape[1]
    if idx.ndim != 1:
        rt.fail(op, "input", "a 1-D or 2-D tensor", f"shape {idx.shape}")
    if offsets is None:
        rt.fail(op, "offsets", "a 1-D tensor when input is 1-D", "None")
    if not isinstance(offsets, np.ndarray) or offsets.dtype not in INDEX_DTYPES:
        got = getattr(offsets, "dtype", type(offsets).__name__)
        rt.fail(op, "offsets", "an int32 or int64 NumPy array", got, TypeError)
    if offsets.ndim != 1:
        rt.fail(op, "offsets", "a 1-D tensor", f"shape {offsets.shape}")
    n, m = idx.size, offsets.size
    if include_last_offset and m == 0:
        rt.fail(op, "offsets", "at least 1 value with include_last_offset=True", "shape (0,)")
    if n and m == 0:
        rt.fail(op, "offsets", "at least 1 bag when input is non-empty", "shape (0,)")
    # The bounds are written once: the offsets (widened to int64), then len(input) unless the
    # offsets already end with it. The checks read that array (bags + 1 values, cheap next to
    # the rows pooled), so what C receives is what was checked.
    bounds = np.empty(m if include_last_offset else m + 1, np.int64)
    bounds[:m] = offsets
    off = bounds[:m]
    if m > 1 and (off[1:] < off[:-1]).any():
        i = int(np.flatnonzero(off[1:] < off[:-1])[0])
        rt.fail(op, "offsets", "non-decreasing values", f"{off[i]} then {off[i + 1]} at {i}")
    if m and off[-1] > n:
        rt.fail(op, "offsets", f"values <= len(input) = {n}", int(off[-1]))
    if include_last_offset and off[-1] != n:
        want = f"offsets[-1] == len(input) = {n} with include_last_offset=True"
        rt.fail(op, "offsets", want, int(off[-1]))
    if m and off[0] != 0:  # checked last, in the reference's order
        rt.fail(op, "offsets", "a first offset of 0", int(off[0]))
    bounds[-1] = n  # a no-op with include_last_offset (checked equal above)
    return bounds


def _embedding_bag(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("embedding_bag", level, dtypes)

    def embedding_bag(
        input: np.ndarray,
        weight: np.ndarray,
        offsets: np.ndarray | None = None,
        *,
        mode: str = "mean",
        per_sample_weights: np.ndarray | None = None,
        include_last_offset: bool = False,
    ) -> np.ndarray:
        op = "embedding_bag"
        w = _table(op, weight, names)
        if mode not in MODES:
            rt.fail(op, "mode", "one of 'sum', 'mean', 'max'", repr(mode))
        idx = _indices(op, input, w.shape[0])
        bounds = _bounds(op, idx, offsets, include_last_offset)
        psw = per_sample_weights
        if psw is not None:
            if mode != "sum":
                rt.fail(op, "per_sample_weights", "None unless mode='sum'", f"mode={mode!r}")
            psw = rt.array(op, "per_sample_weights", psw, w.dtype, idx.shape)
        bags = bounds.size - 1
        out = buffers.empty((bags, w.shape[1]), w.dtype)
        if out.size:
            c = rt.c_function(names[w.dtype])
            nt = rt.threads((idx.size + bags) * _row_bytes(w))
            c.fn(c.ptr(w), w.shape[1], c.ptr(idx), int(idx.dtype == np.int64), c.ptr(bounds),
                 bags, c.opt(psw), MODES[mode], c.ptr(out), _ahead(w), nt)  # fmt: skip
        return out

    return embedding_bag


# ---------------------------------------------------------------------------------------------
# spmm_reduce


SPMM_MODES = {"sum": 0, "mean": 1, "amax": 2, "amin": 3}


def _spmm_reduce(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    from refcore.ops.sparse import check_spmm_reduce

    names = rt.symbols("embedding_bag", level, dtypes)

    def spmm_reduce(
        crow_indices: np.ndarray,
        col_indices: np.ndarray,
        values: np.ndarray,
        dense: np.ndarray,
        reduce: str = "sum",
    ) -> np.ndarray:
        op = "spmm_reduce"
        # the spec's checks (shapes, row pointers, column range): the C side trusts its indices
        check_spmm_reduce(crow_indices, col_indices, values, dense, reduce)
        dt = rt.float_dtype(op, "dense", dense, names)
        d = rt.array(op, "dense", dense, dt)
        col = rt.array(op, "col_indices", col_indices, col_indices.dtype)
        vals = rt.array(op, "values", values, dt, col.shape)
        bounds = np.ascontiguousarray(crow_indices, np.int64)  # rows + 1 values: cheap
        rows = bounds.size - 1
        out = buffers.empty((rows, d.shape[1]), dt)
        if out.size:
            c = rt.c_function(names[dt])
            nt = rt.threads((col.size + rows) * _row_bytes(d))
            c.fn(c.ptr(d), d.shape[1], c.ptr(col), int(col.dtype == np.int64), c.ptr(bounds),
                 rows, c.ptr(vals), SPMM_MODES[reduce], c.ptr(out), _ahead(d), nt)  # fmt: skip
        return out

    return spmm_reduce


#: nonzeros sampled to balance the column blocks (a full histogram cost 2 ms of a 9 ms call)
BALANCE_SAMPLES = 1 << 16


def _column_blocks(col: np.ndarray, ncols: int, nblocks: int) -> np.ndarray:
    """nblocks + 1 bounds over the K columns with about equal (nonzeros + columns) per block,
    the nonzeros per column estimated from every step-th one (the result does not depend on
    the blocks, only the balance does)."""
    step = max(1, col.size // BALANCE_SAMPLES)
    cost = np.zeros(ncols + 1, np.int64)
    np.cumsum(np.bincount(col[::step], minlength=ncols) * step, out=cost[1:])
    cost += np.arange(ncols + 1)
    targets = cost[-1] * np.arange(nblocks + 1) // nblocks
    bounds = np.searchsorted(cost, targets).astype(np.int64)
    bounds[0], bounds[-1] = 0, ncols
    return bounds


def _spmm_reduce_backward(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    from refcore.ops.sparse import check_spmm_reduce_backward

    names = rt.symbols("spmm_reduce_backward", level, dtypes)

    def spmm_reduce_backward(
        grad_output: np.ndarray,
        crow_indices: np.ndarray,
        col_indices: np.ndarray,
        values: np.ndarray,
        dense: np.ndarray,
        reduce: str = "sum",
    ) -> np.ndarray:
        op = "spmm_reduce_backward"
        check_spmm_reduce_backward(grad_output, crow_indices, col_indices, values, dense, reduce)
        if reduce not in SPMM_MODES:
            rt.fail(op, "reduce", f"one of {sorted(SPMM_MODES)}", repr(reduce))
        dt = rt.float_dtype(op, "grad_output", grad_output, names)
        g = rt.array(op, "grad_output", grad_output, dt)
        col = rt.array(op, "col_indices", col_indices, col_indices.dtype)
        vals = rt.array(op, "values", values, dt, col.shape)
        extreme = reduce in ("amax", "amin")
        d = rt.array(op, "dense", dense, dt) if extreme else dense  # read for the winners only
        crow = np.ascontiguousarray(crow_indices, np.int64)  # rows + 1 values: cheap
        rows, (ncols, nf) = crow.size - 1, dense.shape
        out = buffers.empty((ncols, nf), dt)
        if out.size:
            acc = out if dt == np.float32 else np.empty((ncols, nf), np.float32)
            arg = np.empty((rows, nf), np.int64) if extreme else None
            nt = rt.threads((col.size + rows) * nf * g.itemsize + acc.nbytes)
            # one column block per thread: every block walks the whole pattern and grad_output
            bounds = _column_blocks(col, ncols, min(ncols, nt if nt > 0 else os.cpu_count() or 1))
            c = rt.c_function(names[dt])
            c.fn(c.ptr(g), nf, c.ptr(crow), rows, c.ptr(col), int(col.dtype == np.int64),
                 c.ptr(vals), c.opt(d if extreme else None), SPMM_MODES[reduce], c.ptr(bounds),
                 bounds.size - 1, c.opt(arg), c.ptr(acc), c.ptr(out), nt)  # fmt: skip
        return out

    return spmm_reduce_backward


def _gather_scatter(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    from refcore.ops.sparse import check_gather_scatter

    names = rt.symbols("gather_scatter", level, dtypes)
    i64 = np.dtype(np.int64)

    def gather_scatter(
        x: np.ndarray,
        src_index: np.ndarray,
        dst_index: np.ndarray,
        edge_weight: np.ndarray | None,
        dim_size: int,
        reduce: str = "sum",
    ) -> np.ndarray:
        op = "gather_scatter"
        # the spec's checks (ranks, shapes, both index ranges): the C side trusts its indices
        check_gather_scatter(x, src_index, dst_index, edge_weight, dim_size, reduce)
        if reduce not in SPMM_MODES:
            rt.fail(op, "reduce", f"one of {sorted(SPMM_MODES)}", repr(reduce))
        dt = rt.float_dtype(op, "x", x, names)
        xs = rt.array(op, "x", x, dt)
        src = rt.array(op, "src_index", src_index, i64)
        dst = rt.array(op, "dst_index", dst_index, i64, src.shape)
        w = None if edge_weight is None else rt.array(op, "edge_weight", edge_weight, dt, src.shape)
        nodes, nf = int(dim_size), xs.shape[1]
        out = buffers.empty((nodes, nf), dt)
        if out.size:
            acc = out if dt == np.float32 else np.empty((nodes, nf), np.float32)
            count = np.empty(nodes, np.int64) if reduce != "sum" else None
            nt = rt.threads(src.size * (16 + _row_bytes(xs)) + 2 * acc.nbytes)
            # one node block per thread: every block walks all the edges, takes its own
            bounds = _column_blocks(dst, nodes, min(nodes, nt if nt > 0 else os.cpu_count() or 1))
            # the rows are random reads and updates: prefetched unless x and acc stay in cache,
            # ~8 KB of acc rows ahead (100k nodes, 1.6M edges: 32 rows at F = 64, 16 at 128)
            big = xs.nbytes + acc.nbytes >= PREFETCH_MIN_BYTES
            ahead = min(32, max(4, 8192 // (4 * nf))) if big else 0
            c = rt.c_function(names[dt])
            c.fn(c.ptr(xs), nf, c.ptr(src), c.ptr(dst), src.size, c.opt(w), SPMM_MODES[reduce],
                 c.ptr(bounds), bounds.size - 1, c.opt(count), c.ptr(acc), c.ptr(out), ahead,
                 nt)  # fmt: skip
        return out

    return gather_scatter


def _gather_scatter_backward(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    """gather_scatter's x-gradient (refcore.compose's recipe) from this level's gather_scatter;
    its mean walks float32, of this level or the highest below with float32."""
    forward = _gather_scatter(level, dtypes)
    if "float32" in dtypes:
        return gather_scatter_backward_from(forward)
    order = list(cpu.LEVELS)
    wide = max((lvl for lvl, dts in rt.variants("embedding")
                if "float32" in dts and order.index(lvl) <= order.index(level)), key=order.index)
    return gather_scatter_backward_from(forward, _gather_scatter(wide, frozenset({"float32"})))


def kernels() -> tuple[Kernel, ...]:
    """embedding (portable: a row copy needs no vector code), embedding_bag, spmm_reduce (and its
    backward) and gather_scatter per ISA level."""
    out = [
        Kernel(op="embedding", name="embedding_portable", fn=_embedding("portable", rt.BOTH),
               dtypes=rt.BOTH, layouts=rt.CONTIGUOUS, isa="portable",
               priority=rt.priority("portable")),
    ]  # fmt: skip
    out += [
        Kernel(op="embedding_bag", name=f"embedding_bag_{lvl}",
               fn=exact_sums("embedding_bag", _embedding_bag(lvl, dts)),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    out += [
        Kernel(op="spmm_reduce", name=f"spmm_reduce_{lvl}",
               fn=exact_sums("spmm_reduce", _spmm_reduce(lvl, dts), mode_arg="reduce",
                             extremes=("amax", "amin")),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    out += [
        Kernel(op="spmm_reduce_backward", name=f"spmm_reduce_backward_{lvl}",
               fn=exact_sums("spmm_reduce_backward", _spmm_reduce_backward(lvl, dts),
                             mode_arg="reduce", extremes=()),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    out += [
        Kernel(op="gather_scatter", name=f"gather_scatter_{lvl}",
               fn=exact_sums("gather_scatter", _gather_scatter(lvl, dts), mode_arg="reduce",
                             extremes=("amax", "amin")),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    out += [
        Kernel(op="segment_reduce", name=f"segment_reduce_{lvl}",
               fn=exact_sums("segment_reduce", segment_reduce_from_spmm(_spmm_reduce(lvl, dts)),
                             mode_arg="reduce", extremes=("max", "min", "amax", "amin")),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
               rule=segment_rule)
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    f32 = frozenset({"float32"})  # index_add's recipe rounds twice (refcore.compose)
    out += [
        Kernel(op="index_add", name=f"index_add_{lvl}",
               fn=exact_sums("index_add", index_add_from_gather_scatter(_gather_scatter(lvl, dts))),
               dtypes=f32, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl) and "float32" in dts
    ]  # fmt: skip
    out += [
        Kernel(op="gather_scatter_backward", name=f"gather_scatter_backward_{lvl}",
               fn=exact_sums("gather_scatter_backward", _gather_scatter_backward(lvl, dts),
                             mode_arg="reduce", extremes=()),
               dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
               rule=sum_or_mean)
        for lvl, dts in rt.variants("embedding") if cpu.has(lvl)
    ]  # fmt: skip
    return tuple(out)
