"""Every spec'd op (fused ops included) as a torch custom op ``torch.ops.refcore.<op>``.

Registered from the specs on first use (`register`; nothing happens at ``import refcore``), once
per process. Each op gets:

- a schema derived from its spec signature (`schemas`): refcore's types map one to one onto
  torch's, except a union such as conv2d's ``int[2]|str padding``, which becomes two overloads
  as in ATen (``refcore::conv2d`` with ``int[2] padding``, ``refcore::conv2d.padding`` with
  ``str padding``);
- a CPU kernel that runs the op through `refcore.dispatch.run`, the one front door (the provider
  is ``"auto"``, or the one a `using` block names);
- a fake (meta) kernel: the spec's torch function (``torch.function``, for fused ops the
  composition in `refcore.oracles`) run on the fake inputs, which is torch's own shape and dtype
  rule for the op (`_SHAPE_RULES` writes it out where that function cannot run on fake tensors);
  outputs are contiguous, or channels-last after a channels-last 4-D first argument, as the CPU
  kernel's are (`_memory_format`);
- autograd, for the ops whose spec declares a backward (`register_autograd` with the backward
  reference of refcore.ops.grad: the gradients are the declared meaning, computed in NumPy, not
  a kernel; so `refcore.enable` still leaves calls that need autograd to torch).

Example:
    >>> import torch
    >>> from refcore import library
    >>> _ = library.register()
    >>> torch.ops.refcore.relu(torch.tensor([-1.0, 2.0]))
    tensor([0., 2.])
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from refcore.dispatch import AUTO
from refcore.registry import default_registry, resolve
from refcore.spec import OpSpec, Signature

NAMESPACE = "refcore"

# refcore argument type -> the torch schema types it stands for (one overload per alternative)
_TYPES: dict[str, tuple[str, ...]] = {
    "Tensor": ("Tensor",),
    "int": ("int",),
    "float": ("float",),
    "bool": ("bool",),
    "str": ("str",),
    "int[]": ("int[]",),
    "int[2]": ("int[2]",),
    "int[2]|str": ("int[2]", "str"),
}

# A union's default in the other alternative's type. The one union type, conv padding, defaults
# to 0, which the str form spells 'valid' (ATen's conv2d.padding has the same default).
_UNION_DEFAULTS: dict[tuple[str, str, Any], Any] = {("int[2]|str", "str", 0): "valid"}

_provider: contextvars.ContextVar[str] = contextvars.ContextVar("refcore_library", default=AUTO)


@contextlib.contextmanager
def using(provider: str) -> Iterator[None]:
    """Run ``torch.ops.refcore.*`` calls of this block with ``provider``'s kernels.

    Example:
        >>> import torch
        >>> with using("reference"):
        ...     y = torch.ops.refcore.gelu(torch.ones(2))           # doctest: +SKIP
    """
    token = _provider.set(provider)
    try:
        yield
    finally:
        _provider.reset(token)


def schemas(sig: Signature) -> list[tuple[str, str]]:
    """(overload name, torch schema) for each overload of the op with signature ``sig``.

    An argument of a union type gives one overload per alternative: the first is ``default``,
    the others are named after the argument (as ATen names ``conv2d.padding``). A default that
    does not fit an alternative's type is spelled in that type (``padding=0`` is ``'valid'``).

    Example:
        >>> from refcore.schema import parse
        >>> schemas(parse("gelu(Tensor input, *, str approximate='none') -> Tensor"))
        [('default', "gelu(Tensor input, *, str approximate='none') -> Tensor")]
    """
    unknown = [a for a in sig.args if a.type not in _TYPES]
    if unknown:  # a new spec type needs a mapping here; the error says which
        raise ValueError(
            f"{sig.name}: argument {unknown[0].name!r} has type {unknown[0].type!r}, which has "
            f"no torch schema type; known: {', '.join(_TYPES)}"
        )
    unions = [a for a in sig.args if len(_TYPES[a.type]) > 1]
    if len(unions) > 1:
        raise ValueError(f"{sig.name}: more than one union-typed argument")
    if not unions:
        return [("default", _schema(sig, sig.name, None, ""))]
    u, out = unions[0], []
    for i, alt in enumerate(_TYPES[u.type]):
        overload = "default" if i == 0 else u.name if i == 1 else f"{u.name}{i}"
        qualified = sig.name if i == 0 else f"{sig.name}.{overload}"
        out.append((overload, _schema(sig, qualified, u.name, alt)))
    return out


def _schema(sig: Signature, name: str, union: str | None, alt: str) -> str:
    parts, star = [], False
    for a in sig.args:
        if a.kwarg_only and not star:
            parts.append("*")
            star = True
        t = alt if a.name == union else _TYPES[a.type][0]
        text = f"{t}{'?' if a.optional else ''} {a.name}"
        if a.has_default:
            default = _UNION_DEFAULTS.get((a.type, t, a.default), a.default)
            if not _fits(default, t, a.optional):
                raise ValueError(f"{sig.name}: default {a.default!r} of {a.name!r} is no {t}")
            text += f"={_literal(default)}"
        parts.append(text)
    return f"{name}({', '.join(parts)}) -> {sig.returns}"


def _fits(value: Any, t: str, optional: bool) -> bool:
    if value is None:
        return optional or t == "Tensor"
    if t == "str":
        return isinstance(value, str)
    if t == "bool":
        return isinstance(value, bool)
    if t in ("int", "int[]", "int[2]"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return ok or (t != "int" and isinstance(value, (list, tuple)))
    if t == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def _literal(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)  # None, True/False, numbers: torch's schema literals are Python's


def _kernel(op: str) -> Callable[..., Any]:
    from refcore.dispatch import run

    def cpu(*args: Any, **kwargs: Any) -> Any:
        # in the memory format the fake kernel promises (a no-op for a kernel's usual output)
        out = run(op, *args, provider=_provider.get(), **kwargs)
        return out.contiguous(memory_format=_memory_format(args, kwargs, out))

    cpu.__name__ = f"refcore_{op}_cpu"
    return cpu


def _memory_format(args: tuple, kwargs: dict, out: Any) -> Any:
    """The memory format of an op's output: channels-last where the op's first argument and its
    output are 4-D and that argument is channels-last (torch's rule for a conv or a pointwise op:
    a quantized CNN's activations stay NHWC from layer to layer), else contiguous."""
    import torch

    first = args[0] if args else next(iter(kwargs.values()), None)
    if (isinstance(first, torch.Tensor) and first.dim() == 4 and out.dim() == 4
            and not first.is_contiguous()
            and first.is_contiguous(memory_format=torch.channels_last)):  # fmt: skip
        return torch.channels_last
    return torch.contiguous_format


def _spmm_reduce_shape(crow_indices: Any, col_indices: Any, values: Any, dense: Any,
                       reduce: str) -> Any:  # fmt: skip
    return values.new_empty((crow_indices.shape[0] - 1, dense.shape[1]))


def _spmm_reduce_backward_shape(grad_output: Any, crow_indices: Any, col_indices: Any,
                                values: Any, dense: Any, reduce: str) -> Any:  # fmt: skip
    return dense.new_empty(dense.shape)


def _gather_scatter_backward_shape(grad_output: Any, x: Any, *_: Any, **__: Any) -> Any:
    return x.new_empty(x.shape)


def _qlinear_shape(input: Any, weight: Any, **_: Any) -> Any:
    """qlinear and its fused forms with a float32 output (qlinear_relu, qlinear_gelu)."""
    import torch

    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=torch.float32)


