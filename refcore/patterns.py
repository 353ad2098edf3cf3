"""DAG patterns over torch.fx graphs (in the manner of tinygrad's ``UPat``), declared as data.

A pattern (`refcore.spec.Pat`, parsed from ``specs/fusions.yaml``) is a tree of node patterns:
an op name (a spec'd op, matched by its torch function, its aliases and, where it mutates a
matched intermediate, its in-place forms; or one of `refcore.spec.GRAPH_OPS`), sub-patterns for
its arguments, and named captures. A capture seen twice must bind the same value twice, so a
tree describes a DAG (``x * rsqrt(mean(x ** 2))`` reads ``x`` twice). ``add``/``mul`` match in
either argument order; an ``optional`` node (a cast) may be absent. A full match must also keep
every matched intermediate to itself (its users all inside the match, except declared
``outputs``) and pass the fusion's ``where`` conditions, evaluated on the captures with what the
graph knows (dynamo's example values, fx ShapeProp's ``tensor_meta``, a module's attributes).

`match` returns a `Match` or, when there is none, the reason of the failure that got furthest,
so a pass can say why a pattern was left (nothing silent).

Example:
    >>> import torch
    >>> from refcore.registry import default_registry
    >>> gm = torch.fx.symbolic_trace(lambda x, y: torch.relu(x + y))
    >>> add_relu = default_registry().fusions["add_relu"]
    >>> root = [n for n in gm.graph.nodes if n.op == "call_function"][-1]
    >>> m, why = match(add_relu, root, gm)
    >>> sorted(m.captures)
    ['input', 'other']
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from refcore.call import Spelling, spelling
from refcore.registry import default_registry, resolve
from refcore.spec import COMMUTATIVE, GRAPH_OPS, INPLACE, FusionSpec, Pat


class Unknown(Exception):
    """A `where` condition needs a fact (a dtype, a shape) the graph does not record."""


@dataclass
class Match:
    """A match: its root node, the captures (name -> graph node or constant), the matched op
    nodes (root first)."""

    root: fx.Node
    captures: dict[str, Any]
    nodes: list[fx.Node]


@dataclass(frozen=True)
class _Op:
    """How graph nodes spell one op: targets, method names, and how each names its arguments
    (`refcore.call.Spelling`: torch's function in the spec's ``torch:`` order, every other
    target in the signature's)."""

    functions: frozenset
    methods: frozenset
    inplace_functions: frozenset
    inplace_methods: frozenset
    main: Any  # the callable spelled as ``main_spelling``; every other target as ``spelling``
    main_spelling: Spelling
    spelling: Spelling
    custom: str | None = None  # a spec'd op's torch custom op, "refcore::<op>" (refcore.library)

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        return dict(self.spelling.defaults)


@functools.cache
def op_calls(name: str) -> _Op:
    reg = default_registry()
    fns, methods, positional, implied = GRAPH_OPS.get(name, ((), (), (), {}))
    ifns, imethods = INPLACE.get(name, ((), ()))
    if name in reg.ops:
        spec = reg.ops[name]
        t = spec.torch
        names = (t.function, *t.also, *fns)
        methods = {
            *methods,
            *(d.rsplit(".", 1)[1] for d in t.also if d.startswith("torch.Tensor.")),
        }
        return _Op(frozenset(map(resolve, names)), frozenset(methods),
                   frozenset(map(resolve, ifns)), frozenset(imethods), resolve(t.function),
                   spelling(spec, "torch"), spelling(spec, "alias"),
                   f"refcore::{name}")  # fmt: skip
    graph = _graph_spelling(name, positional, tuple(implied.items()))
    return _Op(frozenset(map(resolve, fns)), frozenset(methods), frozenset(map(resolve, ifns)),
               frozenset(imethods), None, graph, graph)  # fmt: skip


def _graph_spelling(name: str, positional: tuple[str, ...], implied: tuple = ()) -> Spelling:
    """A graph op without a spec (`refcore.spec.GRAPH_OPS`): its positional names, any keyword,
    the values a method implies as defaults."""
    shown = f"{name}({', '.join(positional)}, ...)"
    return Spelling(name, f"{name}()", shown, positional, None, defaults=implied)


def plays(op: _Op, node: fx.Node) -> str | None:
    """'plain' or 'inplace' if ``node`` is a call of ``op``, else None."""
    if node.op == "call_function":
        if node.target in op.functions:
            return "plain"
        if op.custom is not None and _schema_name(node.target) == op.custom:
            return "plain"  # torch.ops.refcore.<op> (a quantized layer's node under dynamo)
        return "inplace" if node.target in op.inplace_functions else None
    if node.op == "call_method":
        if node.target in op.methods:
            return "plain"
        return "inplace" if node.target in op.inplace_methods else None
    return None


def _schema_name(target: Any) -> str | None:
    """A torch op's qualified name ("refcore::qconv2d"; an overload's or its packet's), else
    None."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return None


# casts whose method names their arguments its own way: x.type_as(other) casts to other's dtype,
# x.float() to float32
_METHOD_ARGS = {
    "type_as": _graph_spelling("type_as", ("input", "other")),
    "float": _graph_spelling("float", ("input",), (("dtype", torch.float32),)),
}


def named_args(name: str, node: fx.Node) -> dict[str, Any] | str:
    """The node's arguments named as the op names them (defaults included), or the reason they
    do not fit."""
    op = op_calls(name)
    if node.op == "call_method" and node.target in _METHOD_ARGS:
        spelled = _METHOD_ARGS[node.target]
    else:
        spelled = op.main_spelling if node.target is op.main else op.spelling
    try:
        named = spelled.arguments(node.args, node.kwargs)
    except (TypeError, ValueError) as e:
        return f"{node.name}: {e}"
    if node.op == "call_method" and node.target == "type_as":
        named["dtype"] = named.pop("other")
    return named


@dataclass(frozen=True)
class _State:
    caps: tuple[tuple[str, Any], ...] = ()
    nodes: tuple[fx.Node, ...] = ()

    def get(self, name: str) -> Any:
        for k, v in self.caps:
            if k == name:
                return v
        raise KeyError(name)

    def bind(self, name: str | None, value: Any) -> _State | None:
        if name is None:
            return self
        try:
            old = self.get(name)
        except KeyError:
            return _State((*self.caps, (name, value)), self.nodes)
        return self if old is value or (_const(old) and _const(value) and old == value) else None


def _const(v: Any) -> bool:
    return not isinstance(v, fx.Node)


class _Matcher:
    """One match attempt; ``fails`` collects (progress, reason) so the furthest can be told."""

    def __init__(self) -> None:
        self.fails: list[tuple[int, str]] = []

    def fail(self, st: _State, why: str) -> None:
        self.fails.append((len(st.nodes), why))

    def value(self, p: Any, v: Any, st: _State) -> Iterator[_State]:
        if isinstance(p, tuple):
            if not isinstance(v, (list, tuple)) or len(v) != len(p):
                self.fail(st, f"{_show(v)} is not a sequence of {len(p)}")
                return
            yield from self.seq(list(zip(p, v)), st)
        elif not isinstance(p, Pat):
            if _const(v) and _equal(v, p):
                yield st
            else:
                self.fail(st, f"{_show(v)} is not {p!r}")
        elif not p.ops:
            s = st.bind(p.name, v)
            if s is None:
                self.fail(st, f"${p.name} would be both {_show(st.get(p.name))} and {_show(v)}")
            else:
                yield s
        else:
            yield from self.node(p, v, st)
            if p.optional:  # absent: its input's pattern stands here
                s: _State | None = st
                for k, default in p.absent:
                    s = s.bind(k, default) if s is not None else None
                if s is not None:
                    for s2 in self.value(dict(p.args)["input"], v, s):
                        s3 = s2.bind(p.name, v)
                        if s3 is not None:
                            yield s3

    def seq(self, pairs: list[tuple[Any, Any]], st: _State) -> Iterator[_State]:
        if not pairs:
            yield st
            return
        (p, v), rest = pairs[0], pairs[1:]
        for s in self.value(p, v, st):
            yield from self.seq(rest, s)

    def node(self, p: Pat, v: Any, st: _State) -> Iterator[_State]:
        if not isinstance(v, fx.Node) or v.op not in ("call_function", "call_method"):
            self.fail(st, f"{_show(v)} is not a call of {'/'.join(p.ops)}")
            return
        if v in st.nodes:
            self.fail(st, f"{v.name} would match twice")
            return
        for name in p.ops:
            kind = plays(op_calls(name), v)
            if kind is None:
                continue
            named = named_args(name, v)
            if isinstance(named, str):
                self.fail(st, named)
                continue
            yield from self.args(p, name, kind, v, named, st)
            return
        self.fail(st, f"{v.name} ({_target(v)}) is not {'/'.join(p.ops)}")

    def args(self, p: Pat, name: str, kind: str, v: fx.Node, named: dict, st: _State):
        op, pats = op_calls(name), dict(p.args)
        for k, val in named.items():
            if k not in pats and not p.open and not (k in op.defaults and
                                                     _equal(val, op.defaults[k])):  # fmt: skip
                self.fail(st, f"{v.name}: {name}'s {k}={_show(val)}, which the pattern leaves out")
                return
        missing = [k for k in pats if k not in named and k not in op.defaults]
        if missing:
            self.fail(st, f"{v.name}: {name} without {missing}")
            return
        values = {k: named.get(k, op.defaults.get(k)) for k in pats}
        orders = [values]
        swap = name in COMMUTATIVE and not p.ordered and kind == "plain"
        if swap and {"input", "other"} <= set(pats):
            orders.append({**values, "input": values["other"], "other": values["input"]})
        st = _State(st.caps, (*st.nodes, v))
        for vals in orders:
            for s in self.seq([(pats[k], vals[k]) for k in pats], st):
                if kind == "inplace" and vals.get("input") not in s.nodes:
                    self.fail(s, f"{v.name}: in-place {name} of a value from outside the match")
                    continue
                s2 = s.bind(p.name, v)
                if s2 is not None:
                    yield s2


def match(fusion: FusionSpec, node: fx.Node, gm: fx.GraphModule | None = None
          ) -> tuple[Match | None, str]:  # fmt: skip
    """Match ``fusion``'s pattern rooted at ``node``: (the match, "") or (None, the reason)."""
    m = _Matcher()
    furthest = ""
    for st in m.value(fusion.pattern, node, _State()):
        caps = dict(st.caps)
        why = _contained(st, fusion, caps) or _where(fusion, caps, gm)
        if not why:
            return Match(node, caps, list(st.nodes)), ""
        m.fail(_State(st.caps, (*st.nodes, node)), why)
    if m.fails:
        furthest = max(enumerate(m.fails), key=lambda f: (f[1][0], -f[0]))[1][1]
    return None, furthest or "no match"


def _contained(st: _State, fusion: FusionSpec, caps: dict[str, Any]) -> str:
    """Why the match may not replace its nodes: an intermediate used outside it, or captured."""
    outputs = {caps[o] for o in fusion.outputs if o in caps}
    inside = set(st.nodes)
    for n in st.nodes[1:]:
        if n not in outputs and set(n.users) - inside:
            others = ", ".join(u.name for u in n.users if u not in inside)
            return f"{n.name} is also used outside the match (by {others})"
    for k, v in caps.items():
        if isinstance(v, fx.Node) and v in inside and v is not st.nodes[0] and v not in outputs:
            if not any(isinstance(p, Pat) and p.name == k and p.ops for p in _pats(fusion)):
                return f"${k} captures {v.name}, an intermediate of the match"
    return ""


def _pats(fusion: FusionSpec) -> Iterator[Pat]:
    stack: list[Any] = [fusion.pattern]
    while stack:
        p = stack.pop()
        if isinstance(p, tuple):
            stack.extend(p)
        elif isinstance(p, Pat):
            yield p
            stack.extend(v for _, v in p.args)


# ---- where conditions: Python expressions over the captures and these helpers only


def _meta(x: Any, gm: fx.GraphModule | None) -> Any:
    """What the graph knows of ``x``: a tensor (or FakeTensor / TensorMetadata), or None."""
    if not isinstance(x, fx.Node):
        return x if isinstance(x, torch.Tensor) else None
    val = x.meta.get("example_value", x.meta.get("val"))
    if val is not None:
        return val
    if x.meta.get("tensor_meta") is not None:
        return x.meta["tensor_meta"]
    if x.op == "get_attr" and gm is not None:
        try:
            return gm.get_parameter(x.target)
        except AttributeError:
            try:
                return gm.get_buffer(x.target)
            except AttributeError:
                return None
    return None


def _helpers(gm: fx.GraphModule | None) -> dict[str, Any]:
    def tensor(x: Any) -> Any:
        t = _meta(x, gm)
        if t is None or not hasattr(t, "dtype") or not hasattr(t, "shape"):
            raise Unknown(f"{_show(x)} is not known to be a tensor (no shapes recorded)")
        return t

    def shape(x: Any) -> tuple[Any, ...]:
        dims: list[Any] = []
        for i, d in enumerate(tensor(x).shape):
            if not isinstance(d, int):
                d = d.node.maybe_as_int() if hasattr(d, "node") else None
            dims.append(int(d) if d is not None else _Dynamic(f"dim {i} of {_show(x)}"))
        return tuple(dims)

    def as_dtype(x: Any) -> Any:
        if isinstance(x, torch.dtype):
            return x
        if isinstance(x, fx.Node) and x.target is getattr and x.args[1:] == ("dtype",):
            return tensor(x.args[0]).dtype  # fx's ``x.dtype``
        return tensor(x).dtype

    def same_dim(x: Any, i: int, y: Any, j: int) -> bool:
        """Whether dim i of x and dim j of y are known equal (equal ints, or one symbol)."""
        a, b = tensor(x).shape[i], tensor(y).shape[j]
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(a == b))

    def known_tensor(x: Any) -> bool:
        t = _meta(x, gm)
        return t is not None and hasattr(t, "dtype") and hasattr(t, "shape")

    return {
        "dtype": lambda x: tensor(x).dtype, "ndim": lambda x: len(tensor(x).shape),
        "shape": shape, "as_dtype": as_dtype, "known_tensor": known_tensor, "same_dim": same_dim,
        "is_node": lambda x: isinstance(x, fx.Node),
        "is_attr": lambda x: isinstance(x, fx.Node) and x.op == "get_attr",
        "is_number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
        "sorted": sorted, "len": len, "list": list, "tuple": tuple,
        "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
        "float64": torch.float64, "int64": torch.int64,
    }  # fmt: skip


