"""`refcore.optimize`: capture a model, rewrite its graph with refcore's passes, route its ops.

The returned module computes the same function as the input (within the specs' tolerances). The
model is captured by torch.fx when it can be traced symbolically, else by dynamo (torch.compile's
graph capture, which handles transformers models, with dynamic shapes so other batch sizes and
sequence lengths need no new optimize call). The graph passes (``refcore/passes``) drop
inference dropouts, fold batch-norms and parameter-only subgraphs, and fuse the patterns of
``specs/fusions.yaml``; every remaining call of a spec'd torch function runs under
`refcore.enabled` routing. A model neither can capture is not an error: it keeps its own code,
runs under routing, and ``notes`` say why it was not captured.

Example:
    >>> import torch, refcore
    >>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    >>> fast = refcore.optimize(m, provider="reference")
    >>> fast(torch.ones(2, 8)).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from refcore.dispatch import AUTO
from refcore.provider import installed

DEFAULT_PASSES = (
    "functionalize", "drop_dropout", "fold_bn", "fold_constants", "channels_last", "attention",
    "fuse", "prepack", "route",
)  # fmt: skip
CAPTURES = ("auto", "fx", "dynamo", "none")


def _implemented(provider: str) -> set[str]:
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


def optimize(model: Any, dtype: Any = None, example_inputs: Any = None, provider: str = AUTO,
             passes: Sequence[str] = DEFAULT_PASSES, *, capture: str = "auto",
             inplace: bool = False) -> Any:  # fmt: skip
    """Return an ``nn.Module`` computing ``model``'s function with refcore's passes and kernels.

    ``dtype=torch.bfloat16`` converts floating parameters and floating inputs (fp32 accumulation
    stays the kernels' business); outputs come back in that dtype. ``example_inputs`` (a tuple of
    positional or a dict of keyword arguments) is run once, so capture happens (and any capture
    failure falls back) inside optimize. ``capture``: ``"auto"`` (fx, else dynamo), ``"fx"``,
    ``"dynamo"`` or ``"none"`` (op-level routing only). The caller's model is not changed unless
    ``inplace=True``. The result is for inference: eval mode, parameters without gradients.
    ``optimized.notes`` lists what each pass did and what stayed on torch.
    """
    import torch

    from refcore.integration import _check_provider

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize: expected a torch.nn.Module, got {type(model).__name__}")
    devices = {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()}
    if devices - {"cpu"}:
        raise ValueError(f"optimize: refcore runs CPU models; parameters are on {sorted(devices)}")
    unknown = set(passes) - set(DEFAULT_PASSES)
    if unknown:
        raise ValueError(f"optimize: unknown passes {sorted(unknown)}; known: {DEFAULT_PASSES}")
    if capture not in CAPTURES:
        raise ValueError(f"optimize: capture={capture!r}; expected one of {CAPTURES}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"optimize: dtype expected a floating torch.dtype, got {dtype!r}")
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list, dict)):
        raise TypeError(
            "optimize: example_inputs expected a tuple of positional or a dict of keyword "
            f"arguments, got {type(example_inputs).__name__}"
        )
    _check_provider(provider, strict=False)
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    # An inference module: without parameter gradients, its calls route even in grad mode.
    m.requires_grad_(False)
    notes: list[str] = []
    if dtype is not None:
        m.to(dtype)
        notes.append(f"dtype: floating parameters and inputs in {dtype}")
    if "channels_last" in passes:
        from refcore.passes.channels_last import channels_last

        n = channels_last(m)
        if n:
            notes.append(f"channels_last: {n} conv2d weight(s) in NHWC")
    example = None
    if isinstance(example_inputs, (tuple, list)):
        example = _cast(tuple(example_inputs), dtype)
    out = _capture(m, provider, tuple(passes), notes, capture, dtype, example)
    if example_inputs is not None:
        with torch.no_grad():
            out(**example_inputs) if isinstance(example_inputs, dict) else out(*example_inputs)
    return out


def apply_passes(gm: Any, provider: str, passes: Sequence[str], notes: list[str]) -> Any:
    """Run the graph passes named in ``passes`` on ``gm`` (in place), noting what each did."""
    from refcore.passes.channels_last import channels_last_graph
    from refcore.passes.dropout import drop_dropout
    from refcore.passes.fold_bn import fold_bn
    from refcore.passes.fold_constants import fold_constants
    from refcore.passes.functional import functionalize
    from refcore.passes.fuse import fuse, fuse_attention
    from refcore.passes.prepack import prepack
    from refcore.passes.route import route

    def counted(name: str, fn: Any) -> None:
        before = len(gm.graph.nodes)
        fn(gm)
        if len(gm.graph.nodes) != before:
            notes.append(f"{name}: {before - len(gm.graph.nodes)} nodes removed")

    if "functionalize" in passes:
        functionalize(gm)
    if "drop_dropout" in passes:
        counted("drop_dropout", drop_dropout)
    if "fold_bn" in passes:
        fold_bn(gm)
        if gm.refcore_bn_folded:
            notes.append(f"fold_bn: {gm.refcore_bn_folded} batch-norm(s) folded into conv/linear")
    if "fold_constants" in passes:
        fold_constants(gm)
        if gm.refcore_folded:
            notes.append(f"fold_constants: {gm.refcore_folded} parameter-only subgraph(s) folded")
    if "channels_last" in passes and channels_last_graph(gm):
        notes.append("channels_last: conv2d weights of the graph in NHWC")
    if "attention" in passes:
        fuse_attention(gm)
        if gm.refcore_attention:
            notes.append(f"attention: {gm.refcore_attention} matmul-softmax-matmul pattern(s) "
                         "-> scaled_dot_product_attention")  # fmt: skip
    if "fuse" in passes:
        fuse(gm, provider, _implemented(provider), notes)
    if "prepack" in passes:  # it packs the weights of the fused linear ops too
        prepack(gm, provider, notes)
    if "route" in passes:  # last: the nodes other passes left as torch calls
        route(gm, provider)
    return gm


def _capture(m: Any, provider: str, passes: tuple[str, ...], notes: list[str], capture: str,
             dtype: Any, example: tuple | None) -> Any:  # fmt: skip
    import torch

    if capture in ("auto", "fx"):
        try:
            gm = torch.fx.symbolic_trace(m)
        except Exception as e:  # fx cannot trace data-dependent code (transformers models)
            notes.append(f"not captured by torch.fx ({type(e).__name__}: {str(e)[:100]})")
        else:
            notes.append(f"captured by torch.fx: {len(gm.graph.nodes)} nodes")
            if example is not None:  # shapes and dtypes for passes that need them (attention)
                from torch.fx.passes.shape_prop import ShapeProp

                try:
                    with torch.no_grad():
                        ShapeProp(gm).propagate(*example)
                except Exception as e:  # the passes then match less (e.g. no attention)
                    notes.append(f"shapes not propagated ({type(e).__name__}: {str(e)[:100]})")
            return OptimizedModule(apply_passes(gm, provider, passes, notes), provider, notes,
                                   dtype, routed=True)  # fmt: skip
    if capture in ("auto", "dynamo"):
        from refcore.compile_backend import backend

        notes.append("captured by dynamo (dynamic shapes); passes run on each captured graph")
        compiled = torch.compile(
            m, backend=backend(provider, passes=passes, notes=notes, freeze=m), dynamic=True
        )
        return OptimizedModule(compiled, provider, notes, dtype, routed=False)
    notes.append("not captured (capture='none'): its ops are routed one by one")
    return OptimizedModule(m, provider, notes, dtype, routed=True)


def _cast(value: Any, dtype: Any) -> Any:
    import torch

    if dtype is None:
        return value

    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


@functools.cache
def _module_class() -> type:
    import torch

    from refcore.integration import enabled, reporting

    class OptimizedModule(torch.nn.Module):
        """``inner`` (a captured graph, or the model) run under refcore routing.

        ``notes`` say what the passes did. A dynamo-captured model routes inside its compiled
        graphs; if dynamo fails on a call, the model falls back to op-level routing for good and
        the reason joins ``notes``.
        """

        def __init__(self, inner: torch.nn.Module, provider: str, notes: list[str], dtype: Any,
                     routed: bool) -> None:  # fmt: skip
            super().__init__()
            self.inner, self.provider, self.notes = inner, provider, notes
            self.dtype, self.routed = dtype, routed
            self.routes_itself = True  # explain(model, ...) reports its own routing

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            if self.dtype is not None:
                args = _cast(args, self.dtype)
                kwargs = {k: _cast(v, self.dtype) for k, v in kwargs.items()}
            if self.routed:
                if getattr(self.inner, "refcore_self_routing", False):
                    with reporting(self.provider):  # its nodes route themselves (passes.route)
                        return self.inner(*args, **kwargs)
                with enabled(self.provider):
                    return self.inner(*args, **kwargs)
            if torch.overrides._len_torch_function_stack() > 0:
                # a caller's mode (e.g. refcore.enabled around this call) is active: dynamo would
                # trace it, and refcore's kernels with it; run the model's own code, routed
                with enabled(self.provider):
                    return self.inner._orig_mod(*args, **kwargs)
            try:
                # floats (eps, momentum) as constants, not 0-d tensor inputs: passes read them
                with torch._dynamo.config.patch(specialize_float=True):
                    return self.inner(*args, **kwargs)
            except torch._dynamo.exc.TorchDynamoException as e:
                self.notes.append(f"dynamo capture failed ({type(e).__name__}: {str(e)[:160]}); "
                                  "its ops are routed one by one")  # fmt: skip
                self.inner, self.routed = self.inner._orig_mod, True
                return self.forward(*args, **kwargs)

    return OptimizedModule


def OptimizedModule(inner: Any, provider: str, notes: list[str], dtype: Any = None,
                    routed: bool = True) -> Any:  # fmt: skip
    return _module_class()(inner, provider, notes, dtype, routed)