def _qlinear_quantize_shape(input: Any, weight: Any, dtype: str, **_: Any) -> Any:
    """The requantizing fused forms of qlinear: 1-byte codes of ``dtype``."""
    import torch

    return input.new_empty((*input.shape[:-1], weight.shape[0]), dtype=getattr(torch, dtype))


def _qconv2d_shape(input: Any, input_scale: float, input_zero_point: int, weight: Any,
                   weight_scales: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                   dilation: Any = 1, groups: int = 1) -> Any:  # fmt: skip
    from refcore.ops.conv import output_shape

    shape = output_shape(input, weight, stride, padding, dilation)
    return input.new_empty(shape, dtype=weight_scales.dtype)


def _roi_align_shape(input: Any, boxes: Any, output_size: Any, **_: Any) -> Any:
    from refcore.ops.vision import output_pair

    return input.new_empty((boxes.shape[0], input.shape[1], *output_pair(output_size)))


def _quantize_per_tensor_shape(input: Any, scale: float, zero_point: int, quant_min: int,
                               quant_max: int, dtype: str) -> Any:  # fmt: skip
    import torch

    return input.new_empty(input.shape, dtype=getattr(torch, dtype))


# Ops whose torch function cannot run on fake tensors, with their shape rule written out.
# spmm_reduce (and its backward): its oracle builds a sparse CSR tensor, which fake tensors
# cannot hold (torch 2.13: "Values and compressed tensor instance need to be on the same
# device"); qlinear: oneDNN's weight prepack has no fake kernel (on a VNNI CPU, where it is
# qlinear's oracle; so for its fused forms, whose torch functions call it, too);
# quantize_per_tensor: the decomposed op's fake kernel checks the input is float32 (a bf16
# input is widened first); roi_align: its oracle is ONNX's NumPy reference;
# gather_scatter_backward: its oracle differentiates, and a fake kernel runs below autograd.
_SHAPE_RULES: dict[str, Callable[..., Any]] = {
    "spmm_reduce": _spmm_reduce_shape, "spmm_reduce_backward": _spmm_reduce_backward_shape,
    "gather_scatter_backward": _gather_scatter_backward_shape,
    "qlinear": _qlinear_shape, "qconv2d": _qconv2d_shape,
    "qlinear_relu": _qlinear_shape, "qlinear_gelu": _qlinear_shape,
    "qlinear_relu_quantize": _qlinear_quantize_shape,
    "qlinear_gelu_quantize": _qlinear_quantize_shape,
    "quantize_per_tensor": _quantize_per_tensor_shape, "roi_align": _roi_align_shape,
}  # fmt: skip


