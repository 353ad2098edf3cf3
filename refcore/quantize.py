"""`refcore.quantize`: a model whose layers run on quantized weights, with refcore's kernels.

Schemes are declared in specs/schemes.yaml (`SCHEMES` lists them): each names the rule that
makes a layer's quantized weight from its float one (a NumPy reference in refcore/ops/quant.py)
and the spec'd op the layer then computes. Every ``nn.Linear`` (but those ``skip`` names or
``only`` leaves out) becomes a `WoqLinear` holding what the rule gives, as buffers named after
that op's arguments:

- ``woq_int8``: int8 weight, an fp32 scale per output channel or per group (symmetric, round
  half to even: `refcore.ops.quant.woq_int8_weight`); op ``woq_linear``. A quarter of the fp32
  weight's bytes, which is what a bandwidth-bound decode step reads.
- ``woq_int4``: 4-bit codes two per byte, an fp32 scale and minimum per group of 32 (or
  ``group_size``) values (asymmetric: `refcore.ops.quant.woq_int4_weight`, GGUF Q4_1's form);
  op ``woq_int4_linear``. An eighth of the fp32 bytes, plus 8 bytes per group.

- ``x86_static_int8``: static int8 (torch's x86 recipe): the int8 weight symmetric per channel,
  and the layer's input quantized to uint8 per tensor with a scale and zero point fixed by
  calibration (the scheme's observer, `refcore.ops.observers`, over the values the calibration
  inputs gave: min-max by default, ``observer="histogram"`` or ``"moving_average"`` instead);
  a linear layer becomes a `QLinear` computing ``quantize_per_tensor`` then ``qlinear``, an
  ``nn.Conv2d`` a `QConv2d` computing ``quantize_per_tensor`` then ``qconv2d`` (exact int32
  sums, float32 output, cast back to the input's dtype).
- ``x86_static_int8_w7``: the same with 7-bit weights (int8 over [-64, 63]): on CPUs without
  VNNI the native AVX2 kernels then sum with vpmaddubsw, exactly (oneDNN halves the weights
  there itself, silently); its accuracy cost is in specs/schemes.yaml.

The woq schemes compute in the input's dtype with fp32 sums. Each call is routed as
`refcore.enabled` routes a torch call: to the provider's kernel where one accepts it and
measured faster than the op's torch composition, else to that composition; `refcore.explain`
shows which.

Example:
    >>> import torch, refcore
    >>> q = refcore.quantize(torch.nn.Sequential(torch.nn.Linear(64, 8)), provider="reference")
    >>> type(q[0]).__name__, q[0].weight.dtype
    ('WoqLinear', torch.int8)
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

from refcore.dispatch import AUTO


def _schemes() -> dict[str, Any]:
    from refcore.registry import default_registry

    return dict(default_registry().quant_schemes)


def __getattr__(name: str) -> Any:
    if name == "SCHEMES":  # read from the specs on use, not at import
        return tuple(_schemes())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def quantize(model: Any, scheme: str = "woq_int8", provider: str = AUTO, *,
             calibration: Iterable[Any] | None = None, observer: str | None = None,
             group_size: int | None = None, skip: Iterable[str] = (),
             only: Iterable[str] | None = None, inplace: bool = False) -> Any:  # fmt: skip
    """Return ``model`` with its ``nn.Linear`` layers quantized by ``scheme`` (see the module doc).

    ``group_size``: one scale per that many consecutive weights along the input dim (e.g. 32,
    as GGUF's blocks); by default the scheme's (woq_int8: one per output channel, woq_int4: 32).
    A layer whose in_features it does not divide keeps one group per channel (woq_int4: if
    in_features is even, else the layer stays float); the notes count them. ``skip`` names
    modules to keep in float, ``only`` (if given) the only ones to quantize (as
    ``model.named_modules()`` names them; a name covers the layers inside that module too).
    The caller's model is not changed unless ``inplace=True``. The result is for inference
    (eval mode, no parameter gradients); it is still the same kind of module (a transformers
    model keeps ``generate`` and its config). ``model.refcore_notes`` lists what was quantized.

    A static scheme (``x86_static_int8``) also quantizes each layer's input, with the scale and
    zero point its observer gives for the range that input took while the model ran on
    ``calibration``: an iterable of example inputs, each a tuple of positional or a dict of
    keyword arguments (as `refcore.optimize`'s ``example_inputs``). A layer no calibration
    input reached stays float (the notes name it). ``observer`` names the calibration rule
    (`refcore.ops.observers.OBSERVERS`: ``"minmax"``, ``"moving_average"``, ``"histogram"``);
    None: the scheme's. `refcore.optimize` on the result folds batch-norms into the int8
    convs and fuses their ReLU / residual add where a kernel takes the fused op.
    """
    import torch

    from refcore.integration import _check_provider

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize: expected a torch.nn.Module, got {type(model).__name__}")
    schemes = _schemes()
    if scheme not in schemes:
        raise ValueError(f"quantize: scheme={scheme!r}; expected one of {tuple(schemes)}")
    spec = schemes[scheme]
    _check_provider(provider, strict=False)
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"quantize: group_size={group_size!r}; expected a positive int or None")
    if spec.dtype == "int4" and group_size is not None and group_size % 2:
        raise ValueError(f"quantize: group_size={group_size} for {scheme}; expected an even "
                         "size (two 4-bit codes per byte)")  # fmt: skip
    static = spec.activation is not None
    if static and calibration is None:
        raise ValueError(f"quantize: scheme={scheme!r} quantizes activations: give calibration=, "
                         "an iterable of example inputs")  # fmt: skip
    if not static and calibration is not None:
        raise ValueError(f"quantize: calibration is for static schemes; {scheme!r} quantizes "
                         "weights only")  # fmt: skip
    if observer is not None:
        from refcore.ops.observers import OBSERVERS

        if not static:
            raise ValueError(f"quantize: observer is for static schemes; {scheme!r} quantizes "
                             "no activation by calibration")  # fmt: skip
        if observer not in OBSERVERS:
            raise ValueError(f"quantize: observer={observer!r}; expected one of "
                             f"{tuple(OBSERVERS)}")  # fmt: skip
    if static and group_size is not None:
        raise ValueError(f"quantize: group_size={group_size} for {scheme}; expected None (one "
                         "scale per output channel)")  # fmt: skip
    group_size = group_size if group_size is not None else spec.group_size
    skip = set(skip)
    only = None if only is None else set(only)
    names = {name for name, _ in model.named_modules()}
    for what, given in (("skip", skip), ("only", only or set())):
        unknown = sorted(given - names)
        if unknown:
            raise ValueError(f"quantize: {what} names no module of the model: {unknown}")
    skip = _Selection(frozenset(skip), None if only is None else frozenset(only))
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    m.requires_grad_(False)
    if static:
        return _quantize_static(m, scheme, provider, skip, calibration, observer)
    layers, kept = _layers(m, skip, (torch.nn.Linear,))
    done, per_channel, odd = 0, 0, []
    for parent, attr, full in layers:
        child = getattr(parent, attr)
        k = child.in_features
        fits = group_size is None or k % group_size == 0
        group = group_size if fits else None
        if spec.dtype == "int4" and group is None:
            if k % 2:
                odd.append(full)
                continue
            group = k  # one group per channel
        per_channel += not fits
        setattr(parent, attr, _woq_class()(child, provider, group, scheme))
        done += 1
    per = f"per group of {group_size}" if group_size else "per channel"
    what = "int8 weight, fp32 scale" if spec.dtype == "int8" else "4-bit weight, fp32 scale and min"
    notes = [f"{scheme}: {done} nn.Linear layer(s) quantized ({what} {per}; op {spec.op})"]
    if per_channel:
        one = "a scale per channel" if spec.dtype == "int8" else "one group per channel"
        notes.append(f"{scheme}: {per_channel} layer(s) with in_features not a multiple of "
                     f"{group_size}: {one}")  # fmt: skip
    if odd:
        notes.append(f"{scheme}: kept in float (odd in_features): {', '.join(odd)}")
    notes.extend(_kept_notes(scheme, kept))
    m.refcore_notes = notes
    return m


@dataclasses.dataclass(frozen=True)
class _Selection:
    """`quantize`'s ``skip`` and ``only`` module names."""

    skip: frozenset
    only: frozenset | None

    def why_kept(self, full: str) -> str:
        """Why layer ``full`` stays float ("skip", "not in only"), or ""."""
        within = {full, *(full[:i] for i, c in enumerate(full) if c == ".")}  # it and its parents
        if within & self.skip:
            return "skip"
        if self.only is not None and not within & self.only:
            return "not in only"
        return ""


def _kept_notes(scheme: str, kept: list[tuple[str, str]]) -> list[str]:
    by_why: dict[str, list[str]] = {}
    for full, why in kept:
        by_why.setdefault(why, []).append(full)
    return [f"{scheme}: kept in float ({why}): {', '.join(names)}" for why, names in by_why.items()]


def _layers(model: Any, select: _Selection, kinds: tuple[type, ...]
            ) -> tuple[list[tuple[Any, str, str]], list[tuple[str, str]]]:  # fmt: skip
    """The children of exactly these module classes to quantize, as (parent, attribute, full
    name), and the others' (name, why kept)."""
    found, kept = [], []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) in kinds:
                full = f"{parent_name}.{child_name}" if parent_name else child_name
                why = select.why_kept(full)
                if why:
                    kept.append((full, why))
                else:
                    found.append((parent, child_name, full))
    return found, kept


def _quantize_static(m: Any, scheme: str, provider: str, skip: _Selection,
                     calibration: Iterable[Any], observer: str | None) -> Any:  # fmt: skip
    """Observe the inputs of ``m``'s linear (and, where the scheme has a conv op, conv) layers
    over the calibration inputs, then swap each reached one for a `QLinear` / `QConv2d` with its
    input's scale and zero point from the observer (``observer`` or the scheme's)."""
    import torch

    from refcore.ops.observers import OBSERVERS
    from refcore.registry import default_registry, resolve

    spec = default_registry().quant_schemes[scheme]
    act = spec.activation
    classes = _static_classes()
    kinds = (torch.nn.Linear, torch.nn.Conv2d) if spec.conv_op else (torch.nn.Linear,)
    layers, kept = _layers(m, skip, kinds)
    other_padding = [f for p, a, f in layers
                     if getattr(getattr(p, a), "padding_mode", "zeros") != "zeros"]  # fmt: skip
    layers = [t for t in layers if t[2] not in other_padding]
    obs = OBSERVERS[observer] if observer is not None else resolve(act.observer)
    states = _calibrate(m, {full: getattr(p, a) for p, a, full in layers}, calibration, obs)
    done, unreached = collections.Counter(), []
    for parent, attr, full in layers:
        if full not in states:
            unreached.append(full)
            continue
        scale, zp = obs.qparams(states[full], act.quant_min, act.quant_max, act.symmetric, act.eps)
        layer = getattr(parent, attr)
        kind = type(layer).__name__
        setattr(parent, attr, classes[kind](layer, provider, scale, zp, scheme, full))
        done[kind] += 1
    counts = ", ".join(f"{n} nn.{k}" for k, n in sorted(done.items())) or "no layer"
    notes = [f"{scheme}: {counts} quantized (int8 weight per channel, {act.dtype} input per "
             f"tensor, {obs.name} observer over {states.count} calibration input(s))"]  # fmt: skip
    if unreached:
        notes.append(f"{scheme}: kept in float (no calibration input reached): "
                     f"{', '.join(unreached)}")  # fmt: skip
    if other_padding:
        notes.append(f"{scheme}: kept in float (padding_mode not 'zeros'): "
                     f"{', '.join(other_padding)}")  # fmt: skip
    notes.extend(_kept_notes(scheme, kept))
    m.refcore_notes = notes
    return m


class _States(dict):
    """Layer name -> its observer's state over the calibration inputs; ``count`` inputs."""

    count = 0


def _calibrate(model: Any, layers: dict[str, Any], calibration: Iterable[Any],
               observer: Any) -> _States:  # fmt: skip
    """Run ``model`` on each calibration input with a forward pre-hook on each layer folding
    its input into ``observer``'s state (torch's public hooks, removed afterwards)."""
    import torch
    from rich.progress import track

    from refcore import tensors

    states = _States()

    def hook(name: str) -> Any:
        def record(module: Any, args: tuple) -> None:
            x = args[0].detach()
            if x.numel() == 0:
                return
            seen = tensors.to_numpy(x.float())
            states[name] = observer.observe(states.get(name), seen)

        return record

    handles = [mod.register_forward_pre_hook(hook(n)) for n, mod in layers.items()]
    try:
        with torch.no_grad():
            for example in track(calibration, description="calibrating", transient=True):
                if isinstance(example, dict):
                    model(**example)
                elif isinstance(example, (tuple, list)):
                    model(*example)
                else:
                    raise TypeError("quantize: calibration inputs expected tuples of positional "
                                    "or dicts of keyword arguments, got "
                                    f"{type(example).__name__}")  # fmt: skip
                states.count += 1
    finally:
        for h in handles:
            h.remove()
    if not states.count:
        raise ValueError("quantize: calibration gave no inputs")
    return states


def _apply_keeping_dtypes(module: Any, apply: Any, fn: Any, recurse: bool,
                          names: tuple[str, ...]) -> Any:  # fmt: skip
    """``module._apply(fn)`` (``apply``, the base class's) with the buffers ``names`` kept in
    their dtype: ``.to(dtype)`` casts every floating buffer, ``.to(device)`` still moves them."""
    saved = {n: getattr(module, n) for n in names}
    apply(fn, recurse)
    for n, old in saved.items():
        if old is not None:
            moved = fn(old)
            setattr(module, n, moved if moved.dtype == old.dtype else old)
    return module


def _opaque(fn: Any) -> Any:
    """``fn`` (an op's torch composition, run where no kernel takes a layer's call) with torch
    function handling off inside: under `refcore.enable` / `explain` the layer's call is one
    routed op, recorded once, not the composition's matmuls and adds."""
    import torch

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)

    return run


