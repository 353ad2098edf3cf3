"""Draw op inputs from the ``samples`` and ``errors`` sections of a spec.

A sample case declares ``dims`` (symbol -> int, ``[lo, hi]`` inclusive, or an expression over
earlier symbols) and one generator per argument. The closed vocabulary of generators:

==============================  ==============================================================
``{tensor: [shape], ...}``      a tensor; keys: ``dtype`` (``T`` = the op dtype, default, or a
                                dtype name), ``values`` (below), ``optional`` (may be None),
                                ``layout`` (false: keep contiguous whatever the case layout)
``{shape: [dims]}``             a tuple of ints (e.g. ``normalized_shape``)
``{int: [lo, hi]}``             an int in the inclusive range (bounds may be expressions)
``{float: [lo, hi]}``           a float in the range
``{choice: [a, b, ...]}``       one of the literals
``{value: x}``                  the literal ``x`` (an expression when it is a string in ``$(..)``)
==============================  ==============================================================

Tensor ``values``: ``normal`` (default; ``{normal: scale}``), ``{uniform: [lo, hi]}``,
``positive`` (uniform in [0.5, 2]), ``{index: high}`` / ``{index: [low, high]}`` (ints in
[low, high)), ``{offsets: total}`` (non-decreasing ints from 0, each <= total, along the last
axis), ``{crow: total}`` (like offsets, and the last equals total: CSR row pointers),
``bool_rows`` (bools with at least one True along the last axis), ``{boxes: [N, W, H]}``
(roi_align's (K, 5) rows: a batch index in [0, N), x1 <= x2 and y1 <= y2 up to 20% outside a
W x H image), ``special`` (normal values mixed with 0, +-inf, nan, huge, tiny;
``{special: [v, ...]}`` mixes in the listed values instead),
``{literal: [v, ...]}`` (exactly these values, row-major; for error cases), ``{choice: [v, ...]}``
(each value one of the listed).

Expressions are integer arithmetic over dim symbols and earlier attribute values
(``+ - * // % min max``, list literals and subscripts, e.g. ``"[A, B][dim]"``).

Example:
    >>> from refcore.registry import default_registry
    >>> s = draw_sample(default_registry().op("relu"), "float32", RandomDraw(0))
    >>> s.args["input"].dtype
    dtype('float32')
"""

from __future__ import annotations

import ast
import functools
import operator
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from refcore import tensors
from refcore.spec import BenchSpec, ErrorCase, OpSpec, SampleCase


class Draw(Protocol):
    """Source of choices: `RandomDraw` for plain use, a hypothesis-backed one in tests."""

    def integer(self, lo: int, hi: int) -> int: ...

    def choice(self, options: Sequence[Any]) -> Any: ...


class RandomDraw:
    """A `Draw` backed by ``random.Random(seed)``."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._r.randint(lo, hi)

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self._r.randrange(len(options))]


@dataclass(frozen=True)
class Sample:
    """Drawn arguments (NumPy arrays and attributes) for one call."""

    args: dict[str, Any]
    dtype: str
    layout: str
    case: int

    def torch_args(self, keep_layout: bool = False) -> dict[str, Any]:
        """The same arguments as torch tensors (copies; contiguous unless ``keep_layout``, which
        keeps each array's memory order, e.g. channels-last)."""
        order = "K" if keep_layout else "C"
        return {k: tensors.to_torch(v.copy(order=order)) if isinstance(v, np.ndarray) else v
                for k, v in self.args.items()}  # fmt: skip


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}  # fmt: skip


def evaluate(expr: Any, env: Mapping[str, Any]) -> Any:
    """Evaluate an int, a symbol, or an arithmetic expression string over ``env``."""
    if not isinstance(expr, str):
        return expr
    return _eval(_parse(expr), env, expr)


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.AST:
    """The parsed expression (specs repeat a few hundred; parsing dominated drawing dims)."""
    return ast.parse(expr, mode="eval").body


