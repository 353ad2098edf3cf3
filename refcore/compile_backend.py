"""The ``torch.compile`` backend ``"refcore"``, registered by entry point (no work at import).

Dynamo hands the backend a torch-level FX graph; the backend runs refcore's fusion pass on it (the
patterns of ``specs/fusions.yaml``) and returns a callable that runs the graph under refcore
routing, so every spec'd torch call goes to the provider's kernel when one accepts it.

Example:
    >>> import torch
    >>> f = torch.compile(torch.nn.GELU(), backend="refcore")      # doctest: +SKIP
    >>> g = torch.compile(model, backend=backend(provider="native"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from refcore.dispatch import AUTO


def backend(provider: str = AUTO) -> Callable[..., Any]:
    """A torch.compile backend routing to ``provider`` (``backend="refcore"`` uses ``"auto"``)."""

    def compile_fn(gm: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
        from refcore.integration import enabled
        from refcore.optimize import _implemented
        from refcore.passes.fuse import fuse

        notes: list[str] = []
        fuse(gm, provider, _implemented(provider), notes)

        def run(*args: Any) -> Any:
            with enabled(provider):
                return gm(*args)

        run.refcore_notes = notes  # type: ignore[attr-defined]
        return run

    return compile_fn


refcore_backend = backend(AUTO)
