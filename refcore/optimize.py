"""`refcore.optimize`: capture a model, rewrite its graph with refcore's passes, route its ops.

The returned module computes the same function as the input (within the specs' tolerances): the
graph passes (``refcore/passes``) fold batch-norms and fuse the patterns of ``specs/fusions.yaml``,
and every remaining call of a spec'd torch function runs under `refcore.enabled` routing. A model
that torch.fx cannot trace (e.g. transformers models) is not an error: it keeps its own code, runs
under routing, and the notes say why it was not captured.

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

DEFAULT_PASSES = ("functionalize", "fold_bn", "fuse")


def _implemented(provider: str) -> set[str]:
    provs = installed()
    chosen = [provs[provider]] if provider != AUTO else [
        p for n, p in provs.items() if n != "reference"
    ]  # fmt: skip
    return {k.op for p in chosen if p.availability().available for k in p.kernels}


def optimize(model: Any, dtype: Any = None, example_inputs: Any = None, provider: str = AUTO,
             passes: Sequence[str] = DEFAULT_PASSES, *, inplace: bool = False) -> Any:  # fmt: skip
    """Return an ``nn.Module`` computing ``model``'s function with refcore's passes and kernels.

    ``dtype=torch.bfloat16`` converts floating parameters (fp32 accumulation stays the kernels'
    business). ``example_inputs`` (a tuple of positional or a dict of keyword arguments) is run
    once to check the optimized module works. The caller's model is not changed unless
    ``inplace=True``. ``optimized.notes`` lists what each pass did and what stayed on torch.
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
    _check_provider(provider, strict=False)
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    if dtype is not None:
        m.to(dtype)
    notes: list[str] = []
    inner = _capture_and_rewrite(m, provider, passes, notes)
    out = OptimizedModule(inner, provider, notes)
    if example_inputs is not None:
        with torch.no_grad():
            out(**example_inputs) if isinstance(example_inputs, dict) else out(*example_inputs)
    return out


def _capture_and_rewrite(m: Any, provider: str, passes: Sequence[str], notes: list[str]) -> Any:
    import torch

    from refcore.passes.fold_bn import fold_bn
    from refcore.passes.functional import functionalize
    from refcore.passes.fuse import fuse

    try:
        gm = torch.fx.symbolic_trace(m)
    except Exception as e:  # fx cannot trace data-dependent code: the model keeps its own code
        notes.append(f"not captured by torch.fx ({type(e).__name__}: {str(e)[:120]}); "
                     "its ops are routed one by one")  # fmt: skip
        return m
    notes.append(f"captured by torch.fx: {len(gm.graph.nodes)} nodes")
    if "functionalize" in passes:
        functionalize(gm)
    if "fold_bn" in passes:
        before = len(gm.graph.nodes)
        fold_bn(gm)
        if len(gm.graph.nodes) != before:
            notes.append(f"fold_bn: {before - len(gm.graph.nodes)} nodes folded away")
    if "fuse" in passes:
        fuse(gm, provider, _implemented(provider), notes)
    return gm


@functools.cache
def _module_class() -> type:
    import torch

    from refcore.integration import enabled

    class OptimizedModule(torch.nn.Module):
        """``inner`` run under refcore routing; ``notes`` say what the passes did."""

        def __init__(self, inner: torch.nn.Module, provider: str, notes: list[str]) -> None:
            super().__init__()
            self.inner, self.provider, self.notes = inner, provider, notes

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            with enabled(self.provider):
                return self.inner(*args, **kwargs)

    return OptimizedModule


def OptimizedModule(inner: Any, provider: str, notes: list[str]) -> Any:
    return _module_class()(inner, provider, notes)
