"""Native kernels for the optimizer family (specs/optim.yaml): sgd, adagrad, adam, adamw, lamb.

C: ``csrc/optim_<level>.c``. One call steps every tensor of a parameter group in place: one C
call with arrays of pointers (one parallel region, chunks across all tensors), one pass over
param / grad / state per element (lamb: a second over param and its moments, for the per-tensor
trust ratio). float32 arithmetic in the reference's order (refcore/ops/optim.py: torch.optim's
rules plus Lamb), so a step is within a few float32 ulps of the float64 reference.

Masters: ``float32`` (``params`` float32, ``bottoms`` None) or ``split_bf16`` (``params`` the
bfloat16 top halves, ``bottoms`` the uint16 low halves: joined to the float32 master at the load,
split again by truncation at the store). The split path runs the float32 path's arithmetic, so
its masters and states are bit-identical to it. Grads float32 or bfloat16 (widened exactly).

``fn(params, bottoms, grads, states, step, fresh, **hp)``: ``states`` one dict per param of the
rule's float32 state arrays, all allocated (`STATES`: sgd's buffer only with momentum, adam's max
only with amsgrad); ``step`` the 1-based step number; ``fresh`` True when no step has written the
state yet (sgd's momentum buffer then starts as the update, as the reference's first step; the
other rules' fresh states hold the caller's initial values); ``hp`` the spec's hyper-parameters
(`HPARAMS`, the reference's defaults).

Example:
    >>> import numpy as np
    >>> from refcore_native import optim
    >>> sgd = next(k for k in optim.kernels() if k.op == "sgd")  # doctest: +SKIP
    >>> p = np.float32([1.0, 2.0])
    >>> sgd.fn([p], None, [np.float32([0.5, -1.0])], [{}], 1, True, lr=0.1)  # doctest: +SKIP
    >>> p.tolist()  # doctest: +SKIP
    [0.949999988079071, 2.0999999046325684]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from refcore import cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore.tensors import BFLOAT16, dtype_name
from refcore_native import _build
from refcore_native import _runtime as rt

F32, U16 = rt.F32, np.dtype(np.uint16)
DTYPES = frozenset({"float32", "split_bf16"})
LEVELS = (("portable", DTYPES), ("avx2", DTYPES), ("avx512", DTYPES))
NAMES = ("sgd", "adagrad", "adam", "adamw", "lamb")
GRAD_DTYPES = (F32, BFLOAT16)
#: the state arrays each rule reads and writes, in the order of the C arguments
STATES = {
    "sgd": ("momentum_buffer",),
    "adagrad": ("sum",),
    "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "lamb": ("exp_avg", "exp_avg_sq"),
}
_ADAM = {"lr": None, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
         "maximize": False}  # fmt: skip
#: each rule's hyper-parameters with the reference's defaults (lr has none)
HPARAMS: dict[str, dict[str, Any]] = {
    "sgd": {"lr": None, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
            "nesterov": False, "maximize": False},
    "adagrad": {"lr": None, "lr_decay": 0.0, "weight_decay": 0.0,
                "initial_accumulator_value": 0.0, "eps": 1e-10, "maximize": False},
    "adam": _ADAM,
    "adamw": {**_ADAM, "weight_decay": 0.01},
    "lamb": {"lr": None, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.0,
             "clamp_min": 0.0, "clamp_max": 10.0},
}  # fmt: skip
#: the C function's scalars after the grad dtype flag (adagrad's initial_accumulator_value is
#: the caller's: it fills a fresh "sum" with it)
SCALARS = {
    "sgd": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "fresh"),
    "adagrad": ("lr", "lr_decay", "weight_decay", "eps", "maximize", "step"),
    "adam": ("lr", "beta1", "beta2", "eps", "weight_decay", "maximize", "step"),
    "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay", "maximize", "step"),
    "lamb": ("lr", "beta1", "beta2", "eps", "weight_decay", "clamp_min", "clamp_max", "step"),
}
FLAGS = frozenset({"nesterov", "maximize", "amsgrad"})


def _rule(call: Call) -> Verdict:
    dts = {getattr(g, "dtype", None) for g in call.arguments["grads"]}
    bad = dts - set(GRAD_DTYPES)
    if bad:
        got = ", ".join(sorted(dtype_name(d) if d is not None else "non-arrays" for d in bad))
        return no(f"grads of dtype {got}: the native optimizers read float32 or bfloat16 grads")
    if len(dts) > 1:
        return no("grads of mixed dtypes (float32 and bfloat16): one grad dtype per native call")
    return YES


def _list(op: str, arg: str, x: Any, t: int | None = None) -> Sequence[Any]:
    if not isinstance(x, (list, tuple)):
        rt.fail(op, arg, "a list of arrays", type(x).__name__, TypeError)
    if t is not None and len(x) != t:
        rt.fail(op, arg, f"{t} entries (one per param)", f"{len(x)} entries")
    return x


def _ptr(ptr: Callable[[np.ndarray], Any], op: str, arg: str, k: int, a: Any, dtype: np.dtype,
         shape: tuple[int, ...] | None, write: bool) -> Any:  # fmt: skip
    """ptr(a) after `rt.array`'s checks (and, when ``write``, that it is writable): a fast path
    for the usual case (the per-tensor checks are most of a call's Python cost), `rt.array`
    itself otherwise, which raises with the reason. ``arg`` is formatted with ``k`` on failure."""
    if type(a) is np.ndarray and a.dtype == dtype and (shape is None or a.shape == shape):
        f = a.flags
        if f.c_contiguous and f.aligned and (f.writeable or not write):
            return ptr(a)
    a = rt.array(op, arg.format(k=k), a, dtype, shape)
    if write and not a.flags.writeable:
        rt.fail(op, arg.format(k=k), "a writable array (updated in place)", "a read-only array")
    return ptr(a)


def _float(op: str, arg: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.number)):
        rt.fail(op, arg, "a number", repr(x), TypeError)
    return float(x)


def _hparams(op: str, hp: dict[str, Any], step: Any, fresh: Any) -> dict[str, Any]:
    """The checked hyper-parameters with defaults filled in, betas split, step and fresh."""
    spec = HPARAMS[op]
    unknown = sorted(set(hp) - set(spec))
    if unknown:
        rt.fail(op, ", ".join(unknown), f"one of {', '.join(spec)}", "an unknown name", TypeError)
    h = {**spec, **hp}
    for name, v in list(h.items()):
        if name in FLAGS:
            h[name] = bool(v)
        elif name == "betas":
            if not (isinstance(v, (tuple, list)) and len(v) == 2):
                rt.fail(op, "betas", "a pair of floats (beta1, beta2)", repr(v), TypeError)
            h["beta1"], h["beta2"] = _float(op, "betas[0]", v[0]), _float(op, "betas[1]", v[1])
        else:
            h[name] = _float(op, name, v)  # lr=None (not given) fails here
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        rt.fail(op, "step", "an int >= 1 (the 1-based step number)", repr(step))
    h["step"], h["fresh"] = int(step), bool(fresh)
    return h


class _Group:
    """The checked tensors of one call as C arguments: counts and pointer arrays (kept alive
    here, with the buffers they point into, until the call returns)."""

    def __init__(self, op: str, params: Any, bottoms: Any, grads: Any, states: Any,
                 names: tuple[str, ...]) -> None:  # fmt: skip
        ffi = _build.library().ffi
        params = _list(op, "params", params)
        t = len(params)
        split = bottoms is not None
        grads = _list(op, "grads", grads, t)
        states = _list(op, "states", states, t)
        if split:
            bottoms = _list(op, "bottoms", bottoms, t)
        gdt = grads[0].dtype if t and isinstance(grads[0], np.ndarray) else F32
        if gdt not in GRAD_DTYPES:
            got = f"dtype {dtype_name(gdt)}"
            rt.fail(op, "grads[0]", "dtype float32 or bfloat16", got, TypeError)
        ptr = ffi.from_buffer
        n, ps, bs, gs = [], [], [], []
        ss: list[list[Any]] = [[] for _ in names]
        sargs = [f"states[{{k}}][{name!r}]" for name in names]
        for k in range(t):
            p = params[k]
            if split:  # the top halves: bfloat16 (or their uint16 bits)
                pdt = p.dtype if getattr(p, "dtype", None) in (BFLOAT16, U16) else BFLOAT16
                ps.append(_ptr(ptr, op, "params[{k}]", k, p, pdt, None, True))
                bs.append(_ptr(ptr, op, "bottoms[{k}]", k, bottoms[k], U16, p.shape, True))
            else:
                ps.append(_ptr(ptr, op, "params[{k}]", k, p, F32, None, True))
            shape = p.shape
            gs.append(_ptr(ptr, op, "grads[{k}]", k, grads[k], gdt, shape, False))
            st = states[k]
            if not isinstance(st, dict):
                rt.fail(op, f"states[{k}]", "a dict of state arrays", type(st).__name__, TypeError)
            for x, name in enumerate(names):
                if name not in st:
                    got = f"keys {sorted(st)}"
                    rt.fail(op, f"states[{k}]", f"the state {name!r} (allocated)", got)
                ss[x].append(_ptr(ptr, op, sargs[x], k, st[name], F32, shape, True))
            n.append(p.size)
        self.keep = (ps, bs, gs, ss)  # the buffers stay alive (and pinned) until the call ends
        self.t = t
        self.n = ffi.new("int64_t[]", n)
        self.p = ffi.new("void *[]", ps)
        self.b = ffi.new("void *[]", bs) if split else ffi.NULL
        self.g = ffi.new("void *[]", gs)
        # the rule's state slots; the absent ones (no momentum, no amsgrad) NULL
        self.s = [ffi.new("void *[]", s) for s in ss]
        self.s += [ffi.NULL] * (len(STATES[op]) - len(names))
        self.gbf16 = int(gdt == BFLOAT16)
        # bytes read (and most of them written): master 4 (bf16 top + bottom: 4), grad, states
        nbytes = sum(n) * (4 * (1 + len(names)) + gdt.itemsize)
        self.nt = rt.threads(2 * nbytes)


def _make(op: str, level: str) -> Callable[..., None]:
    sym, scalars = f"rc_{op}_{level}", SCALARS[op]

    def kernel(params: Any, bottoms: Any, grads: Any, states: Any, step: int, fresh: bool,
               **hp: Any) -> None:  # fmt: skip
        h = _hparams(op, hp, step, fresh)
        names = STATES[op]
        if (op == "sgd" and not h["momentum"]) or (op in ("adam", "adamw") and not h["amsgrad"]):
            names = names[:-1]
        g = _Group(op, params, bottoms, grads, states, names)
        fn = rt.c_function(sym).fn
        if fn(g.t, g.n, g.p, g.b, g.g, *g.s, g.gbf16, *[h[s] for s in scalars], g.nt) != 0:
            raise MemoryError(f"{op} (native): could not allocate the chunk table")

    kernel.__name__ = kernel.__qualname__ = op
    return kernel


def kernels() -> tuple[Kernel, ...]:
    """One kernel per optimizer and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY)
    allows."""
    return tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=_make(op, lvl), dtypes=dts,
               layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl), rule=_rule)
        for lvl, dts in rt.variants("optim", LEVELS) if cpu.has(lvl)
        for op in NAMES
    )  # fmt: skip
