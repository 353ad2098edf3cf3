"""Native kernels for the reduction family (specs/reduction.yaml): softmax, log_softmax.

C: ``csrc/reduction_<level>.c``. Last dim only, over a C-contiguous input (a (rows, D) matrix
without a copy); another ``dim`` is declined with a reason. Three passes over each row in cache:
max, sum of exp(x - max) in fp32, output; special values as the reference (a row holding NaN or
+inf, or all -inf, is NaN throughout).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt


def _last_dim(x: np.ndarray, dim: int) -> bool:
    n = max(x.ndim, 1)
    return -n <= dim < n and dim % n == n - 1


def _rule(call: Call) -> Verdict:
    x, dim = call.arguments["input"], call.arguments["dim"]
    if not _last_dim(x, dim):
        return no(
            f"dim={dim} of a {x.ndim}-D input is not the last dim; the native kernel "
            "reduces contiguous rows only"
        )
    return YES


def _make(op: str, level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols(op, level, dtypes)

    def kernel(input: np.ndarray, dim: int) -> np.ndarray:
        dt = rt.float_dtype(op, "input", input, names)
        x = rt.array(op, "input", input, dt)
        if not _last_dim(x, dim):
            rt.fail(op, "dim", f"the last dim ({max(x.ndim, 1) - 1} or -1)", dim)
        out = buffers.empty(x.shape, dt)
        if out.size:
            d = x.shape[-1] if x.ndim else 1
            c = rt.c_function(names[dt])
            c.fn(c.ptr(x), c.ptr(out), x.size // d, d, rt.threads(2 * x.nbytes))
        return out

    kernel.__name__ = kernel.__qualname__ = op
    return kernel


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=_make(op, lvl, dts), dtypes=dts,
               layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl), rule=_rule)
        for lvl, dts in rt.variants("reduction") if cpu.has(lvl)
        for op in ("softmax", "log_softmax")
    )  # fmt: skip
