"""Numba kernels for the reduction family (specs/reduction.yaml): softmax, log_softmax.

exp: this llvmlite has no SVML, so ``math.exp`` would be a scalar libm call per element. `_exp_neg`
is a vectorizable fp32 exp for the arguments softmax needs (x - max <= 0): Cody-Waite reduction
x = n ln2 + r with n rounded by the 1.5 * 2**23 trick (no float-to-int conversion, so a NaN cannot
become an LLVM poison value), a degree-5 polynomial for e**r on |r| <= ln2/2, and 2**n built from
the exponent bits: within 1.8e-7 relative of e**x (~1.5 ulp; the spec allows 1e-5). Below -87.33
(where 2**n would leave the normal range) it returns 0, so -inf scores get probability 0 exactly.

Slices: the max is NaN-ignoring (llvm.maxnum vectorizes); a NaN, a +inf, or an all -inf slice
then yields a NaN in x - max, hence a NaN sum and a NaN slice, as in the reference.

Strategies: when the reduced dim has the smallest stride the input is viewed as (rows, D), one row
per iteration in fp32 scratch (max, exp + sum, scale); otherwise as (outer, D, inner), vectorized
across a tile of ``inner``. An input that cannot be viewed either way without a copy is declined.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from refcore import buffers
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_numba._runtime import _f32_as_u32, _u32_as_f32, as_bits, sync_threads
from refcore_numba.norm import FASTMATH, _ld, _st, _view

BOTH = frozenset({"float32", "bfloat16"})
_TILE = 64  # inner-dim lanes per task in the (outer, D, inner) kernel
#: Below this many elements a parallel region's launch costs more than it saves (measured: the
#: exp makes softmax ~2.5x the work per element of layer_norm, so the break-even is lower).
PARALLEL_MIN = 1 << 14


def _call_llvm_f32(builder, name: str, args):
    f = ir.FloatType()
    fnty = ir.FunctionType(f, [f] * len(args))
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma: a vfmadd, never a libm call)."""

    def codegen(context, builder, signature, args):
        return _call_llvm_f32(builder, "llvm.fma.f32", args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _maxnum(typingctx, a, b):
    """NaN-ignoring max; LLVM vectorizes it as a reduction (fcmp/select patterns stay scalar)."""

    def codegen(context, builder, signature, args):
        return _call_llvm_f32(builder, "llvm.maxnum.f32", args)

    return types.float32(types.float32, types.float32), codegen


_F = np.float32
_LOG2E = _F(1.4426950408889634)
_SHIFTER = _F(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer held in the low bits
_LN2_HI = _F(0.693145751953125)  # ln 2 split so n * _LN2_HI is exact for |n| < 2**9
_LN2_LO = _F(1.428606765330187e-06)
# e**r ~ 1 + r + c2 r**2 + ... + c5 r**5 on |r| <= ln2/2, fitted for minimal relative error (5e-8
# for the polynomial itself); the fp32 exp is within 1.8e-7 relative of e**z over [-87.3, 0].
_C2, _C3, _C4, _C5 = (_F(c) for c in (0.499992311000824, 0.16667111217975616, 0.041890233755111694,
                                        0.0083128297701478))  # fmt: skip
_EXP_MIN = _F(-87.33)  # e**x underflows the normal range below this
_BIAS_BITS = np.uint32(0x4B400000 - 127)  # bits of _SHIFTER, less the exponent bias


@numba.njit(inline="always", cache=True)
def _exp_neg(z):
    """e**z in fp32 for z <= 0 (or NaN), vectorizable; 0 below -87.33 (so e**-inf = 0)."""
    t = _fma(z, _LOG2E, _SHIFTER)  # low mantissa bits hold n = round(z / ln 2)
    n = t - _SHIFTER
    r = _fma(n, -_LN2_HI, z)
    r = _fma(n, -_LN2_LO, r)
    p = _fma(_fma(_fma(_fma(_fma(_C5, r, _C4), r, _C3), r, _C2), r, _F(1.0)), r, _F(1.0))
    two_n = _u32_as_f32((_f32_as_u32(t) - _BIAS_BITS) << np.uint32(23))
    e = p * two_n
    return _F(0.0) if z < _EXP_MIN else e


# ---------------------------------------------------------------------------------------------
# rows: x (M, D), the reduced dim innermost


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _softmax_row(x, out, buf, i, log):
    d = x.shape[1]
    m = _F(-np.inf)
    for j in range(d):
        m = _maxnum(m, _ld(x[i, j]))
    s = _F(0.0)
    for j in range(d):
        z = _ld(x[i, j]) - m
        e = _exp_neg(z)
        buf[j] = z if log else e  # kept in cache for the last pass
        s += e
    shift = _F(math.log(s)) if log else _F(1.0) / s
    for j in range(d):  # one store site: inlining _st in two branches upsets numba's SSA check
        v = buf[j]
        out[i, j] = _st(v - shift if log else v * shift, out)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _softmax_rows_par(x, out, log, chunks):
    m, d = x.shape
    for c in numba.prange(chunks):
        buf = np.empty(d, np.float32)
        for i in range(c * m // chunks, (c + 1) * m // chunks):
            _softmax_row(x, out, buf, i, log)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _softmax_rows_ser(x, out, log):
    buf = np.empty(x.shape[1], np.float32)
    for i in range(x.shape[0]):
        _softmax_row(x, out, buf, i, log)


# ---------------------------------------------------------------------------------------------
# columns: x (O, D, I), the reduced dim in the middle; vectorized across a tile of I


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _softmax_cols(x, out, log):
    o_n, d_n, i_n = x.shape
    tiles = (i_n + _TILE - 1) // _TILE
    for task in numba.prange(o_n * tiles):
        o, t = divmod(np.int64(task), tiles)  # prange's index may be unsigned: keep int64 math
        i0 = t * _TILE
        w = min(_TILE, i_n - i0)
        m = np.full(w, -np.inf, np.float32)
        s = np.zeros(w, np.float32)
        for d in range(d_n):
            for k in range(w):
                m[k] = _maxnum(m[k], _ld(x[o, d, i0 + k]))
        for d in range(d_n):
            for k in range(w):
                s[k] += _exp_neg(_ld(x[o, d, i0 + k]) - m[k])
        for k in range(w):
            s[k] = _F(math.log(s[k])) if log else _F(1.0) / s[k]
        for d in range(d_n):
            for k in range(w):
                z = _ld(x[o, d, i0 + k]) - m[k]
                y = z - s[k] if log else _exp_neg(z) * s[k]
                out[o, d, i0 + k] = _st(y, out)


# ---------------------------------------------------------------------------------------------
# planning and entry points


def _plan(input: np.ndarray, dim: int) -> tuple[str, np.ndarray] | str:
    """("rows", (M, D) view of the input with ``dim`` moved last) or ("cols", (O, D, I) view);
    a reason string when neither view exists without a copy."""
    x = as_bits(input)
    if x.ndim == 0:
        return "rows", x.reshape(1, 1)  # 0-D: one slice of one element
    axis = dim % x.ndim  # dim was validated by the reference's check
    d = x.shape[axis]
    if axis == x.ndim - 1 and x.flags.c_contiguous:  # the common case, without the search below
        return "rows", x.reshape(-1, d)
    outer = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis + 1 :])
    others = [abs(s) for k, (n, s) in enumerate(zip(x.shape, x.strides)) if k != axis and n > 1]
    rows = _view(np.moveaxis(x, axis, -1), (outer * inner, d))
    cols = _view(x, (outer, d, inner))
    if rows is not None and (cols is None or not others or abs(x.strides[axis]) <= min(others)):
        return "rows", rows  # the reduced dim is innermost in memory (or no other choice)
    if cols is not None:
        return "cols", cols
    return (
        f"input (shape {input.shape}, strides {input.strides}) cannot be viewed as slices "
        f"along dim {dim} without a copy"
    )


def _rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    plan = _plan(x, call.arguments["dim"]) if x.size else None
    return no(plan) if isinstance(plan, str) else YES


def _run(input: np.ndarray, dim: int, log: bool) -> np.ndarray:
    sync_threads()
    if input.size == 0:
        return np.empty(input.shape, input.dtype)
    kind, x = _plan(input, dim)
    shape = input.shape
    axis = dim % max(input.ndim, 1)
    if kind == "cols" or input.ndim == 0 or axis == input.ndim - 1:
        out = buffers.empty(shape, input.dtype)
        o = as_bits(out).reshape(x.shape)
    else:  # rows of the moved dim: write the output in that memory order too
        mem = buffers.empty((*shape[:axis], *shape[axis + 1 :], shape[axis]), input.dtype)
        o = as_bits(mem).reshape(x.shape)
        out = np.moveaxis(mem, -1, axis)
    if kind == "cols":
        _softmax_cols(x, o, log)
    elif x.shape[0] > 1 and x.size >= PARALLEL_MIN:
        # chunks passed in: numba.get_num_threads() inside the kernel would defeat its disk cache
        _softmax_rows_par(x, o, log, min(x.shape[0], numba.get_num_threads()))
    else:
        _softmax_rows_ser(x, o, log)
    return out


def softmax(input: np.ndarray, dim: int) -> np.ndarray:
    return _run(input, dim, log=False)


def log_softmax(input: np.ndarray, dim: int) -> np.ndarray:
    return _run(input, dim, log=True)


KERNELS = (
    Kernel(op="softmax", name="softmax", fn=softmax, dtypes=BOTH, rule=_rule),
    Kernel(op="log_softmax", name="log_softmax", fn=log_softmax, dtypes=BOTH, rule=_rule),
)