@functools.cache
def _static_classes() -> dict[str, type]:
    """``{"Linear": QLinear, "Conv2d": QConv2d}`` (built on first use: no torch import at
    ``import refcore``)."""
    import torch

    from refcore import library, tensors
    from refcore.integration import _record, route_call
    from refcore.registry import default_registry, resolve

    class _Static(torch.nn.Module):
        """A layer quantized by a static scheme (specs/schemes.yaml): its input quantized per
        tensor (``input_scale``, ``input_zero_point``, from calibration) by the scheme's
        activation op, then the scheme's op for the layer (int8 ``weight``, fp32
        ``weight_scales`` and ``bias``, the layer's own attributes), both routed to
        ``provider`` (see `refcore.quantize`); the float32 result comes back in the input's
        dtype."""

        op_key = "op"  # the scheme's field naming this layer's op

        def __init__(self, layer: torch.nn.Module, provider: str, input_scale: float,
                     input_zero_point: int, scheme: str, name: str = "") -> None:  # fmt: skip
            super().__init__()
            reg = default_registry()
            spec = reg.quant_schemes[scheme]
            w = tensors.to_numpy(layer.weight.detach().float().contiguous())
            q, scales = resolve(spec.rule)(w)
            self.scheme, self.provider = scheme, provider
            self.input_scale, self.input_zero_point = float(input_scale), int(input_zero_point)
            act = spec.activation
            self._qparams = (act.quant_min, act.quant_max, act.dtype)
            self._ops = tuple(reg.op(n) for n in (act.op, getattr(spec, self.op_key)))
            self._oracles = tuple(_opaque(resolve(o.torch.function)) for o in self._ops)
            self._custom = tuple(library.torch_op(o.name).default for o in self._ops)
            self.register_buffer("weight", torch.from_numpy(q))
            self.register_buffer("weight_scales", torch.from_numpy(scales))
            b = layer.bias
            self.register_buffer("bias", None if b is None else b.detach().float().clone())
            self._attrs: tuple = ()  # the op's arguments after bias
            self._decisions: tuple[dict, dict] = ({}, {})  # route_call's memos, per layer
            # explain's rows: each layer's two calls by op and layer name, with its scheme and
            # input quantization (the kernel and its ISA are the rows' outcomes)
            where = f" {name}" if name else ""
            qp = f"({scheme}: input scale {self.input_scale:.4g}, zero point {input_zero_point})"
            self._labels = (f"{act.op}{where} {qp}", f"{self._ops[1].name}{where}")

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            (qop, lop), (qfn, lfn), (qd, ld) = self._ops, self._oracles, self._decisions
            s, zp = self.input_scale, self.input_zero_point
            if torch.compiler.is_compiling():
                # captured (refcore.optimize, torch.compile): one opaque custom-op node per op,
                # run by refcore's dispatch (torch.ops.refcore, `refcore.library`), not traced
                qfn, lfn = self._custom
                q = qfn(input, s, zp, *self._qparams)
                y = lfn(q, s, zp, self.weight, self.weight_scales, self.bias, *self._attrs)
                return y if y.dtype == input.dtype else y.to(input.dtype)
            q = route_call(qfn, qop, self._labels[0], self.provider,
                           (input, s, zp, *self._qparams), {}, qd, _record)  # fmt: skip
            args = (q, s, zp, self.weight, self.weight_scales, self.bias, *self._attrs)
            y = route_call(lfn, lop, self._labels[1], self.provider, args, {}, ld, _record)
            return y if y.dtype == input.dtype else y.to(input.dtype)

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            # the scales and bias are the scheme's float32 values whatever the model's dtype
            # (the ops take them so)
            return _apply_keeping_dtypes(self, super()._apply, fn, recurse,
                                         ("weight_scales", "bias"))  # fmt: skip

        def extra_repr(self) -> str:
            s, zp = self.input_scale, self.input_zero_point
            return f"{tuple(self.weight.shape)}, {self.scheme}, input_scale={s:.4g}, zp={zp}"

    class QLinear(_Static):
        """``nn.Linear`` under a static scheme: quantize_per_tensor, then qlinear."""

    class QConv2d(_Static):
        """``nn.Conv2d`` (zero padding) under a static scheme: quantize_per_tensor, then
        qconv2d with the layer's stride, padding, dilation and groups."""

        op_key = "conv_op"

        def __init__(self, conv: torch.nn.Conv2d, *args: Any, **kwargs: Any) -> None:
            super().__init__(conv, *args, **kwargs)
            self._attrs = (conv.stride, conv.padding, conv.dilation, conv.groups)
            # channels-last, the memory order a conv kernel reads its weight in (the native
            # one copies any other per call)
            self.weight = self.weight.contiguous(memory_format=torch.channels_last)

    for cls in (QLinear, QConv2d):
        cls.__module__ = __name__
    return {"Linear": QLinear, "Conv2d": QConv2d}


