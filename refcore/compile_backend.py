"""The ``torch.compile`` backend ``"refcore"``, registered by entry point (no work at import).

Dynamo hands the backend a torch-level FX graph; the backend runs the passes of
`refcore.pipeline` for ``dynamo`` graphs on it (inference dropouts removed, attention patterns
made SDPA calls, the patterns of ``specs/fusions.yaml`` fused, spec'd calls routed) and returns a
callable that runs the graph under refcore routing, so every spec'd torch call goes to the
provider's kernel when one accepts it. `refcore.optimize` uses the same backend to capture models
torch.fx cannot trace, with ``freeze``: the model's parameters and buffers (graph inputs in dynamo
graphs) become constants of the graph (kind ``frozen``), so the passes that rewrite parameters
(fold_bn, fold_constants, prepack) apply too.

Example:
    >>> import torch
    >>> f = torch.compile(torch.nn.GELU(), backend="refcore")      # doctest: +SKIP
    >>> g = torch.compile(model, backend=backend(provider="native"))  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from refcore import pipeline
from refcore.dispatch import AUTO
from refcore.passes import WRITES, writes_inputs_or_state


def backend(provider: str = AUTO, passes: Sequence[str] | None = None,
            notes: list[str] | None = None, freeze: Any = None) -> Callable[..., Any]:  # fmt: skip
    """A torch.compile backend routing to ``provider`` (``backend="refcore"`` uses ``"auto"``).

    ``passes`` selects passes of `refcore.pipeline` (default: all); they run in the table's order,
    those for ``dynamo`` graphs, or with ``freeze`` for ``frozen`` ones. ``notes``, if given,
    collects what the passes did on each captured graph. ``freeze``, an ``nn.Module`` whose
    parameters and buffers will not change (an inference copy), lets the graph treat them as
    constants.
    """
    if passes is not None:
        pipeline.check(passes, "backend")

    def compile_fn(gm: Any, example_inputs: Any, **kwargs: Any) -> Callable[..., Any]:
        from refcore import choice
        from refcore.integration import enabled, reporting

        choice.note_setup()  # a capture compiled: the call that triggered it is no timing sample
        graph_notes: list[str] = []
        writes = writes_inputs_or_state(gm)  # before the passes: what the model's code does
        if writes:  # refcore.optimize then never runs a call twice to time it
            graph_notes.append(f"{WRITES}{writes}")
        frozen: dict[int, Any] = {}
        plain, plain_routes, plain_run = None, False, None
        if freeze is not None:
            plain = copy.deepcopy(gm)  # no tensors in it: parameters are its inputs
            plain_results = pipeline.run(plain, "dynamo", provider, passes)
            plain_routes = pipeline.routes_itself(plain_results)
            plain_run = _runner(plain, plain_results)
            frozen = _freeze(gm, example_inputs, freeze)
            if frozen:
                graph_notes.append(f"freeze: {len(frozen)} parameters/buffers as graph constants")
        results = pipeline.run(gm, "frozen" if freeze is not None else "dynamo", provider, passes)
        graph_notes.extend(pipeline.notes(results))
        gm_routes, gm_run = pipeline.routes_itself(results), _runner(gm, results)
        if notes is not None:
            notes.extend(n for n in graph_notes if n not in notes)

        def run(*args: Any) -> Any:
            # the frozen constants are these very tensors; another module's would not be
            same = all(args[i] is t for i, t in frozen.items())
            g, routes_itself = (gm_run, gm_routes) if same else (plain_run, plain_routes)
            # nodes that route themselves (passes.route) need no torch function mode around them
            with reporting(provider) if routes_itself else enabled(provider):
                return g(*args)

        run.refcore_notes = graph_notes  # type: ignore[attr-defined]
        run.refcore_passes = results  # type: ignore[attr-defined]
        return run

    return compile_fn


def _runner(gm: Any, results: Sequence[Any]) -> Callable[..., Any]:
    """``gm`` itself, or its per-input-class plans (`refcore.plan`) where the plan pass ran."""
    from refcore.plan import Planned

    return Planned(gm) if pipeline.planned(results) else gm


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
