"""The Provider / Kernel interface and provider discovery.

A provider is a named set of kernels, found through the entry-point group ``refcore.providers``
(the entry point names a zero-argument factory returning a `Provider`). The ``reference`` provider
is built in and always available: the NumPy references are a backend like any other.

Providers load lazily, once. One that fails to import, or says it cannot run here, shows as
unavailable with its reason; it never makes ``import refcore`` fail.

Example:
    >>> import numpy as np
    >>> k = Kernel(op="relu", name="np_relu", fn=lambda input: np.maximum(input, 0),
    ...            dtypes=frozenset({"float32"}))
    >>> p = Provider(name="toy", kernels=(k,))
    >>> p.availability().available
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from refcore import cpu
from refcore.call import Call
from refcore.packed import PackedWeight, unpack

ENTRY_POINT_GROUP = "refcore.providers"


@dataclass(frozen=True)
class Verdict:
    """A kernel's answer to `Kernel.supports`: truthy when it can run the call, else a reason."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Verdict(True)


def no(reason: str) -> Verdict:
    return Verdict(False, reason)


@dataclass(frozen=True)
class Kernel:
    """One implementation of one op.

    ``fn`` receives the call's arguments by name, as NumPy arrays (bf16 as ml_dtypes.bfloat16) and
    canonical attributes, and returns a NumPy array. ``layouts`` lists the tensor layouts it reads
    (``strided`` means any strides and alignments; the others, ``contiguous`` and
    ``channels_last``, are aligned: an ``unaligned`` array reaches only ``strided`` kernels; see
    `refcore.call.Call.layout`) and the packed weight layouts (specs/layouts.yaml) it reads: a
    `refcore.PackedWeight` argument reaches only kernels that name its layout. ``isa`` is the ISA
    level it needs (`refcore.cpu.LEVELS`); ``rule`` is an optional extra check (shapes, attribute
    values) returning a `Verdict`. ``fallback`` marks a correctness fallback (e.g. portable C):
    `refcore.run` may run it, routing never runs it where torch can run the call.
    """

    op: str
    name: str
    fn: Callable[..., Any]
    dtypes: frozenset[str]
    layouts: frozenset[str] = frozenset({"strided"})
    isa: str = "portable"
    priority: int = 0
    rule: Callable[[Call], Verdict] | None = None
    fallback: bool = False

    def supports(self, call: Call) -> Verdict:
        """Say whether this kernel runs ``call``; a refusal carries the reason."""
        if call.dtype not in self.dtypes:
            return no(f"dtype {call.dtype} not in {sorted(self.dtypes)}")
        if not cpu.has(self.isa):
            return no(f"needs ISA level {self.isa}, CPU offers {cpu.level()}")
        for name, arr in call.tensors():
            lay = call.layout(name)
            if isinstance(arr, PackedWeight):  # any-strides kernels read no packed layout
                if lay not in self.layouts:
                    return no(f"{name} is packed as {lay}; reads {sorted(self.layouts)}")
            elif "strided" in self.layouts or lay in self.layouts:
                continue
            elif lay == "unaligned":  # even one element: C reads it as a typed pointer
                at = f"data at {arr.ctypes.data:#x}, strides {arr.strides}, {arr.dtype} items"
                return no(f"{name} is unaligned ({at}); needs {sorted(self.layouts)}")
            elif arr.size > 1:
                return no(f"{name} is {lay} (strides {arr.strides}); needs {sorted(self.layouts)}")
        return self.rule(call) if self.rule else YES

    def __call__(self, call: Call) -> Any:
        return self.fn(**call.arguments)


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str
    ops: tuple[str, ...] = ()

    def __str__(self) -> str:
        state = "available" if self.available else "unavailable"
        ops = ", ".join(self.ops) if self.ops else "none yet"
        return f"{state}: {self.reason}; implements: {ops}"


@dataclass(frozen=True)
class Provider:
    """A named set of kernels. ``probe`` (optional) returns ``(available, reason)`` lazily."""

    name: str
    kernels: Sequence[Kernel] = ()
    priority: int = 0
    probe: Callable[[], tuple[bool, str]] | None = None
    description: str = ""
    #: ahead-of-time work (``python -m refcore build``): ``build(force)`` compiles what the
    #: provider compiles on first use and says what it built; raises RuntimeError on failure
    build: Callable[[bool], str] | None = None
    #: a sanitized run of its kernel tests (``python -m refcore sanitize``): ``sanitize()`` returns
    #: the environment variables such a process needs and the pytest selections to run (each a
    #: tuple of arguments; paths from the project root, globs allowed); raises RuntimeError when
    #: this machine cannot (no sanitizer runtime)
    sanitize: Callable[[], tuple[dict[str, str], tuple[tuple[str, ...], ...]]] | None = None
    _state: dict = field(default_factory=dict, compare=False, repr=False)

    def availability(self) -> Availability:
        got = self._state.get("availability")
        if got is None:  # probe once: it may import numba or look for a compiler
            ok, reason = self.probe() if self.probe else (True, "ready")
            got = Availability(ok, reason, tuple(sorted({k.op for k in self.kernels})))
            self._state["availability"] = got
        return got

    def kernels_for(self, op: str) -> tuple[Kernel, ...]:
        """``op``'s kernels, best first (computed once per op: dispatch asks on every call)."""
        ranked = self._state.setdefault("ranked", {})
        got = ranked.get(op)
        if got is None:
            got = ranked[op] = tuple(
                sorted((k for k in self.kernels if k.op == op), key=lambda k: (-k.priority, k.name))
            )
        return got


