"""The pass table (refcore/pipeline.py) drives both `refcore.optimize` and the torch.compile
backend, and what each pass did reaches the optimized module's notes."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest
import torch
from torch import nn

import refcore
from refcore import pipeline
from refcore.compile_backend import backend
from refcore.passes import PassResult


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.1), nn.Linear(8, 4), nn.BatchNorm1d(4)
    ).eval()


def _recorded(monkeypatch, seen: list[str]) -> None:
    """Make every pass of the table note its name in ``seen`` when it runs."""

    def recording(p: pipeline.Pass):
        def run(gm, provider):
            seen.append(p.name)
            return p.run(gm, provider)

        return run

    table = tuple(dataclasses.replace(p, run=recording(p)) for p in pipeline.PIPELINE)
    monkeypatch.setattr(pipeline, "PIPELINE", table)


def test_the_table_orders_optimize_and_the_compile_backend(monkeypatch) -> None:
    seen: list[str] = []
    _recorded(monkeypatch, seen)
    model, x = _model(), torch.randn(3, 8)
    refcore.optimize(model, provider="reference", capture="fx", example_inputs=(x,))
    assert seen == list(pipeline.names("fx"))
    seen.clear()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="refcore")(x)
    assert seen == list(pipeline.names("dynamo"))
    seen.clear()
    torch._dynamo.reset()
    refcore.optimize(model, provider="reference", capture="dynamo", example_inputs=(x,))
    # the graph for other modules' parameters (dynamo), then the frozen one
    assert seen == [*pipeline.names("dynamo"), *pipeline.names("frozen")]


def test_the_table_names_kinds_in_one_order() -> None:
    assert pipeline.names("dynamo") == (
        "drop_dropout", "canonicalize", "attention", "fuse", "route", "plan"
    )
    for kind in pipeline.KINDS:
        names = pipeline.names(kind)
        assert list(names) == [n for n in pipeline.names() if n in names]
    assert pipeline.names()[-2:] == ("route", "plan")  # the nodes other passes left, then plans
    with pytest.raises(ValueError, match=r"optimize: unknown passes \['fusion'\]"):
        refcore.optimize(_model(), passes=("fusion",))


def test_a_pass_result_is_reported(monkeypatch) -> None:
    def spy(gm, provider):
        return PassResult("spy", 1, ("spy: did one thing",), ("spy: left one (why)",))

    row = pipeline.Pass("spy", spy, pipeline.ALL, "a test pass")
    monkeypatch.setattr(pipeline, "PIPELINE", (*pipeline.PIPELINE[:-1], row, pipeline.PIPELINE[-1]))
    model, x = _model(), torch.randn(3, 8)
    fast = refcore.optimize(model, provider="reference", capture="fx", example_inputs=(x,))
    assert "spy: did one thing" in fast.notes and "spy: left one (why)" in fast.notes
    assert [r.name for r in fast.passes] == list(pipeline.names("fx"))
    notes: list[str] = []
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend("reference", notes=notes))(x)
    assert "spy: did one thing" in notes and "spy: left one (why)" in notes


def test_real_passes_report_what_they_did_and_left() -> None:
    model, x = _model(), torch.randn(3, 8)
    fast = refcore.optimize(model, provider="reference", capture="fx", example_inputs=(x,))
    results = {r.name: r for r in fast.passes}
    assert results["functionalize"].changed == 4  # the dropout is drop_dropout's
    assert results["functionalize"].left == (
        "functionalize: calls of Dropout left (no function form known)",
    )
    assert results["drop_dropout"].changed == 1
    assert results["fold_bn"].did == ("fold_bn: 1 batch-norm(s) folded into conv/linear",)
    assert results["route"].applied and fast.self_routing
    assert "fold_bn: 1 batch-norm(s) folded into conv/linear" in fast.notes
    torch.testing.assert_close(fast(x), model(x), atol=1e-5, rtol=1e-5)
    only = refcore.optimize(model, provider="reference", capture="fx", passes=("route",))
    assert [r.name for r in only.passes] == ["route"]


def test_no_import_cycle_between_optimize_and_the_backend() -> None:
    import refcore.compile_backend as cb

    tree = ast.parse(inspect.getsource(cb))
    imported = {
        f"{n.module}.{a.name}" if n.module == "refcore" else n.module
        for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
    }  # fmt: skip
    assert "refcore.optimize" not in imported and "refcore.pipeline" in imported
