"""The graph pass pipeline as data: one ordered table, read by `refcore.optimize` and by the
``torch.compile`` backend (`refcore.compile_backend`), so both run the same passes in the same
order on the graph kinds they share.

Graph kinds:

- ``fx``: a torch.fx trace of a module (parameters are ``get_attr`` nodes; `refcore.optimize`);
- ``dynamo``: a graph dynamo captured (parameters are graph inputs; ``backend="refcore"``);
- ``frozen``: a dynamo graph whose parameters were made graph constants (`refcore.optimize`
  capturing a model fx cannot trace), so the passes that rewrite parameters apply.

Each pass returns a `PassResult` (what it changed, what it left and why); `run` returns them in
order, and the optimized module's ``notes`` are their lines.

Example:
    >>> [p.name for p in PIPELINE if "dynamo" in p.kinds]
    ['drop_dropout', 'canonicalize', 'attention', 'fuse', 'route', 'plan']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from refcore.dispatch import AUTO
from refcore.passes import PassResult, mark_statements
from refcore.provider import installed

KINDS = ("fx", "dynamo", "frozen")


@dataclass(frozen=True)
class Pass:
    """One row of the table: ``run(gm, provider)`` rewrites ``gm`` in place and reports."""

    name: str
    run: Callable[[Any, str], PassResult]
    kinds: frozenset[str]
    doc: str


def _nodes(gm: Any, test: Callable[[Any], bool]) -> int:
    return sum(1 for n in gm.graph.nodes if test(n))


def _functionalize(gm: Any, provider: str) -> PassResult:
    from refcore.passes.functional import functionalize

    before = _nodes(gm, lambda n: n.op == "call_module")
    functionalize(gm)
    left = {type(gm.get_submodule(n.target)).__name__
            for n in gm.graph.nodes if n.op == "call_module"}  # fmt: skip
    changed = before - _nodes(gm, lambda n: n.op == "call_module")
    did = (f"functionalize: {changed} module call(s) -> torch functions",) if changed else ()
    why = f"functionalize: calls of {', '.join(sorted(left))} left (no function form known)"
    return PassResult("functionalize", changed, did, (why,) if left else ())


def _drop_dropout(gm: Any, provider: str) -> PassResult:
    from refcore.passes.dropout import drop_dropout

    before = len(gm.graph.nodes)
    drop_dropout(gm)
    removed = before - len(gm.graph.nodes)
    return PassResult("drop_dropout", removed,
                      (f"drop_dropout: {removed} nodes removed",) if removed else ())  # fmt: skip


def _fold_bn(gm: Any, provider: str) -> PassResult:
    from refcore.passes.fold_bn import fold_bn

    return fold_bn(gm)


def _int8(gm: Any, provider: str) -> PassResult:
    from refcore.passes.pt2e import pt2e_int8

    return pt2e_int8(gm)


def _fold_constants(gm: Any, provider: str) -> PassResult:
    from refcore.passes.fold_constants import fold_constants

    return fold_constants(gm)


def _fold_affine(gm: Any, provider: str) -> PassResult:
    from refcore.passes.fold_bn import fold_affine

    return fold_affine(gm)


def _channels_last(gm: Any, provider: str) -> PassResult:
    from refcore.passes.channels_last import channels_last_graph

    n = channels_last_graph(gm)
    did = ("channels_last: conv2d weights of the graph in NHWC",) if n else ()
    return PassResult("channels_last", n, did)


def _canonicalize(gm: Any, provider: str) -> PassResult:
    from refcore.passes.canonical import canonicalize

    return canonicalize(gm)


def _attention(gm: Any, provider: str) -> PassResult:
    import torch

    from refcore.passes.fuse import fuse_attention

    target = torch.nn.functional.scaled_dot_product_attention

    def sdpa(n: Any) -> bool:
        return n.op == "call_function" and n.target is target

    before = _nodes(gm, sdpa)
    fuse_attention(gm)
    gm.__dict__.pop("refcore_attention", None)  # the result says it (attention.py still sets it)
    n = _nodes(gm, sdpa) - before
    did = (f"attention: {n} matmul-softmax-matmul pattern(s) -> scaled_dot_product_attention",)
    return PassResult("attention", n, did if n else ())


def _fuse(gm: Any, provider: str) -> PassResult:
    from refcore.integration import FusedOp
    from refcore.passes.fuse import fuse

    notes: list[str] = []
    before = _nodes(gm, lambda n: isinstance(n.target, FusedOp))
    fuse(gm, provider, implemented(provider), notes)
    n = _nodes(gm, lambda n: isinstance(n.target, FusedOp)) - before
    left = tuple(x for x in notes if "left unfused" in x)
    return PassResult("fuse", n, tuple(x for x in notes if x not in left), left)


def _prepack(gm: Any, provider: str) -> PassResult:
    from refcore.passes.prepack import PrepackedOp, prepack

    notes: list[str] = []
    prepack(gm, provider, notes)
    n = _nodes(gm, lambda n: isinstance(n.target, PrepackedOp))
    left = tuple(x for x in notes if "left plain" in x)
    return PassResult("prepack", n, tuple(x for x in notes if x not in left), left)


def _route(gm: Any, provider: str) -> PassResult:
    from refcore.passes.route import route

    return route(gm, provider)


def _plan(gm: Any, provider: str) -> PassResult:
    """Mark a graph whose calls route themselves for planned execution (`refcore.plan`): the
    module running it (`refcore.optimize`'s, the compile backend's) replays per-input-class plans
    of it. A graph still calling submodules routes under a torch function mode instead."""
    if any(n.op == "call_module" for n in gm.graph.nodes):
        why = "plan: not planned (the graph calls submodules, whose calls route under a mode)"
        return PassResult("plan", 0, (), (why,), applied=False)
    return PassResult("plan", 1, ("plan: lowered once per input class, then replayed",))


def _kinds(*names: str) -> frozenset[str]:
    return frozenset(names)


ALL, WITH_PARAMETERS = _kinds(*KINDS), _kinds("fx", "frozen")

#: The passes, in the order they run. Dynamo graphs take parameters as inputs, so the passes that
#: read or rewrite parameters run on fx and frozen graphs only.
PIPELINE: tuple[Pass, ...] = (
    Pass("functionalize", _functionalize, _kinds("fx"), "nn.Linear/Conv2d/... calls -> F.* calls"),
    Pass("drop_dropout", _drop_dropout, ALL, "inference dropouts -> identity"),
    Pass("fold_bn", _fold_bn, WITH_PARAMETERS, "batch-norm folded into the conv2d/linear before"),
    Pass("int8", _int8, WITH_PARAMETERS, "torchao pt2e int8 linears -> qlinear (before folding)"),
    Pass("fold_constants", _fold_constants, WITH_PARAMETERS, "parameter-only subgraphs, once"),
    Pass(
        "fold_affine",
        _fold_affine,
        WITH_PARAMETERS,
        "constant per-channel x * s + t (FrozenBatchNorm2d) folded into the conv2d before",
    ),
    Pass("channels_last", _channels_last, WITH_PARAMETERS, "conv2d weights in NHWC"),
    Pass("canonicalize", _canonicalize, ALL, "in-place results threaded, sizes as values"),
    Pass("attention", _attention, ALL, "softmax(q @ k^T * s + mask) @ v -> SDPA"),
    Pass("fuse", _fuse, ALL, "the patterns of specs/fusions.yaml -> fused ops"),
    Pass("prepack", _prepack, WITH_PARAMETERS, "constant linear weights packed once"),
    Pass("route", _route, ALL, "every remaining spec'd torch call routes itself"),
    Pass("plan", _plan, ALL, "the routed graph runs per-input-class plans (last)"),
)


def names(kind: str | None = None) -> tuple[str, ...]:
    """The pass names, in order; with ``kind``, those that apply to that graph kind."""
    return tuple(p.name for p in PIPELINE if kind is None or kind in p.kinds)


def check(selected: Iterable[str], who: str = "optimize") -> None:
    """Raise `ValueError` naming the passes in ``selected`` the table does not have."""
    unknown = set(selected) - set(names())
    if unknown:
        raise ValueError(f"{who}: unknown passes {sorted(unknown)}; known: {names()}")


def run(gm: Any, kind: str, provider: str = AUTO,
        selected: Sequence[str] | None = None) -> tuple[PassResult, ...]:  # fmt: skip
    """Run the passes of the table that apply to ``kind`` (and are in ``selected``, if given) on
    ``gm``, in the table's order; return what each did."""
    if kind not in KINDS:
        raise ValueError(f"pipeline: graph kind {kind!r}; expected one of {KINDS}")
    if selected is not None:
        check(selected, "pipeline")
    chosen = [p for p in PIPELINE if kind in p.kinds and (selected is None or p.name in selected)]
    mark_statements(gm)  # the passes' dead-code elimination keeps them
    return tuple(p.run(gm, provider) for p in chosen)


