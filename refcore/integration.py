"""Route torch calls to refcore kernels: `enable`, `disable`, `enabled`, and the routing report.

The one place refcore hooks into torch, through a ``TorchFunctionMode`` (no patching of torch or
of user objects). Each op spec names the torch function it stands for (``torch.function``, plus
``torch.also`` for methods and operators); while routing is on, a call to one of those functions is
bound to the op's signature, and if the chosen provider has a kernel that accepts it, the kernel
runs; otherwise torch runs it as usual. Every call is recorded with what ran or why torch did,
and `report` (``refcore.explain()``) prints the table.

Calls that need autograd (grad mode on and an input that requires grad) stay on torch, so training
keeps working, unless the op's spec names a gradient op (``backward: ops:``) for every argument
the call needs a gradient of: then the forward is chosen as any call is, and where a kernel runs
it, the backward pass routes each gradient op's call the same way (`_KernelGrad`).

Example:
    >>> import torch, refcore
    >>> with refcore.enabled(provider="reference"):
    ...     y = torch.nn.functional.gelu(torch.ones(4))
    >>> print(refcore.explain())                                 # doctest: +SKIP
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from refcore import choice, cpu
from refcore.call import Call, Plan, Spelling, bind, plan, torch_arguments, torch_spelling
from refcore.call import structure_key as _key
from refcore.dispatch import AUTO, accepting, select
from refcore.packed import PackedWeight
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.spec import OpSpec

_BIND_ERRORS = (TypeError, ValueError, IndexError)

# A routing decision: (kernel, what ran) or (None, why torch runs it), plus the `Plan` that binds
# the next call of the same structure without checking it again (None: bind checks every call).
Decision = tuple[Any, str, "Plan | None"]


# True while measured choice times torch's side of a call: a fused op's composition routes its
# chain's calls, and those timing runs are not calls of the program (reports would count them)
_muted: contextvars.ContextVar[bool] = contextvars.ContextVar("refcore_muted", default=False)


@dataclass
class RoutingReport:
    """What ran for each routed torch call: counts per (function, outcome)."""

    provider: str
    counts: collections.Counter = field(default_factory=collections.Counter)

    def record(self, func: str, outcome: str) -> None:
        if not _muted.get():
            self.counts[(func, outcome)] += 1

    def rows(self) -> list[tuple[str, int, str]]:
        return sorted(((f, n, o) for (f, o), n in self.counts.items()), key=lambda r: (r[0], -r[1]))

    def __str__(self) -> str:
        if not self.counts:
            return f"refcore routing (provider={self.provider}): no routed torch calls recorded"
        rows = [("torch function", "calls", "ran / why torch ran it")]
        rows += [(f, str(n), o) for f, n, o in self.rows()]
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"refcore routing (provider={self.provider}):"]
        lines += [f"  {a:<{w[0]}}  {b:>{w[1]}}  {c}" for a, b, c in rows]
        return "\n".join(lines)


@functools.cache
def _torch_table(ops: frozenset[str] | None) -> dict[Any, tuple[OpSpec, str]]:
    """torch callable -> (op spec, its dotted name), for the ops routed (built once per op set)."""
    reg = default_registry()
    wanted = set(ops) if ops is not None else set(reg.ops)
    unknown = wanted - set(reg.ops)
    if unknown:
        raise ValueError(
            f"enable: unknown ops {sorted(unknown)}; known: {', '.join(sorted(reg.ops))}"
        )
    table: dict[Any, tuple[OpSpec, str]] = {}
    for name in sorted(wanted):
        spec = reg.ops[name]
        for dotted in (spec.torch.function, *spec.torch.also):
            if dotted.startswith("refcore."):
                continue  # an oracle adapter, not something user code calls
            table.setdefault(resolve(dotted), (spec, dotted))
    return table


def _needs_grad(args: Iterable[Any], kwargs: dict[str, Any]) -> bool:
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values()))


class _Router:
    """The TorchFunctionMode body; built once per enable, looked up per torch call.

    The hot path stays lean: the decision for a call (which kernel, or why torch runs it) depends
    only on the call's structure (function, shapes, strides, dtypes, attribute values), so it is
    memoised per provider under that key; a repeated call skips kernel selection, and a call torch
    keeps for a structural reason skips binding too.
    """

    def __init__(self, provider: str, ops: Iterable[str] | None, report: RoutingReport) -> None:
        self.provider = provider
        self.table = _torch_table(frozenset(ops) if ops is not None else None)
        self.report = report
        # the CPU cap and the choice mode as routing starts: reading the environment costs
        # ~1.5 us a variable, on every routed call (the provider set is looked up per call)
        self.level, self.mode = cpu.level(), choice.mode()
        # per (op, provider set): why torch runs every call of an op no provider kernel
        # implements, or None where one does (`_bare`)
        self.bare: dict[tuple[str, int], str | None] = {}

    def handle(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        hit = self.table.get(func)
        if hit is None:
            return func(*args, **kwargs)
        spec, name = hit
        provs = id(installed())
        bare = self.bare.get((spec.name, provs), False)
        if bare is False:
            bare = self.bare[(spec.name, provs)] = _bare(spec.name, self.provider)
        if bare is not None:  # no kernel to choose: torch's call, without keying or binding it
            self.report.record(name, bare)
            return func(*args, **kwargs)
        memo = _decisions(self.provider, self.level, provs, self.mode)
        return route_call(func, spec, name, self.provider, args, kwargs, memo, self.report.record)


def _bare(op: str, provider: str) -> str | None:
    """Why torch runs every call of ``op`` under ``provider`` when no kernel could run one (the
    provider, or under auto every provider but the reference, implements none), else None.

    Such calls skip the routing path (`route_call`: structure key, memo, binding): ~15 us of
    Python a call, and a gap between torch's parallel regions costs a model ~3x its own time
    (AMD Zen 3, ResNet-50 b4 fp32: 25 us of idle Python before each of its 227 torch calls
    added 19.7 ms to a 474 ms forward)."""
    from refcore.dispatch import _candidates

    found = [(p, k) for p, k in _candidates(op, provider)
             if k is None or provider != AUTO or p.name != "reference"]  # fmt: skip
    if found:
        return None
    if provider == AUTO:
        return "torch: no provider kernel"
    return f"torch: implements no kernel for {op}"


def route_call(func: Any, spec: OpSpec, name: str, provider: str, args: tuple,
               kwargs: dict[str, Any], decisions: dict[Any, Decision],
               record: Any, torch_own: Any = None) -> Any:  # fmt: skip
    """Run one call of torch's ``func`` (standing for ``spec``): with ``provider``'s kernel when
    one accepts it, else with ``func``; ``record(name, outcome)`` notes which and why.

    ``torch_own`` (default ``func``) is torch's own call of the same arguments, as a plan runs
    it where torch wins: what a kernel is timed against. A ``func`` that routes inside (a fused
    op's composition, a packed weight's plain call) is not: its routing, tens of microseconds
    of Python paid cache-cold in a measurement, counted against torch (Llama fp32 decode on the
    Intel Xeon AMX: a 1 x 1024 x 1024 GEMM measured ours 581 us vs torch 684 us there, and in
    the decode step ours was the slower).

    The decision depends only on the call's structure (function, shapes, strides, dtypes,
    attribute values), so it is memoised in ``decisions`` under that key: a repeated call skips
    kernel selection and, for ops whose checks read no tensor values, the checks too (`Plan`); a
    call torch keeps for a structural reason skips binding.
    """
    grads: _Grads | None = None
    if _needs_grad(args, kwargs):
        grads = _grads(spec, func, args, kwargs, provider, decisions, record)
        if isinstance(grads, str):
            record(name, f"torch: needs autograd{grads}")
            return func(*args, **kwargs)
    key = _key(func, args, kwargs)
    known = decisions.get(key) if key is not None else None
    if known is None and provider == AUTO:
        largest = _largest(args, kwargs)
        if largest < AUTO_MIN_ELEMENTS:
            why = f"every tensor < {AUTO_MIN_ELEMENTS} elements"
            known = (None, f"torch: small call ({why}; routing costs more than it saves)", None)
            _remember(decisions, key, known)
    if known is not None and known[0] is None:
        record(name, known[1])
        return func(*args, **kwargs)
    if known is not None and known[2] is not None:  # seen before: bind without the checks
        record(name, known[1] + _grad_note(grads))
        call = known[2].bind(args, kwargs)  # reads the tensors where torch's spelling has them
        return _run(known[0], call, grads)
    spelled = torch_spelling(spec, func)  # torch's function, or a method / operator alias
    try:
        call = bind(spec, args, kwargs, spelled)
    except _BIND_ERRORS as e:
        outcome = f"torch: not a refcore {spec.name} call ({_short(e)})"
        if isinstance(e, TypeError):  # structural; value errors (index ranges) are not
            _remember(decisions, key, (None, outcome, None))
        record(name, outcome)
        return func(*args, **kwargs)
    if known is None:
        own = torch_own or func
        known = _choose(call, provider, (args, kwargs, spelled), key,
                        lambda a, kw: own(*a, **kw))  # fmt: skip
        _remember(decisions, key, known)
    kernel, outcome, _ = known
    if kernel is None:
        record(name, outcome)
        return func(*args, **kwargs)
    record(name, outcome + _grad_note(grads))
    return _run(kernel, call, grads)


@dataclass
class _Grads:
    """What the backward of a kernel-run call needs: the op's arguments as given, the ones it
    needs gradients of, and how to route the gradient ops' calls (as its forward was)."""

    spec: OpSpec
    named: dict[str, Any]
    wanted: tuple[str, ...]
    provider: str
    decisions: dict[Any, Decision]
    record: Any


