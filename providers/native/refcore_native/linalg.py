"""Native kernels for the linalg family (specs/linalg.yaml): linear for small M (LLM decode).

C: ``csrc/linalg_<level>.c`` with the driver in ``csrc/rc_gemv.h``: the weight (N, K) is
streamed once, split over the threads by rows, with software prefetch; up to 4 rows of the input
times 4 rows of the weight accumulate in registers, in fp32. bf16 uses vdpbf16ps at the
avx512_bf16 level, widening + FMA at avx512. M (the product of the input's leading dims) above
``MAX_M`` is declined: that is the GEMM path, not this one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt

MAX_M = 16


def _rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    m = math.prod(x.shape[:-1])
    if m > MAX_M:
        return no(f"M = {m} rows (input {x.shape}) > {MAX_M}: this is the small-M (decode) path")
    return YES


def _linear(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("linear", level, dtypes)

    def linear(input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        op = "linear"
        dt = rt.float_dtype(op, "input", input, names)
        x = rt.array(op, "input", input, dt)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        k = x.shape[-1]
        w = rt.array(op, "weight", weight, dt)
        if w.ndim != 2 or w.shape[1] != k:
            rt.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])", w.shape)
        n = w.shape[0]
        b = None if bias is None else rt.array(op, "bias", bias, dt, (n,))
        m = math.prod(x.shape[:-1])
        if m > MAX_M:
            rt.fail(op, "input", f"at most {MAX_M} rows (M) for the small-M kernel", f"M = {m}")
        out = buffers.empty((*x.shape[:-1], n), dt)
        if out.size:
            name = names[dt]
            if dt == rt.BFLOAT16 and level in rt.FLUSHES_BF16 and not rt.bf16_dots_exact(x, w, k):
                name = "rc_linear_bf16_avx512"  # subnormals that matter: exact products
            c = rt.c_function(name)
            nt = rt.threads(w.nbytes)
            c.fn(c.ptr(x), c.ptr(w), c.opt(b), c.ptr(out), m, n, k, nt)
        return out

    return linear


def kernels() -> tuple[Kernel, ...]:
    """One kernel per ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op="linear", name=f"linear_{lvl}", fn=_linear(lvl, dts), dtypes=dts,
               layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl), rule=_rule)
        for lvl, dts in rt.variants("linalg") if cpu.has(lvl)
    )  # fmt: skip