def notes(results: Iterable[PassResult]) -> list[str]:
    """The lines of ``results``, in order."""
    return [line for r in results for line in r.notes]


def routes_itself(results: Iterable[PassResult]) -> bool:
    """True when the route pass made every spec'd call of the graph a self-routing node."""
    return any(r.name == "route" and r.applied for r in results)


def planned(results: Iterable[PassResult]) -> bool:
    """True when the graph routes itself and the plan pass ran on it: run it through
    `refcore.plan.Planned`."""
    results = tuple(results)
    return routes_itself(results) and any(r.name == "plan" and r.applied for r in results)


def implemented(provider: str) -> set[str]:
    """Ops with a kernel routing may run here: one this CPU (and the cap) allows that is no
    correctness fallback. A chain fused into an op without one would run as its composition, at
    a cost per call over the plain chain (measured on Zen 3: ResNet-50's conv chains, whose only
    native kernels there are portable C, made optimize ~5% slower than routing the chain)."""
    from refcore import cpu

    provs = installed()
    chosen = [provs[provider]] if provider != AUTO else [
        p for n, p in provs.items() if n != "reference"
    ]  # fmt: skip
    return {k.op for p in chosen if p.availability().available for k in p.kernels
            if not k.fallback and cpu.has(k.isa)}  # fmt: skip