def _reference_kernels() -> tuple[Kernel, ...]:
    """One per op, and one per optimizer (its step: `refcore.optim`), whose dtypes are the
    masters it updates."""
    from refcore.ops.optim import in_place
    from refcore.registry import default_registry, resolve

    reg = default_registry()
    ops = tuple(
        Kernel(op=s.name, name="reference", fn=_unpacking(resolve(s.reference)),
               dtypes=frozenset(s.dtypes), layouts=_layouts_of(reg, s.name))
        for s in reg.ops.values()
    )  # fmt: skip
    steps = tuple(
        Kernel(op=o.name, name="reference", fn=in_place(resolve(o.reference)),
               dtypes=frozenset(o.masters))
        for o in reg.optimizers.values()
    )  # fmt: skip
    return ops + steps


def _layouts_of(reg: Any, op: str) -> frozenset[str]:
    """Any strides, plus every packed layout one of ``op``'s arguments may come in."""
    packed = (
        lay.name for lay in reg.layouts.values() if any(a.startswith(op + ".") for a in lay.args)
    )
    return frozenset({"strided", *packed})


def _unpacking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The reference reads plain arrays: `PackedWeight` arguments are unpacked first."""

    def reference(**kwargs: Any) -> Any:
        return fn(**{k: unpack(v) for k, v in kwargs.items()})

    reference.__wrapped__ = fn  # type: ignore[attr-defined]
    return reference


@functools.cache
def reference_provider() -> Provider:
    """The NumPy references as a provider: always available, lowest priority (one object)."""
    return Provider(
        name="reference",
        kernels=_reference_kernels(),
        priority=-(10**6),
        description="NumPy references (the meaning of every op)",
    )


def _unavailable(name: str, reason: str) -> Provider:
    return Provider(name=name, probe=lambda: (False, reason))


def discover() -> dict[str, Provider]:
    """Built-in ``reference`` plus every entry point in group ``refcore.providers``."""
    found = {"reference": reference_provider()}
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in found:
            found[f"{ep.name}@{ep.value}"] = _unavailable(
                ep.name, f"name {ep.name!r} already taken; {ep.value} ignored"
            )
            continue
        try:
            prov = ep.load()()
        except Exception as e:  # a broken plugin must not break refcore: report it instead
            found[ep.name] = _unavailable(ep.name, f"failed to load {ep.value}: {e!r}")
            continue
        if not isinstance(prov, Provider) or prov.name != ep.name:
            found[ep.name] = _unavailable(
                ep.name, f"{ep.value} did not return a Provider named {ep.name!r}"
            )
            continue
        found[ep.name] = prov
    return found


@functools.cache
def _discovered() -> dict[str, Provider]:
    return discover()


_override: contextvars.ContextVar[dict[str, Provider] | None] = contextvars.ContextVar(
    "refcore_providers", default=None
)
_disabled: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "refcore_disabled_providers", default=frozenset()
)


def installed() -> dict[str, Provider]:
    """Providers in effect in this context (discovered, or those set by `using_providers`).

    The same provider set gives the same dict object, also under `disabled`: routing and `run`
    key their memos by it, so a decision made with a provider on is never reused with it off.
    """
    provs = _override.get() or _discovered()
    off = _disabled.get()
    if not off:
        return provs
    key = (id(provs), off)
    view = _views.get(key)
    if view is None or view[0] is not provs:
        if len(_views) > 64:  # a bound, for programs that build many provider sets
            _views.clear()
        view = _views[key] = (provs, {
            n: (_unavailable(n, "disabled in this scope") if n in off else p)
            for n, p in provs.items()
        })  # fmt: skip
    return view[1]


# installed()'s views under `disabled`: (id of the full set, names off) -> (full set, view)
_views: dict[tuple[int, frozenset[str]], tuple[dict[str, Provider], dict[str, Provider]]] = {}


@contextlib.contextmanager
def using_providers(*providers: Provider, keep_reference: bool = True) -> Iterator[None]:
    """Replace the provider set within a scope (for tests and experiments)."""
    provs = {p.name: p for p in providers}
    if keep_reference and "reference" not in provs:
        provs["reference"] = reference_provider()  # not discovery: that loads every plugin
    token = _override.set(provs)
    try:
        yield
    finally:
        _override.reset(token)


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Turn providers off within a scope; they show as unavailable ("disabled in this scope")."""
    if "reference" in names:
        raise ValueError(
            "the reference provider cannot be disabled: it is the fallback of last resort"
        )
    token = _disabled.set(_disabled.get() | frozenset(names))
    try:
        yield
    finally:
        _disabled.reset(token)


def exact_sums(op: str, fn: Callable[..., Any], mode_arg: str = "mode",
               extremes: tuple[str, ...] = ("max",)) -> Callable[..., Any]:  # fmt: skip
    """``fn`` (a provider's kernel function for ``op``) whose non-finite sum / mean results take
    the reference's float64 result (calls whose ``mode_arg`` is one of ``extremes``, a max or
    min, are exact in any order and keep theirs).

    An fp32 sum of huge values overflows to +-inf, or meets +inf and -inf (NaN), where the exact
    sum or mean is finite or one infinity, depending on the order (found by refcore.fuzz: a
    bag mean of values ~1e38 gave -inf, the reference -7.8e37). Finite sums of finite values
    never give a non-finite output, so finite calls pay one check of the output.
    """

    from refcore import tensors

    def run(**kwargs: Any) -> Any:
        out = fn(**kwargs)
        if kwargs.get(mode_arg) not in extremes and not tensors.all_finite(out):
            from refcore.registry import default_registry, resolve

            out[...] = resolve(default_registry().op(op).reference)(**kwargs)
        return out

    run.__name__ = getattr(fn, "__name__", op)
    return run
