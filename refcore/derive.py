"""A fused op's meaning, derived from its pattern in ``specs/fusions.yaml``: one declaration.

The pattern's tree, read bottom-up with the fused op's arguments in place of its captures, is a
composition of spec'd ops. Composing their references gives the fused op's reference
(`reference`), composing their torch functions its torch oracle (`oracle`), and composing their
checks, with zero-stride stand-ins of each intermediate's shape, its check (`check`), which reads
shapes only, as every check must. Optional nodes (casts) are left out of the composition.

Precision policy: ``round: each`` (the default) is exactly the unfused composition, every
intermediate rounded to the input dtype as torch rounds it between unfused ops. ``round: once``
computes the composition on fp32 copies of the floating inputs and rounds the result once to the
input dtype, as a fused kernel keeping its intermediates in fp32 does.

`refcore.ops.fused` and `refcore.oracles` hand these out under the op's name, so the specs'
``refcore.ops.fused:<op>`` and ``refcore.oracles:<op>`` resolve to them.

Example:
    >>> import numpy as np
    >>> reference("add_relu")(np.float32([-2.0, 1.0]), np.float32([1.0, 1.0]))
    array([0., 2.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from refcore.call import spelling
from refcore.registry import default_registry, resolve
from refcore.spec import FusionSpec, OpSpec, Pat


class Derived:
    """A fused op's reference, check or oracle; resolved on first call (the registry that
    declares it may still be loading when this object is made)."""

    def __init__(self, kind: str, op: str) -> None:
        self.kind, self.op = kind, op
        self.__name__ = op if kind != "check" else f"check_{op}"
        self.__qualname__ = self.__name__
        self.__doc__ = f"The {kind} of fused op {op!r}, derived from its pattern."

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec, fusion = _fused(self.op)
        named = spelling(spec).arguments(args, kwargs)
        if self.kind == "reference":
            return _reference(spec, fusion, named)
        if self.kind == "check":
            return _check(spec, fusion, named)
        return _oracle(spec, fusion, named)

    @property
    def __signature__(self) -> inspect.Signature:
        """The op's schema as a Python signature (as a hand-written reference would have)."""
        P = inspect.Parameter
        params = [
            P(a.name, P.KEYWORD_ONLY if a.kwarg_only else P.POSITIONAL_OR_KEYWORD,
              default=a.default if a.has_default else P.empty)
            for a in default_registry().op(self.op).signature.args
        ]  # fmt: skip
        return inspect.Signature(params)

    def __repr__(self) -> str:
        return f"<derived {self.__name__}>"


def lookup(name: str, kind: str) -> Derived:
    """``refcore.ops.fused.<name>`` / ``refcore.oracles.<name>``: the derived function, or
    AttributeError when ``name`` is no fused op (e.g. a tool probing the module for a hook).

    While a registry loads (it resolves these very names to validate the specs) the function is
    handed out unchecked; it looks its op up on first call.
    """
    from refcore.registry import LOADING

    op = name.removeprefix("check_") if kind == "reference" else name
    kind = "check" if kind == "reference" and name.startswith("check_") else kind
    if name.startswith("_") or (
        not LOADING.get() and "fused" not in getattr(default_registry().ops.get(op), "tags", ())
    ):
        raise AttributeError(f"{name!r} is not a fused op's derived {kind}")
    return Derived(kind, op)


def reference(op: str) -> Derived:
    """The NumPy reference of fused op ``op``: its pattern's references composed."""
    return Derived("reference", op)


def check(op: str) -> Derived:
    """The check of fused op ``op``: its pattern's checks composed (shapes only)."""
    return Derived("check", op)


def oracle(op: str) -> Derived:
    """The torch oracle of fused op ``op``: its pattern's torch functions composed."""
    return Derived("oracle", op)


_resolved = functools.cache(resolve)  # once per component function, not per call


@functools.cache
def _fused(op: str) -> tuple[OpSpec, FusionSpec]:
    reg = default_registry()
    spec = reg.op(op)
    for f in reg.fusions.values():
        if f.op == op and f.rewrite is None:
            return spec, f
    raise ValueError(f"{op}: no pattern in specs/fusions.yaml becomes this op")


def _compose(p: Any, named: dict[str, Any], call: Callable[[str, dict], Any]) -> Any:
    """Evaluate pattern ``p`` bottom-up: captures from ``named``, op nodes through ``call``."""
    if isinstance(p, tuple):
        return [_compose(x, named, call) for x in p]
    if not isinstance(p, Pat):
        return p
    if not p.ops:
        return named[p.name]
    if p.optional:
        return _compose(dict(p.args)["input"], named, call)
    kwargs = {k: _compose(v, named, call) for k, v in p.args}
    return call(p.ops[0], kwargs)


@contextlib.contextmanager
def _named(fused: str) -> Iterator[None]:
    """Re-raise a component's validation error with the fused op's name in front."""
    try:
        yield
    except (ValueError, TypeError, IndexError) as e:
        raise type(e)(f"{fused}: {e}") from None