def _grads(spec: OpSpec, func: Any, args: tuple, kwargs: dict[str, Any], provider: str,
           decisions: dict[Any, Decision], record: Any) -> _Grads | str:  # fmt: skip
    """How a call that needs autograd can run a kernel forward, or why torch must run it (the
    text after "needs autograd")."""
    ops = dict(spec.backward.ops) if spec.backward else {}
    if not ops:
        return ""
    try:
        named = torch_arguments(spec, args, kwargs, torch_spelling(spec, func))
    except _BIND_ERRORS:
        return ""  # not a call of the op: torch runs it, and says what is wrong
    wanted = tuple(n for n, v in named.items() if getattr(v, "requires_grad", False))
    missing = [n for n in wanted if n not in ops]
    if missing:
        return f" (no gradient op for {', '.join(missing)})"
    return _Grads(spec, named, wanted, provider, decisions, record)


def _grad_note(grads: _Grads | None) -> str:
    if grads is None:
        return ""
    ops = dict(grads.spec.backward.ops)
    return f" (with autograd: {', '.join(ops[n] for n in grads.wanted)} in backward)"


def _run(kernel: Any, call: Call, grads: _Grads | None) -> Any:
    if grads is None:
        return call.wrap(kernel(call))
    return _grad_function().apply(kernel, call, grads, *(grads.named[n] for n in grads.wanted))