def _fake(spec: OpSpec) -> Callable[..., Any]:
    from refcore.call import spelling
    from refcore.testing import call_torch

    spelled = spelling(spec)
    rule = _SHAPE_RULES.get(spec.name)

    def fake(*args: Any, **kwargs: Any) -> Any:
        named = spelled.arguments(args, kwargs)
        if rule is not None:
            out = rule(**named)
        else:
            out = call_torch(spec, resolve(spec.torch.function), named)
        return out.new_empty(out.shape).contiguous(memory_format=_memory_format(args, kwargs, out))

    fake.__name__ = f"refcore_{spec.name}_fake"
    return fake


@dataclass(frozen=True)
class Registration:
    """What `register` did: the ``torch.library.Library`` holding the definitions (alive as long
    as this object is), and the ops it could not define, each with the reason."""

    library: Any
    declined: Mapping[str, str]
    #: ops with a declared backward that torch cannot give an autograd formula, with the reason
    #: (``torch.library.register_autograd`` takes no keyword-only tensor argument)
    without_autograd: Mapping[str, str] = field(default_factory=dict)


@functools.cache
def register() -> Registration:
    """Define ``torch.ops.refcore.<op>`` for every op of the registry (once per process; later
    calls return the same `Registration`). An op whose signature has no torch schema is declined
    with the reason (`Registration.declined`), not an error for the others."""
    import torch

    lib = torch.library.Library(NAMESPACE, "FRAGMENT")
    tags = (torch.Tag.pt2_compliant_tag,)  # tests/test_library.py runs opcheck on every op
    declined: dict[str, str] = {}
    no_grad: dict[str, str] = {}
    for name in sorted(default_registry().ops):
        spec = default_registry().ops[name]
        try:
            overloads = schemas(spec.signature)
        except ValueError as e:
            declined[name] = str(e)
            continue
        kernel, fake = _kernel(name), _fake(spec)
        for overload, schema in overloads:
            qualified = name if overload == "default" else f"{name}.{overload}"
            lib.define(schema, tags=tags)
            lib.impl(qualified, kernel, "CPU")
            torch.library.register_fake(f"{NAMESPACE}::{qualified}", fake, lib=lib)
        kw_tensors = [a.name for a in spec.signature.tensor_args if a.kwarg_only]
        if spec.backward is not None and kw_tensors:
            no_grad[name] = f"keyword-only tensor argument(s) {kw_tensors}"
        elif spec.backward is not None:
            backward, setup = _autograd(spec)
            for overload, _ in overloads:
                qualified = name if overload == "default" else f"{name}.{overload}"
                torch.library.register_autograd(f"{NAMESPACE}::{qualified}", backward,
                                                setup_context=setup, lib=lib)  # fmt: skip
    return Registration(lib, MappingProxyType(declined), MappingProxyType(no_grad))


