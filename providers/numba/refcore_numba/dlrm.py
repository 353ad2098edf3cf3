"""Numba kernels for the DLRM family (specs/dlrm.yaml): merged_embedding_bag and interaction.

merged_embedding_bag runs every table in one parallel region (torch's oracle makes one
embedding_bag call per table, then a stack): tasks are (table, range of bags) pairs, each pooled
by embedding_bag's own bag loop (refcore_numba.embedding) straight into its rows of the
(bags, tables, dim) output, so there is no stack copy and no atomics.

interaction computes only the strictly-lower triangle of each Z Z^T (torch's bmm computes all of
it, then gathers half). Per batch row, Z = [dense; sparse] is widened once into a zero-padded
fp32 scratch (any input strides; bf16 exactly); then rows i, i + 1 are dotted with rows j < i four
at a time in explicit 512-bit vectors (`_dots`), so 6 loads feed 8 FMAs. Dots accumulate in fp32
(reassociated into vector lanes, as a GEMM does) and round once to the output dtype; the dense
part is copied bit for bit. (A bf16 variant with AVX512-BF16 ``vdpbf16ps``, half the FMAs, was
no faster: the FMAs are not what bounds this kernel.)
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from refcore import buffers, tensors
from refcore.provider import Kernel, exact_sums
from refcore_numba._runtime import as_bits, from_bits, sync_threads
from refcore_numba.embedding import (
    _SERIAL_ELEMENTS,
    BOTH,
    MAX,
    SUM,
    _bags,
    _f32,
    _narrow,
    _prefetch_distance,
)

FASTMATH = {"reassoc", "contract"}

# --------------------------------------------------------------------------------------------
# merged_embedding_bag: task k pools bags [lo, hi) of table k // per_table.


@numba.njit(inline="always", cache=True)
def _task_range(task, per_table, nbags):
    k = np.int64(task)  # prange's index may be unsigned: keep int64 math
    t, c = k // per_table, k % per_table
    return t, c * nbags // per_table, (c + 1) * nbags // per_table


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _merged_sum(idx, offsets, w, divide, out, ahead, per_table):
    for task in numba.prange(w.shape[0] * per_table):
        t, lo, hi = _task_range(task, per_table, out.shape[0])
        it = idx[t]
        _bags(it, offsets[t], -1, w[t], it, SUM, divide, out, t, lo, hi, ahead)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _merged_max(idx, offsets, w, out, ahead, per_table):
    for task in numba.prange(w.shape[0] * per_table):
        t, lo, hi = _task_range(task, per_table, out.shape[0])
        it = idx[t]
        _bags(it, offsets[t], -1, w[t], it, MAX, False, out, t, lo, hi, ahead)


@numba.njit(cache=True, error_model="numpy")
def _merged_sum_serial(idx, offsets, w, divide, out, ahead):
    for t in range(w.shape[0]):
        it = idx[t]
        _bags(it, offsets[t], -1, w[t], it, SUM, divide, out, t, 0, out.shape[0], ahead)


@numba.njit(cache=True, error_model="numpy")
def _merged_max_serial(idx, offsets, w, out, ahead):
    for t in range(w.shape[0]):
        it = idx[t]
        _bags(it, offsets[t], -1, w[t], it, MAX, False, out, t, 0, out.shape[0], ahead)


def merged_embedding_bag(
    input: np.ndarray,
    weight: np.ndarray,
    offsets: np.ndarray,
    *,
    mode: str = "sum",
    include_last_offset: bool = False,
) -> np.ndarray:
    sync_threads()
    w = as_bits(weight)
    tables, _, dim = w.shape
    nbags = offsets.shape[1] - bool(include_last_offset)
    out = buffers.empty((nbags, tables, dim), w.dtype)
    if out.size == 0:
        return from_bits(out, weight.dtype)
    ahead = _prefetch_distance(w[0])
    if input.size * dim < _SERIAL_ELEMENTS:
        if mode == "max":
            _merged_max_serial(input, offsets, w, out, ahead)
        else:
            _merged_sum_serial(input, offsets, w, mode == "mean", out, ahead)
        return from_bits(out, weight.dtype)
    threads = numba.get_num_threads()
    # Enough tasks per table that every thread gets work when there are few tables; many
    # tables are one task each (static scheduling gives each thread a run of whole tables).
    per_table = -(-2 * threads // tables)
    if mode == "max":
        _merged_max(input, offsets, w, out, ahead, per_table)
    else:
        _merged_sum(input, offsets, w, mode == "mean", out, ahead, per_table)
    return from_bits(out, weight.dtype)


# --------------------------------------------------------------------------------------------
# interaction


@numba.njit(inline="always", cache=True)
def _widen_z(dense, sparse, b, z):
    """z[0] = dense[b], z[1:] = sparse[b], as fp32."""
    d = dense.shape[1]
    z0 = z[0]
    for k in range(d):
        z0[k] = _f32(dense[b, k])
    for i in range(sparse.shape[1]):
        zi = z[i + 1]
        for k in range(d):
            zi[k] = _f32(sparse[b, i, k])


_LANES = 16  # fp32 lanes of the explicit vectors below (one zmm)


def _shuffle(builder, u, v, lanes):
    return builder.shuffle_vector(
        u, v, ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes)
    )


def _reduce_lanes(builder, vs):
    """One vector holding the lane sums of each of ``vs`` (2^k vectors of 16 lanes), in order.

    Transpose-and-add: each step pairs vectors and adds the halves of every segment, so the
    number of vectors halves while each holds twice as many (half as long) partial sums; then the
    last vector's segments are halved in place: 8 sums take 8 shuffle-and-add steps, not 32.
    """
    seg = _LANES
    while len(vs) > 1:
        half, groups = seg // 2, _LANES // seg
        lo = [g * seg + q for g in range(groups) for q in range(half)]
        hi = [x + half for x in lo]
        lo, hi = lo + [x + _LANES for x in lo], hi + [x + _LANES for x in hi]
        pairs = zip(vs[0::2], vs[1::2])
        vs = [
            builder.fadd(_shuffle(builder, u, v, lo), _shuffle(builder, u, v, hi)) for u, v in pairs
        ]
        seg = half
    v = vs[0]
    while seg > 1:
        half, groups = seg // 2, v.type.count // seg
        lo = [g * seg + q for g in range(groups) for q in range(half)]
        v = builder.fadd(
            _shuffle(builder, v, v, lo), _shuffle(builder, v, v, [x + half for x in lo])
        )
        seg = half
    return v


@intrinsic
def _dots(typingctx, z, i, r, j, m):
    """The r x m block of z z^T at (i, j): (z[i] . z[j], ..., z[i] . z[j + m - 1], z[i + 1] . z[j],
    ...), row-major, for a C-contiguous fp32 z whose rows are whole 16-lane vectors
    (zero-padded); r and m are compile-time constants.

    Written as explicit <16 x float> IR: numba's vectorizer stops at 256 bits on this CPU
    (LLVM's prefer-256-bit tuning), while explicit 512-bit vectors are still legal and halve
    the instructions. Per 16 columns, r + m loads feed r * m FMAs; each sum is reduced by
    halving at the end.
    """
    literal = (isinstance(r, types.IntegerLiteral), isinstance(m, types.IntegerLiteral))
    if not all(literal) or z.dtype != types.float32 or z.ndim != 2:
        return None
    nr, nm = r.literal_value, m.literal_value
    rettype = types.UniTuple(types.float32, nr * nm)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ncols = cgutils.unpack_tuple(builder, ary.shape, 2)[1]
        vec = ir.VectorType(ir.FloatType(), _LANES)
        fnty = ir.FunctionType(vec, [vec, vec, vec])
        fma = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.v16f32")
        zero = ir.Constant(vec, [0.0] * _LANES)

        def rows(first, count):
            at = [builder.add(first, ir.Constant(first.type, q)) for q in range(count)]
            return [builder.gep(ary.data, [builder.mul(q, ncols)]) for q in at]

        xs, ys = rows(args[1], nr), rows(args[3], nm)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(nr * nm)]
        chunks = builder.udiv(ncols, ir.Constant(ncols.type, _LANES))
        with cgutils.for_range(builder, chunks) as loop:
            k = builder.mul(loop.index, ir.Constant(ncols.type, _LANES))

            def load(p):
                return builder.load(builder.bitcast(builder.gep(p, [k]), vec.as_pointer()), align=4)

            xv, yv = [load(p) for p in xs], [load(p) for p in ys]
            for a in range(nr):
                for c in range(nm):
                    acc = accs[a * nm + c]
                    builder.store(builder.call(fma, [xv[a], yv[c], builder.load(acc)]), acc)
        vs = _reduce_lanes(builder, [builder.load(acc) for acc in accs])
        sums = [builder.extract_element(vs, ir.Constant(ir.IntType(32), q)) for q in range(nr * nm)]
        return context.make_tuple(builder, sig.return_type, sums)

    return rettype(z, types.intp, r, types.intp, m), codegen


@numba.njit(inline="always", error_model="numpy")
def _put4(orow, p, s0, s1, s2, s3):
    orow[p] = _narrow(s0, orow)
    orow[p + 1] = _narrow(s1, orow)
    orow[p + 2] = _narrow(s2, orow)
    orow[p + 3] = _narrow(s3, orow)


@numba.njit(inline="always", error_model="numpy")
def _row_tail(z, orow, p, i, j):
    """orow[p:] = z[i] . z[j], ..., z[i] . z[i - 1] (the rest of row i of the triangle)."""
    while j + 4 <= i:
        s0, s1, s2, s3 = _dots(z, i, 1, j, 4)
        _put4(orow, p, s0, s1, s2, s3)
        p += 4
        j += 4
    while j < i:
        (s,) = _dots(z, i, 1, j, 1)
        orow[p] = _narrow(s, orow)
        p += 1
        j += 1


@numba.njit(inline="always", error_model="numpy")
def _tri_dots(z, orow, base):
    """orow[base:] = the strictly-lower triangle of z z^T, row-major (row i starts at
    base + i (i - 1) / 2). Rows go in pairs (i, i + 1) sharing columns j < i, 4 at a time."""
    n = z.shape[0]
    i = 1
    while i + 1 < n:
        p, q = base + i * (i - 1) // 2, base + (i + 1) * i // 2
        j = 0
        while j + 4 <= i:
            a0, a1, a2, a3, b0, b1, b2, b3 = _dots(z, i, 2, j, 4)
            _put4(orow, p + j, a0, a1, a2, a3)
            _put4(orow, q + j, b0, b1, b2, b3)
            j += 4
        _row_tail(z, orow, p + j, i, j)
        _row_tail(z, orow, q + j, i + 1, j)
        i += 2
    if i < n:
        _row_tail(z, orow, base + i * (i - 1) // 2, i, 0)


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _interact_rows(dense, sparse, out, lo, hi):
    d = dense.shape[1]
    # rows padded with zeros to whole vectors: the padding adds 0 to every dot
    z = np.zeros((sparse.shape[1] + 1, -(-d // _LANES) * _LANES), np.float32)
    for b in range(lo, hi):
        orow = out[b]
        for k in range(d):
            orow[k] = dense[b, k]
        _widen_z(dense, sparse, b, z)
        _tri_dots(z, orow, d)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _interaction_par(dense, sparse, out, chunks):
    nb = out.shape[0]
    for c in numba.prange(chunks):
        k = np.int64(c)
        _interact_rows(dense, sparse, out, k * nb // chunks, (k + 1) * nb // chunks)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _interaction_ser(dense, sparse, out):
    _interact_rows(dense, sparse, out, 0, out.shape[0])


def interaction(dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
    sync_threads()
    x, s = as_bits(dense), as_bits(sparse)
    nb, f, d = s.shape
    out = buffers.empty((nb, d + (f + 1) * f // 2), x.dtype)
    if nb == 0:
        return from_bits(out, dense.dtype)
    if nb > 1 and (f + 1) * (f + 1) * d * nb >= _SERIAL_ELEMENTS:
        # a few chunks per thread: rows cost the same, so this only evens out the last chunk
        chunks = min(nb, 4 * numba.get_num_threads())
        _interaction_par(x, s, out, chunks)
    else:
        _interaction_ser(x, s, out)
    res = from_bits(out, dense.dtype)
    if not tensors.all_finite(res):
        # fp32 dot products whose products overflow to +inf and -inf give NaN where the exact
        # sum is one infinity (or finite), depending on the order (found by refcore.fuzz): a
        # non-finite output, which finite sums never give, takes the reference's float64 sums
        from refcore.registry import default_registry, resolve

        res[...] = resolve(default_registry().op("interaction").reference)(dense, sparse)
    return res


KERNELS = (
    Kernel(
        op="merged_embedding_bag",
        name="merged_embedding_bag",
        fn=exact_sums("merged_embedding_bag", merged_embedding_bag),
        dtypes=BOTH,
        layouts=frozenset({"contiguous"}),  # the specs draw no other layout: none is claimed
    ),
    Kernel(op="interaction", name="interaction", fn=interaction, dtypes=BOTH),
)