@functools.cache
def _grad_function() -> type:
    """The autograd function of a kernel-run call (one class, built on first use)."""
    import torch

    from refcore.registry import default_registry

    class _KernelGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, kernel: Any, call: Call, grads: _Grads, *wanted: Any) -> Any:
            ctx.grads = grads
            return call.wrap(kernel(call))

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> tuple:
            g: _Grads = ctx.grads
            ops, reg, out = dict(g.spec.backward.ops), default_registry(), []
            for n in g.wanted:
                spec = reg.op(ops[n])
                kw = {"grad_output": grad_output, **g.named}
                out.append(route_call(resolve(spec.torch.function), spec, spec.name, g.provider,
                                      (), kw, g.decisions, g.record))  # fmt: skip
            return (None, None, None, *out)

    return _KernelGrad


def _remember(decisions: dict[Any, Decision], key: Any, decision: Decision) -> None:
    if key is None:
        return
    if len(decisions) > 4096:  # a bound, for programs with ever-changing shapes
        decisions.clear()
    decisions[key] = decision


# provider="auto" leaves calls whose largest tensor is smaller than this on torch: binding and
# converting a call costs ~20-50 us (bench overhead), more than any kernel saves on so few elements
AUTO_MIN_ELEMENTS = 16384


def _largest(args: tuple, kwargs: dict[str, Any]) -> int:
    """Elements of the largest tensor argument, a packed weight's logical size included (a
    decode step's linear has a 1 x K input but an N x K weight)."""
    import torch

    kinds = (torch.Tensor, PackedWeight)
    sizes = [v.numel() if isinstance(v, torch.Tensor) else v.size
             for v in (*args, *kwargs.values()) if isinstance(v, kinds)]  # fmt: skip
    return max(sizes, default=0)