def _autograd(spec: OpSpec) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(backward, setup_context) for ``torch.library.register_autograd`` from the spec's
    backward reference: the forward's arguments are kept (tensors through
    ``save_for_backward``), and the reference's gradients come back for the ``wrt`` inputs that
    require one (None for every other input)."""
    import torch

    from refcore import tensors

    names = [a.name for a in spec.signature.args if not a.kwarg_only]
    kwonly = [a.name for a in spec.signature.args if a.kwarg_only]
    ref = resolve(spec.backward.reference)  # type: ignore[union-attr]
    wrt = set(spec.backward.wrt)  # type: ignore[union-attr]

    def setup(ctx: Any, inputs: tuple, output: Any, **kw: Any) -> None:
        ctx.slots = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(inputs[i] for i in ctx.slots))
        ctx.plain = [None if isinstance(v, torch.Tensor) else v for v in inputs]
        # which inputs want a gradient (ctx.needs_input_grad covers only the ones the caller
        # passed, not the defaults torch filled in)
        ctx.wants = [isinstance(v, torch.Tensor) and v.requires_grad for v in inputs]
        ctx.kwonly = dict(kw.get("keyword_only_inputs") or {})  # torch passes it when any

    def backward(ctx: Any, grad: Any) -> tuple:
        values = list(ctx.plain)
        for i, t in zip(ctx.slots, ctx.saved_tensors):
            values[i] = t
        args = {n: tensors.to_numpy(v.detach()) if isinstance(v, torch.Tensor) else v
                for n, v in zip(names, values)}  # fmt: skip
        args |= {n: ctx.kwonly[n] for n in kwonly if n in ctx.kwonly}
        grads = ref(tensors.to_numpy(grad.detach().contiguous()), **args)
        return tuple(
            tensors.to_torch(grads[n]) if n in wrt and ctx.wants[i] else None
            for i, n in enumerate(names[: len(values)])
        )

    return backward, setup


def register_autograd(op: str, backward: Callable[..., Any], *,
                      setup_context: Callable[..., Any] | None = None) -> None:  # fmt: skip
    """Give ``torch.ops.refcore.<op>`` (every overload) a backward formula, as
    ``torch.library.register_autograd`` takes it. No op has one yet: calls that need autograd
    stay on torch under routing (`refcore.enable`)."""
    import torch

    torch_op(op)  # registered, and not declined
    lib = register().library
    for overload, _ in schemas(default_registry().op(op).signature):
        qualified = op if overload == "default" else f"{op}.{overload}"
        torch.library.register_autograd(
            f"{NAMESPACE}::{qualified}", backward, setup_context=setup_context, lib=lib
        )


def torch_op(op: str) -> Any:
    """``torch.ops.refcore.<op>`` (the overload packet), registering the ops first if needed.

    Example:
        >>> torch_op("gelu").default                                  # doctest: +SKIP
        refcore.gelu.default
    """
    import torch

    default_registry().op(op)  # an unknown name: the registry's error lists the known ones
    why = register().declined.get(op)
    if why is not None:
        raise ValueError(f"{op}: no torch custom op ({why})")
    return getattr(torch.ops.refcore, op)
