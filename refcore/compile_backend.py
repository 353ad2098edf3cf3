"""The ``torch.compile`` backend ``"refcore"``, registered by entry point (no work at import).

Dynamo hands the backend a torch-level FX graph; the backend runs refcore's graph passes on it
(inference dropouts removed, attention patterns made SDPA calls, the patterns of
``specs/fusions.yaml`` fused) and returns a callable that runs the graph under refcore routing,
so every spec'd torch call goes to the provider's kernel when one accepts it.
`refcore.optimize` uses the same backend to capture models torch.fx cannot trace, with
``freeze``: the model's parameters and buffers (graph inputs in dynamo graphs) become constants of
the graph, so the passes that rewrite parameters (fold_bn, fold_constants) apply too.

Example:
    >>> import torch
    >>> f = torch.compile(torch.nn.GELU(), backend="refcore")      # doctest: +SKIP
    >>> g = torch.compile(model, backend=backend(provider="native"))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from refcore.dispatch import AUTO

# Passes for graphs whose parameters are inputs; with freeze, every graph pass applies.
GRAPH_PASSES = ("drop_dropout", "attention", "fuse", "route", "plan")
FROZEN_PASSES = (
    "drop_dropout", "fold_constants", "fold_bn", "channels_last", "attention", "fuse", "prepack",
    "route", "plan",
)  # fmt: skip


def backend(provider: str = AUTO, passes: Sequence[str] = GRAPH_PASSES,
            notes: list[str] | None = None, freeze: Any = None) -> Callable[..., Any]:  # fmt: skip
    """A torch.compile backend routing to ``provider`` (``backend="refcore"`` uses ``"auto"``).

    ``notes``, if given, collects what the passes did on each captured graph. ``freeze``, an
    ``nn.Module`` whose parameters and buffers will not change (an inference copy), lets the
    graph treat them as constants.
    """
    allowed = FROZEN_PASSES if freeze is not None else GRAPH_PASSES
    use = tuple(p for p in passes if p in allowed)

    def compile_fn(gm: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
        from refcore.integration import enabled, reporting
        from refcore.optimize import apply_passes
        from refcore.plan import Planned

        graph_notes: list[str] = []
        frozen: dict[int, Any] = {}
        plain = None
        if freeze is not None:
            plain = copy.deepcopy(gm)  # no tensors in it: parameters are its inputs
            apply_passes(plain, provider, GRAPH_PASSES, [])
            frozen = _freeze(gm, example_inputs, freeze)
            if frozen:
                graph_notes.append(f"freeze: {len(frozen)} parameters/buffers as graph constants")
        apply_passes(gm, provider, use, graph_notes)
        if notes is not None:
            notes.extend(n for n in graph_notes if n not in notes)
        # graphs whose nodes route themselves replay per-input-class plans (refcore.plan)
        runs = {id(g): Planned(g) if "plan" in use and getattr(g, "refcore_self_routing", False)
                else g for g in (gm, plain) if g is not None}  # fmt: skip

        def run(*args: Any) -> Any:
            # the frozen constants are these very tensors; another module's would not be
            same = all(args[i] is t for i, t in frozen.items())
            g = gm if same else plain
            # nodes that route themselves (passes.route) need no torch function mode around them
            routes_itself = getattr(g, "refcore_self_routing", False)
            with reporting(provider) if routes_itself else enabled(provider):
                return runs[id(g)](*args)

        run.refcore_notes = graph_notes  # type: ignore[attr-defined]
        return run

    return compile_fn


def _freeze(gm: Any, example_inputs: Sequence[Any], module: Any) -> dict[int, Any]:
    """Make the placeholders fed by ``module``'s parameters/buffers graph attributes (in place);
    return {input position: tensor}."""
    state = {id(t): t for t in (*module.parameters(), *module.buffers())}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen: dict[int, Any] = {}
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if id(value) not in state:
            continue
        name = f"_refcore_frozen_{i}"
        gm.register_buffer(name, value.detach())
        with gm.graph.inserting_after(placeholders[-1]):
            attr = gm.graph.get_attr(name)
        node.replace_all_uses_with(attr)
        frozen[i] = value
    gm.graph.lint()
    gm.recompile()
    return frozen


refcore_backend = backend(AUTO)