def memo_key() -> tuple[str, int, str]:
    """What a routing decision depends on besides the call: the CPU level (capped), the
    provider set in effect (`installed` gives one object per set, `disabled` scopes included)
    and how kernels are chosen (`refcore.choice.mode`)."""
    return cpu.level(), id(installed()), choice.mode()


@functools.cache
def _decisions(provider: str, level: str, providers: int, mode: str) -> dict[Any, Decision]:
    """The decision memo of one provider at one CPU level with one provider set."""
    return {}


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) < 90 else text[:87] + "..."


def _why_not(why: Any) -> str:
    """Every non-reference kernel's refusal, best-ranked first (one kernel's alone can mislead:
    the small-M linear kernel's "M > 16" hides the GEMM kernel's measured size rule)."""
    reasons = [(c.kernel, c.verdict) for c in why.candidates if c.provider != "reference"]
    reasons = [(k, r) for k, r in reasons if r != "not tried"]
    if len(reasons) == 1:
        return reasons[0][1]
    return "; ".join(f"{k} {r}" for k, r in reasons) if reasons else "no provider kernel"


@functools.cache
def _mode_class() -> type:  # one class: defining it per call cost ~40 us (routing_inside's path)
    from torch.overrides import TorchFunctionMode

    class RefcoreMode(TorchFunctionMode):
        def __init__(self, router: _Router) -> None:
            super().__init__()
            self.router = router

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return self.router.handle(func, args, kwargs or {})

    return RefcoreMode


@dataclass
class _State:
    stack: list[Any] = field(default_factory=list)  # modes entered by enable(), innermost last
    last: RoutingReport | None = None


_state: contextvars.ContextVar[_State | None] = contextvars.ContextVar(
    "refcore_routing", default=None
)


def _get_state() -> _State:
    st = _state.get()
    if st is None:
        st = _State()
        _state.set(st)
    return st


def _check_provider(provider: str, strict: bool) -> None:
    provs = installed()
    if provider == AUTO:
        return
    if provider not in provs:
        raise ValueError(f"enable: unknown provider {provider!r}; known: auto, {', '.join(provs)}")
    av = provs[provider].availability()
    if not av.available:
        msg = f"refcore provider {provider!r} is unavailable ({av.reason}); torch runs every op"
        if strict:
            raise RuntimeError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _make_mode(provider: str, ops: Iterable[str] | None, strict: bool) -> Any:
    _check_provider(provider, strict)
    report = RoutingReport(provider)
    mode = _mode_class()(_Router(provider, ops, report))
    _get_state().last = report
    return mode


def enable(provider: str = AUTO, ops: Iterable[str] | None = None, *, strict: bool = False) -> None:
    """Route torch CPU calls of refcore's ops to ``provider``'s kernels until `disable`.

    ``provider``: ``"auto"`` (the best non-reference provider per call), ``"native"``,
    ``"numba"``, ``"reference"``, or any installed provider. ``ops`` limits routing to these op
    names. An unavailable provider warns and leaves every op on torch; ``strict=True`` raises.
    ``REFCORE_CPU_CAPABILITY`` and ``REFCORE_CHOICE`` are read here, as routing starts.

    Example:
        >>> import refcore
        >>> refcore.enable(provider="auto"); refcore.disable()
    """
    mode = _make_mode(provider, ops, strict)
    mode.__enter__()
    _get_state().stack.append(mode)


def disable() -> None:
    """Undo the innermost `enable` (a no-op when routing is off)."""
    st = _get_state()
    if st.stack:
        st.stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def enabled(provider: str = AUTO, ops: Iterable[str] | None = None, *,
            strict: bool = False) -> Iterator[RoutingReport]:  # fmt: skip
    """`enable` for the duration of a ``with`` block; yields the block's routing report."""
    mode = _make_mode(provider, ops, strict)
    with mode:
        yield mode.router.report


def report() -> RoutingReport | None:
    """The routing report of the most recent `enable`/`enabled` in this context."""
    return _get_state().last


@contextlib.contextmanager
def reporting(provider: str) -> Iterator[RoutingReport]:
    """A fresh routing report for a graph whose nodes route themselves (`RoutedOp`, `FusedOp`):
    what they record goes there, and `report` returns it; no torch function mode is entered."""
    rep = RoutingReport(provider)
    _get_state().last = rep
    yield rep