@functools.cache
def torch_call(op: str) -> Callable[[dict[str, Any]], Any]:
    """torch's own call of ``op`` on named arguments, as `refcore.testing.call_torch` makes it,
    for the calls a plan replays where torch runs an op (`refcore.integration.FusedOp`,
    `refcore.passes.prepack.PrepackedOp`). A fused op's derived oracle is built once into
    closures over its pattern: each component's torch function with its positional order
    fixed. The interpreted `oracle` read the pattern, the registry and every component's
    signature on each call, under a warnings filter per component: in a tiny Llama's decode
    (the linear_silu chain torch runs, 2 calls a step), 8% of the step's profile."""
    reg = default_registry()
    spec = reg.op(op)
    fn = resolve(spec.torch.function)
    if not (isinstance(fn, Derived) and fn.kind == "oracle"):
        from refcore.testing import call_torch

        return lambda named: call_torch(spec, fn, named)
    _, fusion = _fused(op)
    pattern = _torch_node(fusion.pattern)
    defaults = {a.name: a.default for a in spec.signature.args if a.has_default}

    def body(named: dict[str, Any]) -> Any:  # arguments as given: defaults filled, as bound
        return pattern({**defaults, **named})

    if fusion.round != "once":
        return body

    def once(named: dict[str, Any]) -> Any:  # as _oracle: fp32 copies in, one rounding out
        import torch

        out_dtype = next((v.dtype for v in named.values() if isinstance(v, torch.Tensor)), None)
        named = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                 for k, v in named.items()}  # fmt: skip
        return body(named).to(out_dtype)

    return once


def _torch_node(p: Any) -> Callable[[dict[str, Any]], Any]:
    """Pattern ``p`` as a closure of the named arguments (`_compose`'s reading, built once)."""
    if isinstance(p, tuple):
        items = [_torch_node(x) for x in p]
        return lambda named: [f(named) for f in items]
    if not isinstance(p, Pat):
        return lambda named: p
    if not p.ops:
        return lambda named: named[p.name]
    if p.optional:
        return _torch_node(dict(p.args)["input"])
    o = default_registry().op(p.ops[0])
    fn = _resolved(o.torch.function)
    args = {k: _torch_node(v) for k, v in p.args}
    # call_torch's order: positional arguments up to the last one given, defaults between
    positional = [a for a in o.signature.args if not a.kwarg_only]
    last = max((i for i, a in enumerate(positional) if a.name in args), default=-1)
    pos = [args.get(a.name, lambda named, d=a.default: d) for a in positional[: last + 1]]
    kw = {a.name: args[a.name] for a in o.signature.args if a.kwarg_only and a.name in args}
    if any(a.name == "padding" for a in o.signature.args):  # as call_torch: a note, not a result
        from refcore.testing import call_torch

        return lambda named: call_torch(o, fn, {k: f(named) for k, f in args.items()})
    return lambda named: fn(*[f(named) for f in pos], **{k: f(named) for k, f in kw.items()})


def _reference(spec: OpSpec, fusion: FusionSpec, named: dict[str, Any]) -> np.ndarray:
    from refcore.tensors import round_to

    reg = default_registry()
    out_dtype = next((v.dtype for v in named.values() if isinstance(v, np.ndarray)), None)
    if fusion.round == "once":
        named = {k: _f32(v) for k, v in named.items()}
    with _named(spec.name):
        out = _compose(fusion.pattern, named,
                       lambda op, kw: _resolved(reg.op(op).reference)(**kw))  # fmt: skip
    return round_to(out, out_dtype) if fusion.round == "once" else out


def _f32(v: Any) -> Any:
    if isinstance(v, np.ndarray) and (v.dtype.kind == "f" or v.dtype.name == "bfloat16"):
        return v.astype(np.float32)
    return v


def _check(spec: OpSpec, fusion: FusionSpec, named: dict[str, Any]) -> None:
    reg = default_registry()
    dtype = next((v.dtype for v in named.values() if isinstance(v, np.ndarray)), np.float32)

    def call(op: str, kw: dict) -> np.ndarray:
        spec = reg.op(op)
        _resolved(spec.check)(**kw)
        first = next((v.dtype for v in kw.values() if isinstance(v, np.ndarray)), dtype)
        if spec.out_dtype != "T":  # named by an argument (quantize_per_tensor's dtype)
            out = np.dtype(spec.output_dtype("", kw))
        elif "quantized" in spec.tags:  # int8 in, float32 out (qlinear, qconv2d)
            out = np.dtype(np.float32)
        else:
            out = first
        return np.broadcast_to(np.zeros((), out), _shape(spec, kw))

    with _named(spec.name):
        _compose(fusion.pattern, named, call)


def _shape(op: OpSpec, kw: dict[str, Any]) -> tuple[int, ...]:
    """The output shape of a valid call of ``op`` (for a later component's check)."""
    if op.name in ("linear", "qlinear"):
        return (*kw["input"].shape[:-1], kw["weight"].shape[0])
    if op.name in ("conv2d", "qconv2d"):
        from refcore.ops import conv

        return conv.output_shape(kw["input"], kw["weight"], kw.get("stride", 1),
                                 kw.get("padding", 0), kw.get("dilation", 1))  # fmt: skip
    if "pointwise" in op.tags:
        return np.broadcast_shapes(*(v.shape for v in kw.values() if isinstance(v, np.ndarray)))
    if "normalization" in op.tags or op.name in ("softmax", "log_softmax"):
        return kw["input"].shape
    raise ValueError(f"no output-shape rule for {op.name} inside a fused op (refcore/derive.py)")


def _oracle(spec: OpSpec, fusion: FusionSpec, named: dict[str, Any]) -> Any:
    import torch

    from refcore.testing import call_torch

    reg = default_registry()
    out_dtype = next((v.dtype for v in named.values() if isinstance(v, torch.Tensor)), None)
    if fusion.round == "once":
        named = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                 for k, v in named.items()}  # fmt: skip

    def call(op: str, kw: dict) -> Any:
        o = reg.op(op)
        return call_torch(o, _resolved(o.torch.function), kw)

    out = _compose(fusion.pattern, named, call)
    return out.to(out_dtype) if fusion.round == "once" else out
