"""Native kernels for the fused elementwise and norm ops (specs/fused.yaml): add_relu, add_gelu,
add_silu, add_layer_norm. (The linear_* fused ops are GEMM epilogues, not here.)

C: ``csrc/fused_<level>.c``. One pass over memory: the sum is formed in fp32 and rounded to the
dtype (as the unfused add stores it), then activated, or normalised from cache (add_layer_norm
stores the sum into the output row and normalises it in place). The operands are C-contiguous of
one shape (up to leading 1s), or one of them a trailing row broadcast over the other (a bias),
as the native add takes them; add_layer_norm also needs that row to divide the normalized size.
Other broadcasts are declined with a reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore.tensors import fp32_scalar
from refcore_native import _runtime as rt
from refcore_native.elementwise import MIN_ROW, MIN_TILED, _add_plan, _squeeze_leading, tile
from refcore_native.norm import _rows


def _operands(op: str, input, other, names) -> tuple[np.ndarray, np.ndarray, str, tuple]:
    """(input, other, plan kind, output shape) after the checks the C side relies on."""
    a = rt.operand(op, "input", input, names)
    b = rt.array(op, "other", other, a.dtype)
    plan = _add_plan(a.shape, b.shape)
    if isinstance(plan, str):
        rt.fail(op, "other", "a shape equal to input's or a trailing row of it", plan)
    return a, b, *plan


def _act_rule(call: Call) -> Verdict:
    plan = _add_plan(call.arguments["input"].shape, call.arguments["other"].shape)
    return no(plan) if isinstance(plan, str) else YES


def _add_act(op: str, stems: dict[str, str], level: str, dtypes: frozenset[str]):
    """The wrapper of add_<act>; ``stems`` maps an activation choice to its C name stem."""
    names = {k: rt.symbols(stem, level, dtypes) for k, stem in stems.items()}
    first = next(iter(names.values()))

    def run(input: np.ndarray, other: np.ndarray, key: str) -> np.ndarray:
        a, b, kind, shape = _operands(op, input, other, first)
        out = buffers.empty(shape, a.dtype)
        if not out.size:
            return out
        c = rt.c_function(names[key][a.dtype])
        nt = rt.threads(out.nbytes + a.nbytes + b.nbytes)
        if kind == "same":
            n = out.size
            c.fn(c.ptr(a), c.ptr(b), c.ptr(out), 1, n, n, n, nt)
            return out
        full, row = (a, b) if kind == "row_other" else (b, a)
        _rows_call(c, full.reshape(-1), row.reshape(-1), out.reshape(-1), kind, nt)
        return out

    return run


def _rows_call(c: rt.Call, full, row, out, kind: str, nt: int) -> None:
    """A broadcast row over ``full``: rows shorter than MIN_ROW are tiled first (long C loops)."""
    d = row.size
    rows = full.size // d
    k = min(rows, -(-MIN_ROW // d)) if full.size >= MIN_TILED else 1
    if k > 1:
        main = rows - rows % k
        _row_call(c, full, tile(row, k), out, main // k, d * k, kind, nt)
        if main == rows:
            return
        full, out, rows = full[main * d :], out[main * d :], rows - main
    _row_call(c, full, row, out, rows, d, kind, nt)


def _row_call(c: rt.Call, full, row, out, rows: int, d: int, kind: str, nt: int) -> None:
    if kind == "row_other":
        c.fn(c.ptr(full), c.ptr(row), c.ptr(out), rows, d, d, 0, nt)
    else:
        c.fn(c.ptr(row), c.ptr(full), c.ptr(out), rows, d, 0, d, nt)


def _add_relu(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    run = _add_act("add_relu", {"": "add_relu"}, level, dtypes)

    def add_relu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
        return run(input, other, "")

    return add_relu


def _add_silu(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    run = _add_act("add_silu", {"": "add_silu"}, level, dtypes)

    def add_silu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
        return run(input, other, "")

    return add_silu


def _add_gelu(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    run = _add_act("add_gelu", {"none": "add_gelu", "tanh": "add_gelu_tanh"}, level, dtypes)

    def add_gelu(input: np.ndarray, other: np.ndarray, *, approximate: str = "none") -> np.ndarray:
        if approximate not in ("none", "tanh"):
            rt.fail("add_gelu", "approximate", "one of 'none', 'tanh'", repr(approximate))
        return run(input, other, approximate)

    return add_gelu


# ---------------------------------------------------------------------------------------------
# add_layer_norm


def _ln_plan(a_shape: tuple, b_shape: tuple, normalized_shape) -> tuple | str:
    """(kind, output shape) for the C kernel, or why it cannot run the call."""
    plan = _add_plan(a_shape, b_shape)
    if isinstance(plan, str):
        return plan
    kind, shape = plan
    d = math.prod(normalized_shape)
    if kind != "same":
        r = math.prod(_squeeze_leading(b_shape if kind == "row_other" else a_shape))
        if r == 0 or d % r:
            return (
                f"the broadcast operand repeats every {r} elements, not within each normalized "
                f"row of {d}; the native add_layer_norm takes equal shapes or a row of <= {d}"
            )
    return kind, shape


def _ln_rule(call: Call) -> Verdict:
    args = call.arguments
    plan = _ln_plan(args["input"].shape, args["other"].shape, args["normalized_shape"])
    return no(plan) if isinstance(plan, str) else YES


def _add_layer_norm(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("add_layer_norm", level, dtypes)

    def add_layer_norm(
        input: np.ndarray,
        other: np.ndarray,
        normalized_shape: tuple[int, ...],
        weight: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        eps: float = 1e-5,
    ) -> np.ndarray:
        op = "add_layer_norm"
        a = rt.operand(op, "input", input, names)
        dt = a.dtype
        b = rt.array(op, "other", other, dt)
        ns = tuple(normalized_shape)
        plan = _ln_plan(a.shape, b.shape, ns)
        if isinstance(plan, str):
            rt.fail(op, "other", "a shape equal to input's or a trailing row of it", plan)
        kind, shape = plan
        rows, d = _rows(op, np.broadcast_to(a, shape) if a.shape != shape else a, ns)
        w = None if weight is None else rt.array(op, "weight", weight, dt, ns)
        bs = None if bias is None else rt.array(op, "bias", bias, dt, ns)
        if eps < 0:  # NaN passes, as in the spec's check: every output is then NaN
            rt.fail(op, "eps", "a non-negative value", eps)
        out = buffers.empty(shape, dt)
        if not out.size:
            return out
        a_rs = b_rs = d
        if kind != "same":  # the row, tiled to one normalized row, read at stride 0
            row = b if kind == "row_other" else a
            row = tile(row.reshape(-1), d // row.size)
            a, b, a_rs, b_rs = (a, row, d, 0) if kind == "row_other" else (row, b, 0, d)
        c = rt.c_function(names[dt])
        nt = rt.threads(3 * out.nbytes)
        c.fn(c.ptr(a), c.ptr(b), c.opt(w), c.opt(bs), c.ptr(out), rows, d, a_rs, b_rs,
             fp32_scalar(eps), nt)  # fmt: skip
        return out

    return add_layer_norm


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    makers = (
        ("add_relu", _add_relu, _act_rule),
        ("add_gelu", _add_gelu, _act_rule),
        ("add_silu", _add_silu, _act_rule),
        ("add_layer_norm", _add_layer_norm, _ln_rule),
    )
    return tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=make(lvl, dts), dtypes=dts, layouts=rt.CONTIGUOUS,
               isa=lvl, priority=rt.priority(lvl), rule=rule)
        for lvl, dts in rt.variants("fused") if cpu.has(lvl)
        for op, make, rule in makers
    )  # fmt: skip