@contextlib.contextmanager
def routing_inside(provider: str) -> Iterator[None]:
    """Route the torch calls of a fallback composition (a fused op torch runs as its chain),
    recording into the current report; a no-op when a routing mode is already active."""
    import torch

    if torch.overrides._len_torch_function_stack() > 0:
        yield
        return
    rep = _get_state().last or RoutingReport(provider)
    with _mode_class()(_Router(provider, None, rep)):
        yield


def explain_model(
    model: Any, *args: Any, provider: str | None = None, **kwargs: Any
) -> RoutingReport:
    """Run ``model(*args, **kwargs)`` with routing on and return what ran for each torch call."""
    import torch

    if not callable(model):
        raise TypeError(
            f"explain: expected an op name, a module or a callable; got {type(model).__name__}"
        )
    if getattr(model, "routes_itself", False):  # an optimized module: its own routing report
        with torch.no_grad():
            model(*args, **kwargs)
        return report()
    chosen = provider or (report().provider if report() else AUTO)
    with enabled(chosen) as rep, torch.no_grad():
        model(*args, **kwargs)
    return rep


def _record(func: str, outcome: str) -> None:
    rep = _get_state().last
    if rep is not None:
        rep.record(func, outcome)


class FusedOp:
    """A graph node's target for a fused op: the provider's kernel when one accepts the call,
    else torch's own composition (the op's oracle), e.g. when autograd is needed.

    Like the router (`route_call`), it memoises its decision per call structure, so a repeated
    call binds and runs without ranking kernels again.
    """

    def __init__(self, op: str, provider: str = AUTO) -> None:
        self.op, self.provider = op, provider
        self.__name__ = f"refcore_{op}"  # torch.fx names the node's global after this
        self.__module__ = __name__
        self.decisions: dict[Any, dict[Any, Decision]] = {}  # per `memo_key`

    def __call__(self, **kwargs: Any) -> Any:
        spec = default_registry().op(self.op)
        memo = self.decisions.setdefault(memo_key(), {})
        return route_call(self.composition, spec, f"fused {self.op}", self.provider, (), kwargs,
                          memo, _record, self.torch_chain)  # fmt: skip

    def specialize(self, args: tuple, kwargs: dict[str, Any], records: Any = None) -> Any:
        """What a plan runs for a call shaped like this one (`refcore.plan`). Where torch ran it,
        its composition routed the chain's calls; ``records`` (what this call recorded) says
        whether torch ran every one of them too: then the plan calls the composition's torch
        functions directly, and records the same; otherwise this node keeps routing."""
        memo = self.decisions.get(memo_key(), {})
        got = _specialize(memo, self.composition, None, self, f"fused {self.op}", args, kwargs)
        if got is not None or not records or args:
            return got
        if not all(outcome.startswith("torch") for _, outcome in records):
            return None
        from refcore.derive import torch_call

        fn = torch_call(self.op)

        def direct(**kw: Any) -> Any:
            return fn(kw)

        direct.__name__ = f"refcore_torch_{self.op}"
        return direct, [rec for rec, n in records.items() for _ in range(n)]

    def torch_chain(self, **kwargs: Any) -> Any:
        """The chain's torch calls, none routed: torch's own call of the fused op."""
        from refcore.derive import torch_call

        return torch_call(self.op)(kwargs)

    def composition(self, **kwargs: Any) -> Any:
        """What torch runs instead: the chain the fused op stands for, its calls routed."""
        from refcore.testing import call_torch

        spec = default_registry().op(self.op)
        with routing_inside(self.provider):
            return call_torch(spec, resolve(spec.torch.function), kwargs)

    def __repr__(self) -> str:
        return f"FusedOp({self.op!r}, provider={self.provider!r})"


