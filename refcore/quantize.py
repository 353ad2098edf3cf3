"""`refcore.quantize`: a model whose layers run on quantized weights, with refcore's kernels.

Schemes (`SCHEMES`):

- ``woq_int8``: weight-only int8. Every ``nn.Linear`` (but those named in ``skip``) becomes a
  `WoqLinear` holding its weight as int8 with one fp32 scale per output channel
  (`refcore.ops.quant.woq_int8_weight`: symmetric, round half to even) and computing
  ``woq_linear`` (specs/quant.yaml) in the input's dtype with fp32 sums. The weight takes a
  quarter of its fp32 bytes, which is what a bandwidth-bound decode step reads.

Each ``woq_linear`` call is routed as `refcore.enabled` routes a torch call: to the provider's
kernel where one accepts it and measured faster than torch's own composition (the fp32 weight
dequantized per call, then ``F.linear``), else to that composition; `refcore.explain` shows which.

Example:
    >>> import torch, refcore
    >>> q = refcore.quantize(torch.nn.Sequential(torch.nn.Linear(64, 8)), provider="reference")
    >>> type(q[0]).__name__, q[0].weight.dtype
    ('WoqLinear', torch.int8)
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable
from typing import Any

from refcore.dispatch import AUTO

SCHEMES = ("woq_int8",)


def quantize(model: Any, scheme: str = "woq_int8", provider: str = AUTO, *,
             group_size: int | None = None, skip: Iterable[str] = (),
             inplace: bool = False) -> Any:  # fmt: skip
    """Return ``model`` with its ``nn.Linear`` layers quantized by ``scheme`` (see the module doc).

    ``group_size``: one scale per that many consecutive weights along the input dim (e.g. 32,
    as GGUF's Q8_0 blocks), else one per output channel; a layer whose in_features it does not
    divide keeps a scale per channel (the notes count them). ``skip`` names modules to keep in
    float (as ``model.named_modules()`` names them). The caller's
    model is not changed unless ``inplace=True``. The result is for inference (eval mode, no
    parameter gradients); it is still the same kind of module (a transformers model keeps
    ``generate`` and its config). ``model.refcore_notes`` lists what was quantized.
    """
    import torch

    from refcore.integration import _check_provider

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"quantize: expected a torch.nn.Module, got {type(model).__name__}")
    if scheme not in SCHEMES:
        raise ValueError(f"quantize: scheme={scheme!r}; expected one of {SCHEMES}")
    _check_provider(provider, strict=False)
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"quantize: group_size={group_size!r}; expected a positive int or None")
    skip = set(skip)
    names = {name for name, _ in model.named_modules()}
    unknown = sorted(skip - names)
    if unknown:
        raise ValueError(f"quantize: skip names no module of the model: {unknown}")
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    m.requires_grad_(False)
    done, kept, per_channel = 0, [], 0
    for parent_name, parent in list(m.named_modules()):
        for child_name, child in list(parent.named_children()):
            full = f"{parent_name}.{child_name}" if parent_name else child_name
            if type(child) is not torch.nn.Linear:
                continue
            if full in skip:
                kept.append(full)
                continue
            group = group_size if group_size and child.in_features % group_size == 0 else None
            per_channel += group_size is not None and group is None
            setattr(parent, child_name, _woq_class()(child, provider, group))
            done += 1
    per = f"per group of {group_size}" if group_size else "per channel"
    notes = [f"{scheme}: {done} nn.Linear layer(s) quantized (int8 weight, fp32 scale {per})"]
    if per_channel:
        notes.append(f"{scheme}: {per_channel} layer(s) with in_features not a multiple of "
                     f"{group_size}: a scale per channel")  # fmt: skip
    if kept:
        notes.append(f"{scheme}: kept in float (skip): {', '.join(kept)}")
    m.refcore_notes = notes
    return m


@functools.cache
def _woq_class() -> type:
    import torch

    from refcore import oracles, tensors
    from refcore.integration import _record, route_call
    from refcore.ops.quant import woq_int8_weight
    from refcore.registry import default_registry

    class WoqLinear(torch.nn.Module):
        """``nn.Linear`` on an int8 weight (``weight``, (out, in)) with fp32 ``scales`` (out,) or
        (out, in / group_size), computing ``woq_linear`` routed to ``provider``
        (see `refcore.quantize`)."""

        def __init__(self, linear: torch.nn.Linear, provider: str,
                     group_size: int | None = None) -> None:  # fmt: skip
            super().__init__()
            w = linear.weight.detach()
            q, scales = woq_int8_weight(tensors.to_numpy(w.float().contiguous()), group_size)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.register_buffer("weight", torch.from_numpy(q))
            self.register_buffer("scales", torch.from_numpy(scales))
            bias = linear.bias
            self.register_buffer("bias", None if bias is None else bias.detach().clone())
            self.provider = provider
            self._spec = default_registry().op("woq_linear")  # looked up once, not per call
            self._decisions: dict[Any, Any] = {}  # route_call's memo, per layer

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            bias = self.bias
            if bias is not None and bias.dtype != input.dtype:
                bias = bias.to(input.dtype)  # the model was cast after quantizing
            args = (input, self.weight, self.scales, bias)
            return route_call(oracles.woq_linear, self._spec, "woq_linear", self.provider, args,
                              {}, self._decisions, _record)  # fmt: skip

        def _apply(self, fn: Any, recurse: bool = True) -> Any:
            # ``.to(dtype)`` casts floating buffers; the scales are the scheme's fp32 values
            # whatever the model's dtype (a bf16 scale would be another weight): keep them
            scales = self.scales
            super()._apply(fn, recurse)
            moved = fn(scales)
            self.scales = moved if moved.dtype == scales.dtype else scales
            return self

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, int8"

    WoqLinear.__module__ = __name__
    return WoqLinear


def WoqLinear(linear: Any, provider: str = AUTO, group_size: int | None = None) -> Any:
    """An ``nn.Linear`` quantized by ``woq_int8`` (the class is built on first use: no torch
    import at ``import refcore``)."""
    return _woq_class()(linear, provider, group_size)