def _eval(node: ast.AST, env: Mapping[str, Any], src: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ValueError(f"expression {src!r}: unknown symbol {node.id!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env, src), _eval(node.right, env, src))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env, src)
    if isinstance(node, ast.List):
        return [_eval(e, env, src) for e in node.elts]
    if isinstance(node, ast.Subscript):
        return _eval(node.value, env, src)[_eval(node.slice, env, src)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
    ):
        fn = min if node.func.id == "min" else max
        return fn(*(_eval(a, env, src) for a in node.args))
    raise ValueError(f"expression {src!r}: unsupported syntax {ast.dump(node)[:40]}")


def _dims(case_dims: Sequence[tuple[str, Any]], draw: Draw) -> dict[str, int]:
    env: dict[str, int] = {}
    for name, rule in case_dims:
        if isinstance(rule, list):
            lo, hi = (int(evaluate(b, env)) for b in rule)
            env[name] = draw.integer(lo, max(lo, hi))
        else:
            env[name] = int(evaluate(rule, env))
    return env


def _values(
    gen: Any, shape: tuple[int, ...], dtype: str, rng: np.random.Generator, env
) -> np.ndarray:
    kind, param = (gen, None) if isinstance(gen, str) else next(iter(gen.items()))
    if kind == "normal":
        return rng.standard_normal(shape) * (param or 1.0)
    if kind == "uniform":
        lo, hi = (float(evaluate(p, env)) for p in param)
        return rng.uniform(lo, hi, shape)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if kind == "index":
        lo, hi = (0, param) if not isinstance(param, list) else param
        lo, hi = int(evaluate(lo, env)), int(evaluate(hi, env))
        return rng.integers(lo, max(lo + 1, hi), shape)
    if kind in ("offsets", "crow"):  # along the last axis: one offsets row per leading index
        total = int(evaluate(param, env))
        if not shape or shape[-1] == 0:
            return np.zeros(shape, np.int64)
        pts = np.sort(rng.integers(0, total + 1, shape), axis=-1)
        pts[..., 0] = 0
        if kind == "crow":
            pts[..., -1] = total
        return pts
    if kind == "lengths":  # non-negative segment lengths summing to the total
        total = int(evaluate(param, env))
        if not shape or shape[-1] == 0:
            return np.zeros(shape, np.int64)
        cuts = np.sort(rng.integers(0, total + 1, (*shape[:-1], shape[-1] - 1)), axis=-1)
        ends = np.full((*shape[:-1], 1), total)
        return np.diff(np.concatenate([np.zeros_like(ends), cuts, ends], axis=-1), axis=-1)
    if kind == "boxes":  # roi_align's (K, 5) rows: batch index, x1 <= x2, y1 <= y2
        batch, width, height = (int(evaluate(p, env)) for p in param)
        boxes = np.empty(shape)
        if boxes.size:
            boxes[:, 0] = rng.integers(0, max(batch, 1), shape[0])
            for col, extent in ((1, width), (2, height)):
                ends = np.sort(rng.uniform(-0.2 * extent, 1.2 * extent, (shape[0], 2)), axis=1)
                boxes[:, col], boxes[:, col + 2] = ends[:, 0], ends[:, 1]
        return boxes
    if kind == "bool_rows":
        mask = rng.random(shape) < 0.7
        if mask.size:
            idx = rng.integers(0, shape[-1], shape[:-1])
            np.put_along_axis(mask, idx[..., None], True, axis=-1)
        return mask
    if kind == "literal":
        return np.asarray(param, dtype=np.float64).reshape(shape)
    if kind == "choice":
        return rng.choice(np.asarray(param, dtype=np.float64), shape)
    if kind == "special":
        x = rng.standard_normal(shape)
        pool = np.array(
            param if param else [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-30]
        )
        hit = rng.random(shape) < 0.2
        x[hit] = rng.choice(pool, int(hit.sum()))
        return x
    raise ValueError(f"unknown tensor value generator {kind!r}")


def _tensor(spec: Mapping[str, Any], dtype: str, draw: Draw, env, rng) -> np.ndarray:
    shape = tuple(int(evaluate(d, env)) for d in spec["tensor"])
    dt = spec.get("dtype", "T")
    dt = dtype if dt == "T" else dt
    default = "normal" if dt in ("float32", "bfloat16", "float64", "float16") else {"index": 2}
    vals = _values(spec.get("values", default), shape, dt, rng, env)
    return tensors.round_to(vals, dt) if dt != "bool" else vals.astype(bool)


def _apply_layout(a: np.ndarray, layout: str) -> np.ndarray:
    if a.ndim == 0 or a.size == 0 or layout == "contiguous":
        return a
    if layout == "strided":
        big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        view = big[..., 1::2]
        view[...] = a
        return view
    if layout == "transposed" and a.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if layout == "channels_last" and a.ndim == 4:
        return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if layout == "unaligned":  # one byte past an aligned address (1-byte items stay aligned)
        raw = np.zeros(a.nbytes + 1, np.uint8)
        view = raw[1:].view(a.dtype).reshape(a.shape)
        view[...] = a
        return view
    return a


def _draw_args(items, dtype: str, draw: Draw, env: dict[str, Any], layout: str) -> dict[str, Any]:
    rng = np.random.default_rng(draw.integer(0, 2**32 - 1))
    out: dict[str, Any] = {}
    for name, gen in items:
        if not isinstance(gen, dict):
            raise ValueError(f"argument {name!r}: generator must be a mapping, got {gen!r}")
        if gen.get("optional") and draw.integer(0, 1) == 0:
            out[name] = None
            continue
        if "tensor" in gen:
            a = _tensor(gen, dtype, draw, env, rng)
            out[name] = _apply_layout(a, layout) if gen.get("layout", True) else a
            continue
        if "shape" in gen:
            val: Any = tuple(int(evaluate(d, env)) for d in gen["shape"])
        elif "int" in gen:
            rule = gen["int"]
            if isinstance(rule, list):
                val = draw.integer(*(int(evaluate(b, env)) for b in rule))
            else:
                val = int(evaluate(rule, env))
        elif "float" in gen:
            lo, hi = gen["float"]
            val = lo + (hi - lo) * draw.integer(0, 1000) / 1000
        elif "choice" in gen:
            val = draw.choice(gen["choice"])
        elif "value" in gen:
            v = gen["value"]
            val = evaluate(v[2:-1], env) if isinstance(v, str) and v.startswith("$(") else v
        else:
            raise ValueError(f"argument {name!r}: unknown generator {sorted(gen)}")
        out[name] = val
        env[name] = val
    return out


def cases(
    op: OpSpec, dtype: str, tier: str = "small", oracle: bool = False
) -> list[tuple[int, SampleCase]]:
    """The sample cases of ``op`` usable for ``dtype`` in ``tier``; with ``oracle``, only those
    on which torch is an oracle for ``dtype`` (see `SampleCase.no_oracle`)."""
    return [
        (i, c) for i, c in enumerate(op.samples)
        if c.tier == tier and (c.dtypes is None or dtype in c.dtypes)
        and not (oracle and dtype in c.no_oracle)
    ]  # fmt: skip


def draw_sample(
    op: OpSpec, dtype: str, draw: Draw, tier: str = "small", oracle: bool = False
) -> Sample:
    """Draw one valid call of ``op`` with compute dtype ``dtype`` (``oracle``: see `cases`)."""
    usable = cases(op, dtype, tier, oracle)
    if not usable:
        raise ValueError(f"{op.name}: no {tier} sample case for dtype {dtype}")
    index, _ = usable[draw.integer(0, len(usable) - 1)]
    return draw_case(op, index, dtype, draw)


def draw_case(
    op: OpSpec, index: int, dtype: str, draw: Draw, dims: Mapping[str, Any] | None = None
) -> Sample:
    """Draw one call from sample case ``index`` of ``op``; ``dims`` replaces the rules of some
    dimension symbols: a value (e.g. 0, outside the declared range, for `refcore.fuzz`) or a
    ``[lo, hi]`` range (bounds may be expressions)."""
    case = op.samples[index]
    pinned = dims or {}
    rules = tuple((name, pinned.get(name, rule)) for name, rule in case.dims)
    env: dict[str, Any] = dict(_dims(rules, draw))
    layout = draw.choice(case.layouts)
    args = _draw_args(case.args, dtype, draw, env, layout)
    return Sample(args=args, dtype=dtype, layout=layout, case=index)


def draw_bench(op: OpSpec, bench: BenchSpec, dtype: str, seed: int = 0) -> Sample:
    """The inputs of a benchmark shape: its sample case with the dims fixed, in its layout."""
    case = op.samples[bench.case]
    fixed = dict(bench.dims)
    dims = tuple((name, fixed.get(name, rule)) for name, rule in case.dims)
    overrides = dict(bench.args)
    args = tuple((name, overrides.get(name, gen)) for name, gen in case.args)
    draw = RandomDraw(seed)
    env: dict[str, Any] = dict(_dims(dims, draw))
    drawn = _draw_args(args, dtype, draw, env, bench.layout)
    return Sample(drawn, dtype, bench.layout, bench.case)


def error_args(case: ErrorCase) -> dict[str, Any]:
    """The (fixed) arguments of an error case."""
    return _draw_args(case.args, case.dtype, RandomDraw(0), {}, "contiguous")
