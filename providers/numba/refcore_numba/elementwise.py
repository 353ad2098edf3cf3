"""Numba kernels for the elementwise family (specs/elementwise.yaml).

Layouts. Unary kernels run one flat loop over any dense input (C-contiguous, channels_last, a
transpose: any permutation of a contiguous array) and give the output the same memory order, as
torch's ``empty_like`` does; inputs that are strided but viewable as 2-D (rows, last axis), such
as every other element or one half of a chunked last axis, run row by row into a C-contiguous
output. Binary kernels take same-size operands (flat when both are contiguous or share dense
strides, else as 2-D strided views) or a contiguous operand with a contiguous trailing row or
scalar broadcast over it (``other.shape == input.shape[-k:]``, leading 1s allowed, either side);
other broadcasts (a column, both operands broadcast) are declined with the reason.

Precision. Everything computes in fp32; bf16 travels as uint16 bit patterns, is widened exactly
and rounded once (RNE) at the store. This llvmlite has no SVML: ``math.exp``/``math.erf`` would
be scalar libm calls that stop the loops from vectorizing, so exp and erfc are written out as fp32
polynomials. Checked against the float64 reference on every fp32 input in [-12, 12] and on
0, +-inf, NaN, huge and tiny values: worst errors are 2-7 ulp, at most 7% of the spec tolerance
(float32 atol 1e-6, rtol 1e-5).

Example:
    >>> import numpy as np
    >>> np.round(gelu(np.float32([-1.0, 0.0, 1.0])), 6)
    array([-0.158655,  0.      ,  0.841345], dtype=float32)
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from refcore import buffers
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_numba._runtime import (
    _f32_as_u32,
    as_bits,
    bf16_to_f32,
    f32_to_bf16,
    from_bits,
    sync_threads,
)

BOTH = frozenset({"float32", "bfloat16"})
# Any strides: the rules below decline the layouts a kernel cannot view as flat or as rows.
ANY = frozenset({"strided"})
F32 = np.float32


# ---------------------------------------------------------------------------------------------
# fp32 math that vectorizes (no libm calls in the loops)


@intrinsic
def _fma(typingctx, a, b, c):
    """llvm.fma.f32: one rounding, so input + alpha * other cannot overflow in between."""

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def _ldexp(typingctx, x, n):
    """llvm.ldexp.f32: x * 2^n with IEEE overflow to inf and gradual underflow; vectorizes to one
    AVX-512 ``vscalefps`` (a shift and multiply elsewhere)."""

    def codegen(context, builder, signature, args):
        f32, i32 = ir.FloatType(), ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.ldexp", [f32, i32], ir.FunctionType(f32, [f32, i32])
        )
        return builder.call(fn, args)

    return types.float32(types.float32, types.int32), codegen


# 1.5 * 2^23: adding it rounds x / ln2 to an integer n held in the low mantissa bits (the shifter
# trick: no round or int-conversion instructions).
_SHIFT = F32(12582912.0)


@numba.njit(inline="always", cache=True)
def _exp_unclamped(x):
    """exp(x) for x in [-104, 89]: exp(r) * 2^n with |r| <= ln2/2 (Cody-Waite split of ln2) and a
    degree-5 polynomial fitted for relative error 1.05e-7 (about 2 ulp in fp32 overall); ldexp
    rounds to subnormals and overflows to inf exactly where exp does."""
    k = _fma(x, F32(1.4426950408889634), _SHIFT)
    n = k - _SHIFT
    r = _fma(n, F32(-0.693359375), x)
    r = _fma(n, F32(2.12194440e-4), r)
    p = _fma(F32(0.008312525227665901), r, F32(0.041890114545822144))
    p = _fma(p, r, F32(0.16667114198207855))
    p = _fma(p, r, F32(0.499992311000824))
    p = _fma(p, r * r, r) + F32(1.0)
    return _ldexp(p, np.int32(_f32_as_u32(k) - _f32_as_u32(_SHIFT)))


@numba.njit(inline="always", cache=True)
def _exp(x):
    """exp(x) in fp32; NaN passes the clamps (comparisons with NaN are false)."""
    x = F32(-104.0) if x < F32(-104.0) else x  # exp(-104) rounds to 0 in fp32
    x = F32(89.0) if x > F32(89.0) else x  # exp(89) overflows
    return _exp_unclamped(x)


@numba.njit(inline="always", cache=True)
def _sigmoid(x):
    return F32(1.0) / (F32(1.0) + _exp(-x))


@numba.njit(inline="always", cache=True)
def _silu(x):
    # x / (1 + e^-x): e^-x = inf gives -0 for very negative x, and NaN for -inf (as the reference).
    return x / (F32(1.0) + _exp(-x))


@numba.njit(inline="always", cache=True)
def _gelu_tanh(x):
    # 0.5x(1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715x^3): one exp, one divide.
    v = x * _fma(F32(-0.0713548162726), x * x, F32(-1.5957691216057308))  # -2u
    return x / (F32(1.0) + _exp(v))


@numba.njit(inline="always", cache=True)
def _gelu_erf(x):
    """x * Phi(x), Phi(x) = erfc(-x/sqrt2) / 2, erfc(w) = t exp(-w^2 + Q(t)), t = 1/(1 + 0.362w).

    The form is Numerical Recipes' ``erfcc``; Q is a degree-6 polynomial refitted here for a
    relative error of 5.4e-7 on w in [0, 6] (erfcc's degree 9 gives 1.2e-7: more than the spec's
    rtol 1e-5 needs). A relative error keeps the negative tail x * Phi(x) accurate, where
    1 + erf(z) would carry erf's absolute rounding error times |x| (~1e-6 at x = -5.5 in fp32
    with a rational erf). gelu(-inf) = -inf * 0 = NaN, as the reference's formula gives.
    """
    w = abs(x) * F32(0.7071067811865476)
    t = F32(1.0) / _fma(F32(0.362), w, F32(1.0))
    q = _fma(t, F32(0.33217868208885193), F32(-1.25516939163208))
    q = _fma(t, q, F32(1.5043445825576782))
    q = _fma(t, q, F32(-0.67842698097229))
    q = _fma(t, q, F32(0.736428439617157))
    q = _fma(t, q, F32(0.9449634552001953))
    q = _fma(t, q, F32(-2.2774655799892666))  # the fit's -1.58431840 - ln2: exp gives erfc / 2
    e = _fma(-w, w, q)  # <= ~0, so only the lower clamp; NaN survives the clamp or not: t is NaN
    half_erfc = t * _exp_unclamped(F32(-104.0) if e < F32(-104.0) else e)
    return x * (half_erfc if x < F32(0.0) else F32(1.0) - half_erfc)


@numba.njit(inline="always", cache=True)
def _relu(x):
    return x if not x <= F32(0.0) else F32(0.0)  # NaN: the comparison is false, NaN is kept


@numba.njit(inline="always", cache=True)
def _relu_bits(h):
    # bf16 relu on the bit pattern: keep positive values (sign bit clear) and any NaN.
    keep = h < np.uint16(0x8000) or (h & np.uint16(0x7FFF)) > np.uint16(0x7F80)
    return h if keep else np.uint16(0)


# ---------------------------------------------------------------------------------------------
# Loops: one per op and dtype (numba cannot cache closures made by a factory, so they are spelt
# out). bf16 is widened to fp32 (exact), computed, and rounded once.


@numba.njit(parallel=True, cache=True)
def _relu_f32(x, out):
    for i in numba.prange(x.size):
        out[i] = _relu(x[i])


@numba.njit(parallel=True, cache=True)
def _relu_bf16(x, out):
    for i in numba.prange(x.size):
        out[i] = _relu_bits(x[i])


@numba.njit(parallel=True, cache=True)
def _gelu_f32(x, out):
    for i in numba.prange(x.size):
        out[i] = _gelu_erf(x[i])


@numba.njit(parallel=True, cache=True)
def _gelu_bf16(x, out):
    for i in numba.prange(x.size):
        out[i] = f32_to_bf16(_gelu_erf(bf16_to_f32(x[i])))


@numba.njit(parallel=True, cache=True)
def _gelu_tanh_f32(x, out):
    for i in numba.prange(x.size):
        out[i] = _gelu_tanh(x[i])


@numba.njit(parallel=True, cache=True)
def _gelu_tanh_bf16(x, out):
    for i in numba.prange(x.size):
        out[i] = f32_to_bf16(_gelu_tanh(bf16_to_f32(x[i])))


@numba.njit(parallel=True, cache=True)
def _silu_f32(x, out):
    for i in numba.prange(x.size):
        out[i] = _silu(x[i])


@numba.njit(parallel=True, cache=True)
def _silu_bf16(x, out):
    for i in numba.prange(x.size):
        out[i] = f32_to_bf16(_silu(bf16_to_f32(x[i])))


@numba.njit(parallel=True, cache=True)
def _sigmoid_f32(x, out):
    for i in numba.prange(x.size):
        out[i] = _sigmoid(x[i])


@numba.njit(parallel=True, cache=True)
def _sigmoid_bf16(x, out):
    for i in numba.prange(x.size):
        out[i] = f32_to_bf16(_sigmoid(bf16_to_f32(x[i])))


# Strided inputs, seen as 2-D (rows, columns) views with any strides (e.g. every other element,
# or one half of a chunked last axis); the output is C-contiguous. Parallel over rows.


@numba.njit(parallel=True, cache=True)
def _relu_strided_f32(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _relu(xr[j])


@numba.njit(parallel=True, cache=True)
def _relu_strided_bf16(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _relu_bits(xr[j])


@numba.njit(parallel=True, cache=True)
def _gelu_strided_f32(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _gelu_erf(xr[j])


@numba.njit(parallel=True, cache=True)
def _gelu_strided_bf16(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(_gelu_erf(bf16_to_f32(xr[j])))


@numba.njit(parallel=True, cache=True)
def _gelu_tanh_strided_f32(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _gelu_tanh(xr[j])


@numba.njit(parallel=True, cache=True)
def _gelu_tanh_strided_bf16(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(_gelu_tanh(bf16_to_f32(xr[j])))


@numba.njit(parallel=True, cache=True)
def _silu_strided_f32(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _silu(xr[j])


@numba.njit(parallel=True, cache=True)
def _silu_strided_bf16(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(_silu(bf16_to_f32(xr[j])))


@numba.njit(parallel=True, cache=True)
def _sigmoid_strided_f32(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = _sigmoid(xr[j])


@numba.njit(parallel=True, cache=True)
def _sigmoid_strided_bf16(x, out):
    for r in numba.prange(x.shape[0]):
        xr, o = x[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(_sigmoid(bf16_to_f32(xr[j])))


# Binary ops. ``*_rows`` kernels walk the full operand in chunks of the row's length (the row is
# tiled to >= _MIN_ROW elements first so short rows and scalars still give long inner loops);
# ``row_is_other`` says which side of ``input + alpha * other`` the row is.


@numba.njit(parallel=True, cache=True)
def _add_f32(a, b, alpha, out):
    for i in numba.prange(out.size):
        out[i] = _fma(alpha, b[i], a[i])


@numba.njit(parallel=True, cache=True)
def _add_bf16(a, b, alpha, out):
    for i in numba.prange(out.size):
        out[i] = f32_to_bf16(_fma(alpha, bf16_to_f32(b[i]), bf16_to_f32(a[i])))


@numba.njit(parallel=True, cache=True)
def _add_rows_f32(full, row, alpha, out, row_is_other):
    n, m = full.size, row.size
    for c in numba.prange((n + m - 1) // m):
        # Slices, not lo + j indexing: numba cannot prove lo + j >= 0 and would emit
        # negative-index wraparound, which LLVM vectorizes as gathers and scatters.
        f, o = full[c * m : c * m + m], out[c * m : c * m + m]
        if row_is_other:
            for j in range(f.size):
                o[j] = _fma(alpha, row[j], f[j])
        else:
            for j in range(f.size):
                o[j] = _fma(alpha, f[j], row[j])


@numba.njit(parallel=True, cache=True)
def _add_rows_bf16(full, row, alpha, out, row_is_other):
    n, m = full.size, row.size
    for c in numba.prange((n + m - 1) // m):
        f, o = full[c * m : c * m + m], out[c * m : c * m + m]
        if row_is_other:
            for j in range(f.size):
                o[j] = f32_to_bf16(_fma(alpha, bf16_to_f32(row[j]), bf16_to_f32(f[j])))
        else:
            for j in range(f.size):
                o[j] = f32_to_bf16(_fma(alpha, bf16_to_f32(f[j]), bf16_to_f32(row[j])))


@numba.njit(parallel=True, cache=True)
def _mul_f32(a, b, out):
    for i in numba.prange(out.size):
        out[i] = a[i] * b[i]


@numba.njit(parallel=True, cache=True)
def _mul_bf16(a, b, out):
    # The product of two bf16 values is exact in fp32 (8 + 8 significant bits): one rounding.
    for i in numba.prange(out.size):
        out[i] = f32_to_bf16(bf16_to_f32(a[i]) * bf16_to_f32(b[i]))


@numba.njit(parallel=True, cache=True)
def _mul_rows_f32(full, row, out, row_is_other):  # row_is_other: unused, mul commutes
    n, m = full.size, row.size
    for c in numba.prange((n + m - 1) // m):
        f, o = full[c * m : c * m + m], out[c * m : c * m + m]
        for j in range(f.size):
            o[j] = f[j] * row[j]


@numba.njit(parallel=True, cache=True)
def _mul_rows_bf16(full, row, out, row_is_other):
    n, m = full.size, row.size
    for c in numba.prange((n + m - 1) // m):
        f, o = full[c * m : c * m + m], out[c * m : c * m + m]
        for j in range(f.size):
            o[j] = f32_to_bf16(bf16_to_f32(f[j]) * bf16_to_f32(row[j]))


# Same-size operands with other strides, as 2-D views (rows, columns) of equal shape.


@numba.njit(parallel=True, cache=True)
def _add_strided_f32(a, b, alpha, out):
    for r in numba.prange(out.shape[0]):
        ar, br, o = a[r], b[r], out[r]
        for j in range(o.size):
            o[j] = _fma(alpha, br[j], ar[j])


@numba.njit(parallel=True, cache=True)
def _add_strided_bf16(a, b, alpha, out):
    for r in numba.prange(out.shape[0]):
        ar, br, o = a[r], b[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(_fma(alpha, bf16_to_f32(br[j]), bf16_to_f32(ar[j])))


@numba.njit(parallel=True, cache=True)
def _mul_strided_f32(a, b, out):
    for r in numba.prange(out.shape[0]):
        ar, br, o = a[r], b[r], out[r]
        for j in range(o.size):
            o[j] = ar[j] * br[j]


@numba.njit(parallel=True, cache=True)
def _mul_strided_bf16(a, b, out):
    for r in numba.prange(out.shape[0]):
        ar, br, o = a[r], b[r], out[r]
        for j in range(o.size):
            o[j] = f32_to_bf16(bf16_to_f32(ar[j]) * bf16_to_f32(br[j]))


# ---------------------------------------------------------------------------------------------
# Layout handling (plain Python, once per call)


def _dense_axes(a: np.ndarray) -> tuple[int, ...] | None:
    """Axes from slowest to fastest in memory when ``a`` is a permutation of a C-contiguous array
    (channels_last, a transpose), else None."""
    if a.flags.c_contiguous:
        return tuple(range(a.ndim))
    axes = tuple(sorted(range(a.ndim), key=lambda d: -a.strides[d]))
    return axes if a.transpose(axes).flags.c_contiguous else None


def _rows_view(a: np.ndarray) -> np.ndarray | None:
    """``a`` as a 2-D (rows, last axis) view without copying, or None when its strides do not
    allow one (setting ``shape`` raises instead of copying)."""
    v = a.view()
    try:
        v.shape = (-1, a.shape[-1]) if a.ndim else (1, 1)
    except AttributeError:
        return None
    return v


def _unary_rule(call: Call) -> Verdict:
    a = call.arguments["input"]
    if a.size > 1 and _dense_axes(a) is None and _rows_view(a) is None:
        return no(
            f"input has strides {a.strides} for shape {a.shape}: neither dense nor viewable "
            "as strided rows"
        )
    return YES


def _unary(input: np.ndarray, kernels: tuple) -> np.ndarray:
    """Run ``kernels`` = (flat f32, flat bf16, strided f32, strided bf16) on ``input``.

    Dense inputs run as one flat loop over their memory, and the output keeps their memory order
    (like torch's ``empty_like``); strided ones run row by row into a C-contiguous output.
    """
    sync_threads()
    x = as_bits(input)
    bf16 = x.dtype == np.uint16
    if x.flags.c_contiguous:
        out = buffers.empty(x.shape, x.dtype)
        kernels[bf16](x.reshape(-1), out.reshape(-1))
        return from_bits(out, input.dtype)
    axes = _dense_axes(x)
    if axes is not None:
        xt = x.transpose(axes)  # C-contiguous: reshape(-1) below is a view
        out = buffers.empty(xt.shape, x.dtype)
        kernels[bf16](xt.reshape(-1), out.reshape(-1))
        return from_bits(out.transpose(np.argsort(axes)), input.dtype)
    out = buffers.empty(x.shape, x.dtype)
    if out.size:
        kernels[2 + bf16](_rows_view(x), out.reshape(-1, x.shape[-1]))
    return from_bits(out, input.dtype)


_RELU = (_relu_f32, _relu_bf16, _relu_strided_f32, _relu_strided_bf16)
_GELU = (_gelu_f32, _gelu_bf16, _gelu_strided_f32, _gelu_strided_bf16)
_GELU_TANH = (_gelu_tanh_f32, _gelu_tanh_bf16, _gelu_tanh_strided_f32, _gelu_tanh_strided_bf16)
_SILU = (_silu_f32, _silu_bf16, _silu_strided_f32, _silu_strided_bf16)
_SIGMOID = (_sigmoid_f32, _sigmoid_bf16, _sigmoid_strided_f32, _sigmoid_strided_bf16)


def relu(input: np.ndarray) -> np.ndarray:
    return _unary(input, _RELU)


def gelu(input: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    return _unary(input, _GELU_TANH if approximate == "tanh" else _GELU)


def silu(input: np.ndarray) -> np.ndarray:
    return _unary(input, _SILU)


def sigmoid(input: np.ndarray) -> np.ndarray:
    return _unary(input, _SIGMOID)


# Rows shorter than this are tiled (small scratch) so the inner loops stay long enough to pay.
_MIN_ROW = 256


def _broadcast_shape(s: tuple[int, ...], t: tuple[int, ...]) -> tuple[int, ...]:
    # The shapes were checked broadcastable by the reference's check before any kernel runs.
    if s == t:
        return s
    nd = max(len(s), len(t))
    s, t = (1,) * (nd - len(s)) + s, (1,) * (nd - len(t)) + t
    return tuple(x if y == 1 else y for x, y in zip(s, t))


def _plan(a: np.ndarray, b: np.ndarray) -> tuple:
    """How to run ``a op b``: (kind, detail, result shape) with kind, detail one of "flat", axes;
    "strided", None; "rows", row_is_b; or "no", the reason."""
    shape = _broadcast_shape(a.shape, b.shape)
    n = math.prod(shape)
    if a.size == n and b.size == n:
        if a.flags.c_contiguous and b.flags.c_contiguous:
            return "flat", None, shape
        if a.strides == b.strides and a.shape == b.shape:
            axes = _dense_axes(a)
            if axes is not None:
                return "flat", axes, shape
        if n == 0 or (_rows_view(a) is not None and _rows_view(b) is not None):
            return "strided", None, shape
        return (
            "no",
            f"operands have strides {a.strides} and {b.strides} for shapes {a.shape} and "
            f"{b.shape}: not viewable as strided rows",
            shape,
        )
    if a.size != n and b.size != n:
        return "no", f"both operands broadcast (shapes {a.shape} and {b.shape})", shape
    full, row = (a, b) if a.size == n else (b, a)
    dims = row.shape
    while dims and dims[0] == 1:
        dims = dims[1:]
    if dims and tuple(shape[len(shape) - len(dims) :]) != dims:
        return (
            "no",
            f"shape {row.shape} broadcasts against {full.shape} other than as a trailing row "
            "or a scalar",
            shape,
        )
    if not (full.flags.c_contiguous and row.flags.c_contiguous):
        return "no", "a broadcast row needs both operands contiguous", shape
    return "rows", row is b, shape


def _binary_rule(call: Call) -> Verdict:
    kind, detail, _ = _plan(call.arguments["input"], call.arguments["other"])
    return no(detail) if kind == "no" else YES


def _binary(input: np.ndarray, other: np.ndarray, kernels: tuple, *alpha) -> np.ndarray:
    """Run ``kernels`` = (flat, rows, strided) for the dtype on ``input op other``.

    flat(a, b, *alpha, out) walks same-size operands over their memory; rows(full, row, *alpha,
    out, row_is_other) broadcasts a row; strided(a2, b2, *alpha, out2) walks 2-D views.
    """
    sync_threads()
    a, b = as_bits(input), as_bits(other)
    flat, rows, strided = kernels
    if a.shape == b.shape and a.flags.c_contiguous and b.flags.c_contiguous:  # the common case
        out = buffers.empty(a.shape, a.dtype)
        flat(a.reshape(-1), b.reshape(-1), *alpha, out.reshape(-1))
        return from_bits(out, input.dtype)
    kind, detail, shape = _plan(a, b)
    if kind == "flat" and detail is None:
        out = buffers.empty(shape, a.dtype)
        flat(a.reshape(-1), b.reshape(-1), *alpha, out.reshape(-1))
        return from_bits(out, input.dtype)
    if kind == "flat":  # same shape and strides, dense but not C order: run over the memory
        at, bt = a.transpose(detail), b.transpose(detail)
        out = buffers.empty(at.shape, a.dtype)
        flat(at.reshape(-1), bt.reshape(-1), *alpha, out.reshape(-1))
        return from_bits(out.transpose(np.argsort(detail)), input.dtype)
    out = buffers.empty(shape, a.dtype)
    if out.size == 0:
        return from_bits(out, input.dtype)
    if kind == "strided":
        strided(_rows_view(a), _rows_view(b), *alpha, out.reshape(-1, shape[-1]))
        return from_bits(out, input.dtype)
    full, row = (a, b) if detail else (b, a)
    row = row.reshape(-1)
    if row.size < _MIN_ROW:  # whole copies, so chunks start on row starts (np.tile is slower)
        reps = -(-_MIN_ROW // row.size)
        tiled = np.empty((reps, row.size), row.dtype)
        tiled[:] = row
        row = tiled.reshape(-1)
    rows(full.reshape(-1), row, *alpha, out.reshape(-1), detail)
    return from_bits(out, input.dtype)


_ADD = {
    False: (_add_f32, _add_rows_f32, _add_strided_f32),
    True: (_add_bf16, _add_rows_bf16, _add_strided_bf16),
}
_MUL = {
    False: (_mul_f32, _mul_rows_f32, _mul_strided_f32),
    True: (_mul_bf16, _mul_rows_bf16, _mul_strided_bf16),
}


def add(input: np.ndarray, other: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    # NOTE: alpha is rounded to fp32, as torch does for fp32/bf16 tensors; input + alpha * other is
    # one fused multiply-add, so alpha * other cannot overflow on its own.
    return _binary(input, other, _ADD[input.dtype != np.float32], F32(alpha))


def mul(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    return _binary(input, other, _MUL[input.dtype != np.float32])


def _kernel(op: str, fn, rule) -> Kernel:
    return Kernel(op=op, name=op, fn=fn, dtypes=BOTH, layouts=ANY, rule=rule)


KERNELS = (
    _kernel("relu", relu, _unary_rule),
    _kernel("gelu", gelu, _unary_rule),
    _kernel("silu", silu, _unary_rule),
    _kernel("sigmoid", sigmoid, _unary_rule),
    _kernel("add", add, _binary_rule),
    _kernel("mul", mul, _binary_rule),
)
