"""Planned execution: a self-routing graph lowered once per input class, then replayed.

A graph after `refcore.optimize`'s passes calls routing nodes (`RoutedOp`, `FusedOp`, ...): each
call of one computes its call's structure key, looks the decision up, binds the call and records
what ran, 10-20 us of Python per node. A *plan* does that work once: the graph is run once on
the inputs (an fx Interpreter), and every routing node whose decision is known is replaced, in a
copy of the graph, by what the decision said, pre-bound:

* a call torch runs becomes a call of the torch function itself (no refcore code at all);
* a call a kernel runs becomes a `Step`: a guard (the call's structure equals the planned one:
  dtypes, shapes, strides, alignment, attribute values), then the kernel function on the
  arguments bound without checks (`refcore.call.Plan`). A call the guard rejects takes the
  routing node's own path, so a plan is correct for any input; it is only fast for the inputs
  it was made for.

Between steps values stay NumPy arrays. A step returns its kernel's array as it is; a node that
is not a step (torch's calls, the graph's output) reads it through a `ToTorch` node. A tensor a
step reads from a node that is not a step (a graph input, a weight, a torch call) comes through
a `ToNumpy` node, which guards it once for all its readers. An array a step receives was
therefore made by a step or a `ToNumpy` whose guard held: it has the planned structure, and
only a torch tensor (what a step's fallback or a failed `ToNumpy` passes on) is guarded by the
step itself. That keeps the per-node cost of a planned kernel call near the kernel's own.

fx then generates straight-line Python for the planned graph (intermediates freed after their
last use). Plans are kept per *input class* (each input's dtype and dims, above
`refcore.choice.EXACT` rounded up to a power of two, the same classes measured choice uses), so a
decode step whose key length grows by one reuses the plan, and per provider set and CPU level
(`refcore.integration.memo_key`: a provider disabled in a scope is not run from a plan); at most
`MAX_PLANS` are kept.

What ran is recorded once per replay (the plan's outcomes, less the calls a guard sent back to
routing, which record their own), so `refcore.explain` reads as without a plan.

Not planned (yet): output placement in a liveness-planned arena (kernels still take their
outputs from `refcore.buffers`, torch from its allocator).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from refcore import choice, tensors
from refcore.call import _part

#: input classes a graph keeps plans for (a program with ever-changing shapes replans no more)
MAX_PLANS = 16


class Step:
    """A routing node's kernel decision pre-bound for one call structure (see the module doc).

    Its guard compares the structure (`refcore.call.structure_key`'s parts) of the torch tensors
    at ``varying`` positions with the planned call's: in a planned graph the other arguments are
    constants of the generated code, so only those fed by other nodes can change, and an array
    there comes from a step or a `ToNumpy` whose guard held. It returns the kernel's output as
    NumPy (`ToTorch` converts it for readers that are not steps)."""

    __slots__ = ("__name__", "checks", "fallback", "fixed", "fn", "kernel", "missed", "others",
                 "outcome", "reads", "run", "tensors")  # fmt: skip

    def __init__(self, kernel: Any, tensors: tuple[tuple[str, int | str], ...],
                 fixed: dict[str, Any], args: tuple, kwargs: dict[str, Any],
                 fallback: Callable[..., Any], outcome: tuple[str, str]) -> None:  # fmt: skip
        """``tensors``: (argument name, position or keyword in the call) of each tensor the
        kernel reads; ``fixed``: its other arguments (a `refcore.call.Plan`'s, placed in the
        call as the graph spells it); ``args``/``kwargs``: the planned call."""
        self.kernel, self.fallback, self.outcome = kernel, fallback, outcome
        # `Kernel.__call__(call)` is ``kernel.fn(**call.arguments)``: the step binds the arguments
        self.fn, self.tensors, self.fixed = kernel.fn, tensors, fixed
        self.missed = 0  # calls the guard sent back to routing since the last replay's count
        self.__name__ = f"refcore_step_{getattr(kernel, 'name', 'kernel')}"
        self.checks = [*((i, _part(a)) for i, a in enumerate(args)),
                       *((k, _part(v)) for k, v in kwargs.items())]  # fmt: skip
        self._split()

    def only(self, varying: set[int | str]) -> None:
        """Guard only the arguments at these positions (the others are constants)."""
        self.checks = [(src, e) for src, e in self.checks if src in varying]
        self._split()

    def _split(self) -> None:
        # one pass per call: each tensor read with its guard (None: a constant), then the other
        # guarded arguments (sizes a node computes)
        guards = dict(self.checks)
        self.reads = tuple((name, src, guards.get(src)) for name, src in self.tensors)
        read = {src for _, src in self.tensors}
        self.others = tuple((src, e) for src, e in self.checks if src not in read)
        # the planned graph calls ``run`` (a plain function: ~0.3 us per call less than this
        # object's __call__ and a bind method, measured on Zen 3)
        self.run = _guarded(self, self.fn, self._miss)
        self.run.step, self.run.__name__ = self, self.__name__

    def _miss(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        self.missed += 1
        return _fall_back(self.fallback, args, kwargs)

    def expected(self, src: int | str) -> Any:
        """The planned structure of the argument at ``src`` (None when it is not guarded)."""
        return next((e for s, e in self.checks if s == src), None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The kernel function's arguments for this call, or None when the guard rejects it."""
        return _guarded(self, _arguments, lambda a, kw: None)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Step({self.outcome[0]}: {self.outcome[1]})"


def _torch(v: Any) -> Any:
    """``v`` for a reader that is not a step: a step's NumPy output (or tuple of them) as torch."""
    t = type(v)
    if t is np.ndarray:
        return tensors.to_torch(v)
    if t is tuple:
        return tuple(map(_torch, v))
    return v


def _arguments(**kwargs: Any) -> dict[str, Any]:
    return kwargs


def _guarded(step: Step, then: Callable[..., Any],
             miss: Callable[[tuple, dict[str, Any]], Any]) -> Callable[..., Any]:  # fmt: skip
    """A function of the step's call: ``then(**arguments)`` when the guard holds, else
    ``miss(args, kwargs)`` (module doc: an array at a read position is one the plan made).

    Generated as straight-line Python for this step, as fx generates the graph's own code: each
    read is one indexing and one type test, the constant arguments are names bound once, and
    ``then`` gets its keywords directly. The loop it replaces (a dict of the constants copied
    and filled per call, then unpacked) cost 0.9-1.6 us per step on Zen 3; this ~0.3-0.5 us."""
    env: dict[str, Any] = {"__name__": __name__, "ndarray": np.ndarray, "_part": _part,
                           "to_numpy": tensors.to_numpy, "then": then, "miss": miss}  # fmt: skip
    lines, call = [], []

    def at(src: int | str) -> str:
        return f"args[{src}]" if type(src) is int else f"kwargs[{src!r}]"

    for i, (name, src, e) in enumerate(step.reads):
        lines += [f"    v{i} = {at(src)}", f"    if type(v{i}) is not ndarray:"]
        if e is not None:
            env[f"e{i}"] = e
            lines.append(f"        if _part(v{i}) != e{i}: return miss(args, kwargs)")
        lines.append(f"        v{i} = to_numpy(v{i})")
        call.append(f"{name}=v{i}")
    for j, (src, e) in enumerate(step.others):
        env[f"o{j}"] = e
        lines.append(f"    if _part({at(src)}) != o{j}: return miss(args, kwargs)")
    for k, (name, value) in enumerate(step.fixed.items()):
        env[f"c{k}"] = value
        call.append(f"{name}=c{k}")
    source = "\n".join(["def run(*args, **kwargs):", *lines, f"    return then({', '.join(call)})"])
    exec(compile(source, f"<refcore plan step {step.__name__}>", "exec"), env)
    return env["run"]


def _fall_back(node: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run a call a guard rejected on the routing node, which reads torch tensors."""
    return node(*map(_torch, args), **{k: _torch(v) for k, v in kwargs.items()})


class ToTorch:
    """A step's output as the torch tensor(s) a reader that is not a step expects."""

    __name__ = "refcore_to_torch"

    def __call__(self, v: Any) -> Any:
        return _torch(v)


class ToNumpy:
    """A tensor steps read, as NumPy when its structure is the planned one (guarded here once for
    all the steps reading it); as a torch tensor otherwise, which each step then guards."""

    __slots__ = ("__name__", "expected")

    def __init__(self, expected: Any) -> None:
        self.expected = expected
        self.__name__ = "refcore_to_numpy"

    def __call__(self, v: Any) -> Any:
        if type(v) is np.ndarray:
            return tensors.to_torch(v)  # not a tensor this plan made: the steps guard it
        if _part(v) == self.expected:
            return tensors.to_numpy(v)
        return v


class Adapted:
    """A `Step` behind an argument adapter: ``adapt(args, kwargs)`` gives the step's arguments, or
    None when the call is not the planned one (then ``fallback``, the node itself, runs it). A
    prepacked node's plan swaps its weight for the packed one while the weight is unchanged.
    ``keeps`` names the arguments ``adapt`` reads as the graph gives them (the weight, checked by
    identity): the plan does not convert those to arrays."""

    __slots__ = ("__name__", "adapt", "fallback", "keeps", "step")

    def __init__(self, step: Step, adapt: Callable[[tuple, dict], Any],
                 fallback: Callable[..., Any], keeps: frozenset[str]) -> None:  # fmt: skip
        self.step, self.adapt, self.fallback, self.keeps = step, adapt, fallback, keeps
        self.__name__ = step.__name__

    def only(self, varying: set[int | str]) -> None:
        self.step.only(varying)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        got = self.adapt(args, kwargs)
        if got is None:
            self.step.missed += 1
            return _fall_back(self.fallback, args, kwargs)
        return self.step(*got[0], **got[1])


def input_class(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The class plans are kept under: per input, its dtype and dims (rounded as measured choice
    rounds them) for tensors, its type and value otherwise (graph inputs that are sizes are
    rounded too: dynamo passes dynamic dims as ints)."""
    return (tuple(map(_cls, args)), tuple((k, _cls(v)) for k, v in kwargs.items()))


def _cls(v: Any) -> Any:
    shape = getattr(v, "shape", None)
    if shape is not None:
        return (getattr(v, "dtype", None), choice._part(v))
    if type(v) is int:
        return (int, choice.dim_class(v))
    if isinstance(v, (list, tuple)):
        return (type(v), *map(_cls, v))
    return (type(v), v if isinstance(v, (str, bool, type(None))) else repr(v))


class Planned:
    """``gm`` (a graph whose routing nodes route themselves) run through per-class plans."""

    def __init__(self, gm: Any) -> None:
        self.gm = gm
        self.plans: dict[Any, tuple[Any, list[Step], collections.Counter]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        from refcore.integration import memo_key, report

        if torch.is_grad_enabled() and _needs_grad(args, kwargs):
            return self.gm(*args, **kwargs)  # autograd: routing sends every such call to torch
        # decisions depend on the provider set in effect (scoped disables) and the CPU level too
        key = (memo_key(), input_class(args, kwargs))
        got = self.plans.get(key)
        if got is None:
            if len(self.plans) >= MAX_PLANS:
                return self.gm(*args, **kwargs)
            out, got = lower(self.gm, args, kwargs)
            self.plans[key] = got
            return out  # the planning run computed it (and recorded what ran)
        planned, steps, outcomes = got
        out = planned(*args, **kwargs)
        rep = report()
        if rep is not None:
            rep.counts.update(outcomes)
            for s in steps:
                if s.missed:
                    rep.counts[s.outcome] -= s.missed
                    s.missed = 0
        return out


def _needs_grad(args: tuple, kwargs: dict[str, Any]) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


def _positional(gm: Any, args: tuple, kwargs: dict[str, Any]) -> list[Any]:
    """The graph's inputs in placeholder order (keyword inputs by name, else their defaults)."""
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"][len(args) :]
    flat = list(args)
    for node in [n for n in gm.graph.nodes if n.op == "placeholder"][len(args) :]:
        name = node.target.lstrip("*")
        if name in kwargs:
            flat.append(kwargs[name])
        elif node.args:
            flat.append(node.args[0])
        else:
            raise TypeError(f"planned graph: missing input {name!r} (inputs: {names})")
    return flat


def _varying(node: Any) -> set[int | str]:
    """Positions and keywords of ``node``'s arguments that other nodes feed."""
    from torch import fx

    def fed(a: Any) -> bool:
        found: list[Any] = []
        fx.node.map_arg(a, found.append)
        return bool(found)

    return {i for i, a in enumerate(node.args) if fed(a)} | {
        k for k, v in node.kwargs.items() if fed(v)
    }


def lower(gm: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, tuple]:
    """Run ``gm`` once on the inputs, specializing every routing node on the way; return the
    output and (the planned GraphModule, its kernel steps, the outcomes a replay records)."""
    import torch
    from torch import fx

    from refcore.integration import report

    choice.note_setup()
    targets: dict[fx.Node, Any] = {}
    outcomes: collections.Counter = collections.Counter()

    class Recorder(fx.Interpreter):
        def call_function(self, target: Any, a: tuple, kw: dict[str, Any]) -> Any:
            rep = report()
            before = collections.Counter(rep.counts) if rep is not None else None
            out = super().call_function(target, a, kw)
            special = getattr(target, "specialize", None)
            if special is not None:
                # what this call recorded (a fused op torch ran: its chain's calls too)
                records = rep.counts - before if rep is not None else None
                got = special(a, kw, records=records)
                if got is not None:  # one (name, outcome) or a list: what a replay records
                    targets[self._node], outcome = got
                    outcomes.update(outcome if isinstance(outcome, list) else [outcome])
                    if isinstance(got[0], (Step, Adapted)):
                        got[0].only(_varying(self._node))
            return out

        def run_node(self, n: fx.Node) -> Any:
            self._node = n
            return super().run_node(n)

    out = Recorder(gm).run(*_positional(gm, args, kwargs))
    planned = torch.fx.GraphModule(gm, _rewired(gm.graph, targets))
    steps = [getattr(t, "step", t) for t in targets.values() if isinstance(t, (Step, Adapted))]
    return out, (planned, steps, outcomes)


def _rewired(old: Any, targets: dict[Any, Any]) -> Any:
    """A copy of graph ``old`` with each node in ``targets`` calling its target instead, and the
    edges between steps and the other nodes converted (`ToTorch`, `ToNumpy`; module doc)."""
    from torch import fx

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    as_torch: dict[fx.Node, fx.Node] = {}  # a step's node -> its ToTorch node
    as_numpy: dict[fx.Node, fx.Node] = {}  # a node steps read -> its ToNumpy node
    is_step = {n for n, t in targets.items() if isinstance(t, (Step, Adapted))}

    def step_of(node: fx.Node) -> Step:
        t = targets[node]
        return t.step if isinstance(t, Adapted) else t

    def torch_side(n: fx.Node) -> fx.Node:
        if n not in is_step:
            return env[n]
        if n not in as_torch:
            as_torch[n] = graph.call_function(ToTorch(), (env[n],))
        return as_torch[n]

    def read(n: Any, src: int | str, step: Step, keeps: frozenset[str]) -> Any:
        """Argument ``src`` of a step: a node's value as an array, else as for torch."""
        if not isinstance(n, fx.Node) or src in keeps:  # a constant, nodes in a list, kept args
            return fx.node.map_arg(n, torch_side)
        if n in is_step:
            return env[n]
        expected = step.expected(src)
        if expected is None:
            return env[n]
        if n not in as_numpy:
            as_numpy[n] = graph.call_function(ToNumpy(expected), (env[n],))
        return as_numpy[n]

    for node in old.nodes:
        if node in is_step:
            step = step_of(node)  # its readers first: they must precede it in the graph
            keeps = getattr(targets[node], "keeps", frozenset())
            args = tuple(read(a, i, step, keeps) for i, a in enumerate(node.args))
            kwargs = {k: read(v, k, step, keeps) for k, v in node.kwargs.items()}
            new = graph.node_copy(node, lambda n: env[n])
            new.args, new.kwargs = args, kwargs
        else:
            new = graph.node_copy(node, torch_side)
        if node in targets:
            t = targets[node]
            new.target = t.run if isinstance(t, Step) else t
        env[node] = new
    return graph
