"""Numba kernels for the fused family (specs/fused.yaml): add_relu, add_gelu, add_silu,
add_layer_norm.

Each reads its two operands once and writes the output once: the sum stays in fp32 registers
(add + activation) or in an fp32 row scratch that stays in L1/L2 (add + layer_norm), where torch
writes the sum to memory and reads it back. The fp32 sum is what unfused fp32 computes; for bf16
it skips the intermediate's rounding, which the spec's tolerance allows. The activations and the
row statistics are elementwise's and norm's own (same polynomials, same two-pass variance).

Layouts: add + activation takes same-shape operands that are contiguous or share dense strides
(run over memory, output in that order), or a contiguous operand plus a contiguous trailing row
or scalar (a bias); add_layer_norm takes same-shape operands viewable as rows of the normalized
size with any strides. Anything else is declined with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numba
import numpy as np

from refcore import buffers
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore.tensors import fp32_scalar
from refcore_numba._runtime import as_bits, from_bits, sync_threads
from refcore_numba.elementwise import _gelu_erf, _gelu_tanh, _plan, _relu, _silu
from refcore_numba.norm import FASTMATH, _layer_norm_rest, _ld, _parallel, _param, _st, _view

BOTH = frozenset({"float32", "bfloat16"})
ANY = frozenset({"strided"})
_BLOCK = 1 << 14  # elements per task for same-size operands
_MIN_ROW = 256  # a broadcast row shorter than this is tiled, so inner loops stay long

# ---------------------------------------------------------------------------------------------
# add + activation. One loop per activation (numba caches no closures); each walks `a` in
# chunks of m elements against b: the matching chunk of a same-size b, or all of a tiled row.
# The sum is rounded to the dtype before the activation, as the unfused add stores it: kept in
# fp32, a bf16 sum just below FLT_MAX gave silu 0 where its bf16 rounding (inf) gives NaN, as the
# reference and torch do (refcore.fuzz). relu needs no rounding: max(0, .) commutes with it.


@numba.njit(inline="always")
def _span(a, b, out, c, m):
    k = np.int64(c)  # prange's index may be unsigned: keep int64 math
    lo = k * m
    hi = min(lo + m, a.size)
    boff = lo if b.size == a.size else 0
    # slices, so indices are provably >= 0 (no wraparound gathers in the vector loop)
    return a[lo:hi], b[boff : boff + hi - lo], out[lo:hi]


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _add_relu(a, b, out, m):
    for c in numba.prange((a.size + m - 1) // m):
        x, y, o = _span(a, b, out, c, m)
        for j in range(o.size):
            o[j] = _st(_relu(_ld(x[j]) + _ld(y[j])), o)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _add_gelu(a, b, out, m):
    for c in numba.prange((a.size + m - 1) // m):
        x, y, o = _span(a, b, out, c, m)
        for j in range(o.size):
            o[j] = _st(_gelu_erf(_ld(_st(_ld(x[j]) + _ld(y[j]), o))), o)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _add_gelu_tanh(a, b, out, m):
    for c in numba.prange((a.size + m - 1) // m):
        x, y, o = _span(a, b, out, c, m)
        for j in range(o.size):
            o[j] = _st(_gelu_tanh(_ld(_st(_ld(x[j]) + _ld(y[j]), o))), o)


@numba.njit(parallel=True, cache=True, error_model="numpy")
def _add_silu(a, b, out, m):
    for c in numba.prange((a.size + m - 1) // m):
        x, y, o = _span(a, b, out, c, m)
        for j in range(o.size):
            o[j] = _st(_silu(_ld(_st(_ld(x[j]) + _ld(y[j]), o))), o)


def _binary_rule(call: Call) -> Verdict:
    kind, detail, _ = _plan(call.arguments["input"], call.arguments["other"])
    if kind == "no":
        return no(detail)
    if kind == "strided":
        a, b = call.arguments["input"], call.arguments["other"]
        return no(f"operands with strides {a.strides} and {b.strides} are not dense")
    return YES


def _add_act(input: np.ndarray, other: np.ndarray, kernel) -> np.ndarray:
    sync_threads()
    a, b = as_bits(input), as_bits(other)
    kind, detail, shape = _plan(a, b)
    if kind == "flat" and detail is None:  # same size, both C-contiguous
        out = buffers.empty(shape, a.dtype)
        if out.size:
            kernel(a.reshape(-1), b.reshape(-1), out.reshape(-1), _BLOCK)
        return from_bits(out, input.dtype)
    if kind == "flat":  # same shape and strides, dense in another order: run over the memory
        at, bt = a.transpose(detail), b.transpose(detail)
        out = buffers.empty(at.shape, a.dtype)
        kernel(at.reshape(-1), bt.reshape(-1), out.reshape(-1), _BLOCK)
        return from_bits(out.transpose(np.argsort(detail)), input.dtype)
    out = buffers.empty(shape, a.dtype)
    if out.size == 0:
        return from_bits(out, input.dtype)
    full, row = (a, b) if detail else (b, a)  # addition commutes: either side may be the row
    row = row.reshape(-1)
    if row.size < _MIN_ROW:  # whole copies, so chunks start on row starts
        tiled = np.empty((-(-_MIN_ROW // row.size), row.size), row.dtype)
        tiled[:] = row
        row = tiled.reshape(-1)
    kernel(full.reshape(-1), row, out.reshape(-1), row.size)
    return from_bits(out, input.dtype)


def add_relu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    return _add_act(input, other, _add_relu)


def add_gelu(input: np.ndarray, other: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    return _add_act(input, other, _add_gelu_tanh if approximate == "tanh" else _add_gelu)


def add_silu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    return _add_act(input, other, _add_silu)


# ---------------------------------------------------------------------------------------------
# add_layer_norm: per row, h = a + b into an fp32 scratch (summing as it goes), the centred sum
# of squares over h, then the output from h; a and b are read once.


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _add_layer_norm_row(a, b, w, bias, eps, out, i, h):
    """Row i: h[0] = a + b (fp32, rounded to the output dtype as the reference's add is, and
    the native kernels'), its sum and max |h| as it goes, then norm's layer_norm."""
    s = np.float32(0.0)
    m = np.float32(0.0)
    for j in range(h.shape[1]):
        # a bf16 sum kept in fp32 differed from the reference's by up to half a bf16 ulp, which
        # weights near 3e38 turned into 2% of the output (found by refcore.fuzz)
        v = _ld(_st(_ld(a[i, j]) + _ld(b[i, j]), out))
        h[0, j] = v
        s += v
        m = max(m, abs(v))
    # inlined from norm.py: numba's disk cache (cache=True) keys on this file only, so a change
    # to _layer_norm_rest must come with a change here (last: the corrected two-pass variance)
    _layer_norm_rest(h, 0, w, bias, eps, out, i, s, m)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _add_layer_norm_par(a, b, w, bias, eps, out, chunks):
    m = a.shape[0]
    for c in numba.prange(chunks):
        k = np.int64(c)
        h = np.empty((1, a.shape[1]), np.float32)
        for i in range(k * m // chunks, (k + 1) * m // chunks):
            _add_layer_norm_row(a, b, w, bias, eps, out, i, h)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _add_layer_norm_ser(a, b, w, bias, eps, out):
    h = np.empty((1, a.shape[1]), np.float32)
    for i in range(a.shape[0]):
        _add_layer_norm_row(a, b, w, bias, eps, out, i, h)


def _norm_rows(a: np.ndarray, d: int) -> np.ndarray | None:
    x = as_bits(a)
    return x.reshape(-1, d) if x.flags.c_contiguous else _view(x, (x.size // d, d))


def _add_layer_norm_rule(call: Call) -> Verdict:
    a, b = call.arguments["input"], call.arguments["other"]
    if a.shape != b.shape:
        return no(f"other's shape {b.shape} broadcasts to input's {a.shape}: needs equal shapes")
    d = math.prod(call.arguments["normalized_shape"])
    if a.size and (_norm_rows(a, d) is None or _norm_rows(b, d) is None):
        return no(
            f"operands (strides {a.strides} and {b.strides}) cannot be viewed as rows of "
            "the normalized dims without a copy"
        )
    return YES


def add_layer_norm(
    input: np.ndarray,
    other: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    sync_threads()
    out = buffers.empty(input.shape, input.dtype)
    if out.size == 0:
        return out
    d = math.prod(normalized_shape)
    a, b = _norm_rows(input, d), _norm_rows(other, d)
    m = a.shape[0]
    w = _param(weight, d, input, 1.0)
    bb = _param(bias, d, input, 0.0)
    o = as_bits(out).reshape(m, d)
    if _parallel(m, a.size):
        # numba.get_num_threads() inside a cached parallel function disables its disk cache
        chunks = min(m, 4 * numba.get_num_threads())
        _add_layer_norm_par(a, b, w, bb, fp32_scalar(eps), o, chunks)
    else:
        _add_layer_norm_ser(a, b, w, bb, fp32_scalar(eps), o)
    return out


def _kernel(op: str, fn, rule) -> Kernel:
    return Kernel(op=op, name=op, fn=fn, dtypes=BOTH, layouts=ANY, rule=rule)


KERNELS = (
    _kernel("add_relu", add_relu, _binary_rule),
    _kernel("add_gelu", add_gelu, _binary_rule),
    _kernel("add_silu", add_silu, _binary_rule),
    _kernel("add_layer_norm", add_layer_norm, _add_layer_norm_rule),
)
