"""The ``torch.compile`` backend ``"refcore"``, registered by entry point (no work at import).

Dynamo hands the backend a torch-level FX graph; the backend runs refcore's graph passes on it
(inference dropouts removed, attention patterns made SDPA calls, the patterns of
``specs/fusions.yaml`` fused) and returns a callable that runs the graph under refcore routing,
so every spec'd torch call goes to the provider's kernel when one accepts it.
`refcore.optimize` uses the same backend to capture models torch.fx cannot trace.

Example:
    >>> import torch
    >>> f = torch.compile(torch.nn.GELU(), backend="refcore")      # doctest: +SKIP
    >>> g = torch.compile(model, backend=backend(provider="native"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from refcore.dispatch import AUTO

# Passes that need parameters as graph attributes (fx) do nothing on dynamo graphs, whose
# parameters are graph inputs; these are the ones that apply there.
GRAPH_PASSES = ("drop_dropout", "attention", "fuse")


def backend(provider: str = AUTO, passes: Sequence[str] = GRAPH_PASSES,
            notes: list[str] | None = None) -> Callable[..., Any]:  # fmt: skip
    """A torch.compile backend routing to ``provider`` (``backend="refcore"`` uses ``"auto"``).

    ``notes``, if given, collects what the passes did on each captured graph.
    """
    use = tuple(p for p in passes if p in GRAPH_PASSES)

    def compile_fn(gm: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
        from refcore.integration import enabled
        from refcore.optimize import apply_passes

        graph_notes: list[str] = []
        apply_passes(gm, provider, use, graph_notes)
        if notes is not None:
            notes.extend(n for n in graph_notes if n not in notes)

        def run(*args: Any) -> Any:
            with enabled(provider):
                return gm(*args)

        run.refcore_notes = graph_notes  # type: ignore[attr-defined]
        return run

    return compile_fn


refcore_backend = backend(AUTO)
