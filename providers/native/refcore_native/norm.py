"""Native kernels for the norm family (specs/norm.yaml): layer_norm, rms_norm, group_norm (and
the fused group_norm_silu of specs/fused.yaml, the same C function with its SiLU on), and the
per-channel affine of specs/fused.yaml's channel_affine (an unfolded FrozenBatchNorm2d).

C: ``csrc/norm_<level>.c``. Statistics in fp32 (two passes for layer_norm: mean, then the centred
sum of squares), the variance step in double, each output formed in fp32 and rounded once; a
row whose squares would overflow or underflow fp32 (max |x| outside [2**-30, 2**40]) is scaled by
a power of two first (``csrc/rc_norm_row.h``), so |x| ~ 1e20 gives the right answer, not zeros.
Inputs must be C-contiguous (other layouts are declined by dispatch); the normalized dims are the
trailing ones, so the input is a (rows, D) matrix without a copy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
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


#: group_norm's layouts: NCHW (each (sample, group) block one contiguous row) and channels-last
#: (each pixel's channels contiguous, as the native conv2d writes them), both without a copy
GROUP_NORM_LAYOUTS = frozenset({"contiguous", "channels_last"})


def _group_norm(level: str, dtypes: frozenset[str], silu: bool) -> Callable[..., np.ndarray]:
    names = rt.symbols("group_norm", level, dtypes)
    op = "group_norm_silu" if silu else "group_norm"

    def group_norm(
        input: np.ndarray,
        num_groups: int,
        weight: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        eps: float = 1e-5,
    ) -> np.ndarray:
        dt = rt.float_dtype(op, "input", input, names)
        if input.ndim < 2:
            rt.fail(op, "input", "a 2-D or more tensor (N, C, *)", f"shape {input.shape}")
        n, c = input.shape[:2]
        hw = math.prod(input.shape[2:])
        if num_groups < 1 or c % num_groups:
            rt.fail(op, "num_groups", f"a divisor of the {c} channels", num_groups)
        if eps < 0:  # NaN passes, as in the spec's check: every output is then NaN
            rt.fail(op, "eps", "a non-negative value", eps)
        w = None if weight is None else rt.array(op, "weight", weight, dt, (c,))
        b = None if bias is None else rt.array(op, "bias", bias, dt, (c,))
        flags = input.flags
        if flags.c_contiguous and flags.aligned:
            cl, x = 0, input
            out = buffers.empty(input.shape, dt)
            res = out
        elif (input.ndim == 4 and flags.aligned
              and input.transpose(0, 2, 3, 1).flags.c_contiguous):
            cl, x = 1, input.transpose(0, 2, 3, 1)  # (N, H, W, C), C-contiguous: no copy
            res = buffers.empty(x.shape, dt)
            out = res.transpose(0, 3, 1, 2)  # channels-last, like torch's output for such input
        else:
            rt.fail(op, "input", "a contiguous or channels-last array",
                    f"strides {input.strides} for shape {input.shape}")  # fmt: skip
        if not input.size:
            return out
        nt = rt.threads(2 * input.nbytes)
        # channels-last: each sample's pixels in `parts` ranges, so n * parts covers the threads
        # (more parts only add partial sums: 2 samples x 2 parts on 2 threads took 1.9x as long)
        threads = nt if nt > 0 else os.cpu_count() or 1
        parts = max(1, min(hw, -(-threads // max(n, 1))))
        work = np.empty(2 * n * parts * c + 3 * n * c + 2 * c if cl else 1, np.float32)
        cf = rt.c_function(names[dt])
        cf.fn(cf.ptr(x), cf.opt(w), cf.opt(b), cf.ptr(res), n, c, hw, num_groups, cl, int(silu),
              fp32_scalar(eps), parts, cf.ptr(work), nt)  # fmt: skip
        return out

    group_norm.__name__ = op
    return group_norm


def _per_channel(x: np.ndarray, p: np.ndarray) -> bool:
    """``p`` holds one value per channel of the 4-D ``x``, shaped to broadcast along axis 1."""
    c = x.shape[1]
    return p.shape in ((1, c, 1, 1), (c, 1, 1))


def _channel_affine_rule(call: Call) -> Verdict:
    a = call.arguments
    x = a["input"]
    if x.ndim != 4:
        return no(f"input of {x.ndim} dims; the kernel takes (N, C, H, W)")
    for name in ("scale", "shift"):
        if not _per_channel(x, a[name]):
            return no(f"{name} shape {a[name].shape}: one value per channel of input "
                      f"{x.shape}, (1, C, 1, 1) or (C, 1, 1), is implemented")  # fmt: skip
    return YES


def _channel_affine(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("channel_affine", level, dtypes)
    op = "channel_affine"

    def channel_affine(input: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
        dt = rt.float_dtype(op, "input", input, names)
        if input.ndim != 4:
            rt.fail(op, "input", "an (N, C, H, W) array", f"shape {input.shape}")
        for name, p in (("scale", scale), ("shift", shift)):
            if not isinstance(p, np.ndarray) or p.dtype != dt or not _per_channel(input, p):
                rt.fail(op, name, f"one {dt} value per channel, (1, C, 1, 1) or (C, 1, 1)",
                        getattr(p, "shape", p))  # fmt: skip
        n, c, h, w = input.shape
        flags = input.flags
        if flags.c_contiguous and flags.aligned:
            cl, x = 0, input
            res = out = buffers.empty(input.shape, dt)
        elif flags.aligned and input.transpose(0, 2, 3, 1).flags.c_contiguous:
            cl, x = 1, input.transpose(0, 2, 3, 1)
            res = buffers.empty(x.shape, dt)
            out = res.transpose(0, 3, 1, 2)
        else:
            rt.fail(op, "input", "a contiguous or channels-last array",
                    f"strides {input.strides} for shape {input.shape}")  # fmt: skip
        if not input.size:
            return out
        s32 = np.ascontiguousarray(scale.reshape(c), np.float32)  # bf16 widens exactly
        b32 = np.ascontiguousarray(shift.reshape(c), np.float32)
        work = np.empty(2 * c, np.float32)
        cf = rt.c_function(names[dt])
        cf.fn(cf.ptr(x), cf.ptr(s32), cf.ptr(b32), cf.ptr(res), n, c, h * w, cl, cf.ptr(work),
              rt.threads(2 * input.nbytes))  # fmt: skip
        return out

    return channel_affine


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    rows = tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=make(lvl, dts), dtypes=dts, layouts=rt.CONTIGUOUS,
               isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("norm") if cpu.has(lvl)
        for op, make in (("layer_norm", _layer_norm), ("rms_norm", _rms_norm))
    )  # fmt: skip
    groups = tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=_group_norm(lvl, dts, op == "group_norm_silu"),
               dtypes=dts, layouts=GROUP_NORM_LAYOUTS, isa=lvl, priority=rt.priority(lvl))
        for lvl, dts in rt.variants("norm") if cpu.has(lvl)
        for op in ("group_norm", "group_norm_silu")
    )  # fmt: skip
    affine = tuple(
        Kernel(op="channel_affine", name=f"channel_affine_{lvl}", fn=_channel_affine(lvl, dts),
               dtypes=dts, layouts=GROUP_NORM_LAYOUTS, isa=lvl, priority=rt.priority(lvl),
               rule=_channel_affine_rule)
        for lvl, dts in rt.variants("norm") if cpu.has(lvl)
    )  # fmt: skip
    return rows + groups + affine