@functools.cache
def _woq_class() -> type:
    import torch

    from refcore import library, tensors
    from refcore.integration import _record, route_call
    from refcore.registry import default_registry, resolve

    class WoqLinear(torch.nn.Module):
        """``nn.Linear`` on a weight quantized by ``scheme`` (specs/schemes.yaml), computing the
        scheme's op routed to ``provider`` (see `refcore.quantize`). Its buffers are named after
        the op's arguments: ``weight`` (int8 (out, in), or uint8 (out, in / 2) for 4 bits),
        ``scales`` (``weight_scales`` for dynamic_int8) and, for woq_int4, ``mins`` (fp32), and
        ``bias``. dynamic_int8's layers are these too: the weight side is the same, and its op
        quantizes the input itself, per token, on each call."""

        def __init__(self, linear: torch.nn.Linear, provider: str,
                     group_size: int | None = None, scheme: str = "woq_int8") -> None:  # fmt: skip
            super().__init__()
            spec = default_registry().quant_schemes[scheme]
            w = tensors.to_numpy(linear.weight.detach().float().contiguous())
            made = resolve(spec.rule)(w, group_size)
            self.scheme, self.provider = scheme, provider
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self._spec = default_registry().op(spec.op)  # looked up once, not per call
            self._oracle = _opaque(resolve(self._spec.torch.function))
            self._custom = library.torch_op(spec.op).default  # what a dynamo graph calls
            # the op's arguments between input and bias, in its signature's order
            self._quant = tuple(a.name for a in self._spec.signature.args[1:] if a.name != "bias")
            for name, value in zip(self._quant, made, strict=True):
                self.register_buffer(name, torch.from_numpy(value))
            # a bias the op takes in float32 whatever the input (dynamic_qlinear) stays so
            self._fp32_bias = self._spec.signature.arg("bias").dtypes == ("float32",)
            bias = linear.bias
            if bias is not None:
                bias = bias.detach().float() if self._fp32_bias else bias.detach().clone()
            self.register_buffer("bias", bias)
            self._decisions: dict[Any, Any] = {}  # route_call's memo, per layer

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            bias = self.bias
            if bias is not None and not self._fp32_bias and bias.dtype != input.dtype:
                bias = bias.to(input.dtype)  # the model was cast after quantizing
            args = (input, *(getattr(self, n) for n in self._quant), bias)
            if torch.compiler.is_compiling():  # one opaque node (see the static layers)
                return self._custom(*args)
            return route_call(self._oracle, self._spec, self._spec.name, self.provider, args,
                              {}, self._decisions, _record)  # fmt: skip

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            # the scales (and mins) are the scheme's fp32 values whatever the model's dtype
            # (bf16 ones would be another weight)
            keep = (*self._quant, "bias") if self._fp32_bias else self._quant
            return _apply_keeping_dtypes(self, super()._apply, fn, recurse, keep)

        def extra_repr(self) -> str:
            return (f"in_features={self.in_features}, out_features={self.out_features}, "
                    f"{self.scheme}")  # fmt: skip

    WoqLinear.__module__ = __name__
    return WoqLinear


def WoqLinear(linear: Any, provider: str = AUTO, group_size: int | None = None,
              scheme: str = "woq_int8") -> Any:  # fmt: skip
    """An ``nn.Linear`` quantized by ``scheme`` (the class is built on first use: no torch
    import at ``import refcore``)."""
    return _woq_class()(linear, provider, group_size, scheme)