class _Dynamic:
    """A dynamic dim: any use of its value is a fact the graph does not record."""

    def __init__(self, what: str) -> None:
        self.what = what

    def _unknown(self, *_: Any) -> Any:
        raise Unknown(f"{self.what} is dynamic")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __int__ = __index__ = _unknown
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __hash__ = _unknown


@functools.cache
def _compiled(expr: str) -> Any:
    return compile(expr, f"<where {expr}>", "eval")


def evaluate(expr: str, captures: dict[str, Any], gm: fx.GraphModule | None = None) -> Any:
    """Evaluate a pattern expression (a ``where`` condition or an ``args`` value); `Unknown`
    when it needs a fact the graph does not record."""
    env = {**_helpers(gm), **captures}
    return eval(_compiled(expr), {"__builtins__": {}}, env)  # spec data, no builtins


def _where(fusion: FusionSpec, caps: dict[str, Any], gm: fx.GraphModule | None) -> str:
    for cond in fusion.where:
        try:
            ok = evaluate(cond, caps, gm)
        except Unknown as e:
            return f"where {cond!r}: unknown, {e}"
        if not ok:
            return f"where {cond!r} is false"
    return ""


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    try:
        return (type(a) is type(b) and a == b) or (
            isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b
            and not isinstance(a, bool) and not isinstance(b, bool))  # fmt: skip
    except Exception:  # e.g. a tensor compared with a number
        return False


def _target(n: fx.Node) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _show(v: Any) -> str:
    return v.name if isinstance(v, fx.Node) else repr(v)