class RoutedOp:
    """A graph node's target standing for a call of torch's ``func`` (a function some op spec
    stands for): `route_call` with the memo of ``provider``, so a graph of such nodes routes
    without a torch function mode (which costs ~1 us on every torch call, routed or not).
    ``spec``: the op whose torch side ``func`` is where no torch function stands for it (an
    adapter in refcore.oracles, e.g. gather_scatter's, which a fusion's match becomes; the
    report names the op)."""

    def __init__(self, func: Any, provider: str = AUTO, spec: OpSpec | None = None) -> None:

        self.func, self.provider = func, provider
        self.spec, self.name = (spec, spec.name) if spec is not None else _torch_table(None)[func]
        self.__name__ = f"refcore_routed_{self.spec.name}"
        self.__module__ = __name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return route_call(self.func, self.spec, self.name, self.provider, args, kwargs,
                          _decisions(self.provider, *memo_key()), _record)  # fmt: skip

    def specialize(self, args: tuple, kwargs: dict[str, Any], records: Any = None) -> Any:
        """What a plan runs for a call shaped like this one (`refcore.plan`)."""
        memo = _decisions(self.provider, *memo_key())
        return _specialize(memo, self.func, self.func, self, self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"RoutedOp({self.name}, provider={self.provider!r})"


def _specialize(
    decisions: dict[Any, Decision],
    func: Any,
    torch_fn: Any,
    node: Any,
    name: str,
    args: tuple,
    kwargs: dict[str, Any],
) -> tuple[Any, tuple[str, str]] | None:
    """(what a plan calls instead of ``node``, the outcome it records) for the call
    ``func(*args, **kwargs)`` that ``node`` just routed: ``torch_fn`` itself where the decision
    was torch, a guarded `refcore.plan.Step` where a kernel ran; None where nothing is memoised
    (or ``torch_fn`` is None), so the node keeps routing."""
    from refcore.plan import Step

    if _needs_grad(args, kwargs):
        return None
    key = _key(func, args, kwargs)
    known = decisions.get(key) if key is not None else None
    if known is None:
        return None
    kernel, outcome, p = known
    if kernel is None:
        return None if torch_fn is None else (torch_fn, (name, outcome))
    if p is None:
        return None
    # the plan reads the tensors where the call, as the graph spells it, has them
    return Step(kernel, p.tensors, p.fixed, args, kwargs, node, (name, outcome)), (name, outcome)


def routable(func: Any) -> bool:
    """True when ``func`` is a torch function some op spec stands for."""
    try:
        return func in _torch_table(None)
    except TypeError:  # unhashable targets
        return False


def _choose(call: Call, provider: str, given: tuple[tuple, dict[str, Any], Spelling], key: Any,
            torch_fn: Any) -> Decision:  # fmt: skip
    """The decision for ``call``: (kernel, what ran) or (None, why torch runs it), and a `Plan`
    to bind the next call of this structure (``key``) without its checks.

    A kernel runs instead of torch only where it is at least torch's speed here: correctness
    fallbacks never do, and among the kernels that accept the call `refcore.choice` picks by
    measurement (``torch_fn(args, kwargs)`` runs torch's own call; with a plan, both sides
    read a `choice.Rotation` of the arguments' copies in turn). The explanation of every
    candidate is built only when no kernel accepts the call (its reason is recorded). ``given``
    is the call as made (args, kwargs, their `Spelling`), which the plan reads."""
    found, passed = accepting(call, provider)
    if not found:
        why = passed[0] if passed else _why_not(select(call, provider)[1])
        return (None, f"torch: {why}", None)
    args, kwargs, spelled = given
    p = plan(call, args, kwargs, spelled) if key is not None else None
    if provider == "reference":  # asked for the meaning itself: no speed choice
        pick, outcome = found[0], f"reference/{found[0][1].name}"
    else:
        rot = _rotation(call, p, args, kwargs)
        rotating = rot is not None and rot.rotates

        def routed(kernel: Any) -> Any:
            def run() -> Any:
                a, kw = rot.current if rotating else (args, kwargs)
                bound = p.bind(a, kw) if p is not None else call
                return bound.wrap(kernel(bound))

            return run

        def torch_call() -> Any:
            token = _muted.set(True)
            try:
                return torch_fn(*rot.current) if rotating else torch_fn(args, kwargs)
            finally:
                _muted.reset(token)

        evict = rot.advance if rotating else None
        pick, outcome = choice.choose(call, found, torch_call, routed, evict)
    return (None, outcome, None) if pick is None else (pick[1], outcome, p)


def _rotation(call: Call, p: Any, args: tuple, kwargs: dict[str, Any]) -> choice.Rotation | None:
    """The copies measured choice times ``call`` on, or None: without a plan the kernel's side
    binds ``call`` itself, and an op tagged ``torch_prepacks`` keeps its tensors (its torch side
    caches a prepacked weight per tensor)."""
    if p is None or choice.mode() != "measure" or "torch_prepacks" in call.op.tags:
        return None
    return choice.Rotation(args, kwargs)
