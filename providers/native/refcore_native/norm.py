"""Native kernels for the norm family (specs/norm.yaml): layer_norm, rms_norm.

C: ``csrc/norm_<level>.c``. Statistics in fp32 (two passes for layer_norm: mean, then the centred
sum of squares), the variance step in double, each output formed in fp32 and rounded once; a
row whose squares would overflow or underflow fp32 (max |x| outside [2**-30, 2**40]) is scaled by
a power of two first (``csrc/rc_norm_row.h``), so |x| ~ 1e20 gives the right answer, not zeros.
Inputs must be C-contiguous (other layouts are declined by dispatch); the normalized dims are the
trailing ones, so the input is a (rows, D) matrix without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.provider import Kernel
from refcore.tensors import fp32_scalar
from refcore_native import _runtime as rt


def _rows(op: str, x: np.ndarray, normalized_shape: tuple[int, ...]) -> tuple[int, int]:
    ns = tuple(normalized_shape)
    if not ns or len(ns) > x.ndim or x.shape[x.ndim - len(ns) :] != ns:
        rt.fail(op, "normalized_shape", f"the trailing dims of input {x.shape}", ns)
    d = math.prod(ns)
    return (x.size // d if d else 0), d


def _layer_norm(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("layer_norm", level, dtypes)

    def layer_norm(
        input: np.ndarray,
        normalized_shape: tuple[int, ...],
        weight: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        eps: float = 1e-5,
    ) -> np.ndarray:
        op = "layer_norm"
        x = rt.operand(op, "input", input, names)
        dt = x.dtype
        rows, d = _rows(op, x, normalized_shape)
        ns = tuple(normalized_shape)
        w = None if weight is None else rt.array(op, "weight", weight, dt, ns)
        b = None if bias is None else rt.array(op, "bias", bias, dt, ns)
        if eps < 0:  # NaN passes, as in the spec's check: every output is then NaN
            rt.fail(op, "eps", "a non-negative value", eps)
        out = buffers.empty(x.shape, dt)
        if out.size:
            c = rt.c_function(names[dt])
            nt = rt.threads(2 * x.nbytes)
            c.fn(c.ptr(x), c.opt(w), c.opt(b), c.ptr(out), rows, d, fp32_scalar(eps), nt)
        return out

    return layer_norm


def _rms_norm(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("rms_norm", level, dtypes)

    def rms_norm(
        input: np.ndarray,
        normalized_shape: tuple[int, ...],
        weight: np.ndarray | None = None,
        eps: float | None = None,
    ) -> np.ndarray:
        op = "rms_norm"
        x = rt.operand(op, "input", input, names)
        dt = x.dtype
        rows, d = _rows(op, x, normalized_shape)
        w = None if weight is None else rt.array(op, "weight", weight, dt, tuple(normalized_shape))
        if eps is None:  # torch's compute type is fp32 for float32 and bf16 inputs alike
            eps = float(np.finfo(np.float32).eps)
        if eps < 0:  # NaN passes, as in the spec's check: every output is then NaN
            rt.fail(op, "eps", "a non-negative value", eps)
        out = buffers.empty(x.shape, dt)
        if out.size:
            c = rt.c_function(names[dt])
            eps32, nt = fp32_scalar(eps), rt.threads(2 * x.nbytes)
            c.fn(c.ptr(x), c.opt(w), c.ptr(out), rows, d, eps32, nt)
        return out

    return rms_norm


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=make(lvl, dts), dtypes=dts, layouts=rt.CONTIGUOUS,
               isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("norm") if cpu.has(lvl)
        for op, make in (("layer_norm", _layer_norm), ("rms_norm", _rms_norm))
    )  # fmt: skip
