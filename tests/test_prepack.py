"""The prepack pass: linear weights packed once at optimise time, same function as before."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from test_passes import mlps
from torch import nn

import refcore
from refcore.passes.functional import functionalize
from refcore.passes.fuse import fuse
from refcore.passes.prepack import PrepackedOp, choose_layout, prepack
from refcore.registry import default_registry

FUSED_OPS = {f.op for f in default_registry().fusions.values() if f.op}
F32_LAYOUT = choose_layout("linear", "float32", "native")
needs_layout = pytest.mark.skipif(F32_LAYOUT is None, reason="no native kernel reads packed fp32")


def _graph(model: nn.Module, provider: str, notes: list[str]) -> torch.fx.GraphModule:
    gm = functionalize(torch.fx.symbolic_trace(model))
    fuse(gm, provider, FUSED_OPS, notes)
    return prepack(gm, provider, notes)


def _targets(gm: torch.fx.GraphModule) -> list[PrepackedOp]:
    return [n.target for n in gm.graph.nodes if isinstance(n.target, PrepackedOp)]


@needs_layout
@settings(deadline=None)
@given(case=mlps())
def test_prepack_keeps_the_function(case) -> None:
    model, x = case
    notes: list[str] = []
    gm = _graph(model, "native", notes)
    assert len(_targets(gm)) == sum(isinstance(m, nn.Linear) for m in model)
    with torch.no_grad(), refcore.enabled("native"):
        torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)


@needs_layout
def test_packed_calls_run_native_and_follow_weight_updates() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 24), nn.ReLU(), nn.Linear(24, 8)).eval()
    notes: list[str] = []
    gm = _graph(model, "native", notes)
    assert "prepack: 2 linear weight(s) packed once" in notes
    x = torch.randn(33, 40)
    with torch.no_grad(), refcore.enabled("native") as report:
        torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)
        ran = {(f, o) for (f, o) in report.counts if f.startswith("prepacked")}
        assert {f for f, _ in ran} == {"prepacked linear_relu", "prepacked linear"}
        assert all(o.startswith("native/") for _, o in ran), ran
        model[2].weight.mul_(-2.0)  # the graph shares the parameter: it must repack
        torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)


@needs_layout
def test_autograd_calls_run_the_plain_op() -> None:
    model = nn.Sequential(nn.Linear(12, 5)).eval()
    gm = _graph(model, "native", [])
    x = torch.randn(20, 12, requires_grad=True)
    with refcore.enabled("native"):
        y = gm(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, model[0].weight.sum(0).expand(20, 12))


def test_nothing_to_pack_for_the_reference() -> None:
    notes: list[str] = []
    gm = _graph(nn.Sequential(nn.Linear(6, 3)).eval(), "reference", notes)
    assert not _targets(gm)
    assert any("left plain (no kernel of reference" in n for n in notes)


def test_choose_layout_follows_the_cpu() -> None:
    # every level from avx2 up reads the amx_bf16_vnni2 layout (avx2 widens its pairs to fp32)
    want = "amx_bf16_vnni2" if refcore.cpu.has("avx2") else None
    assert choose_layout("linear_gelu", "bfloat16", "native") == want
    assert choose_layout("linear", "float32", "numba") is None


@needs_layout
def test_a_weight_converted_after_packing_runs_plain() -> None:
    model = nn.Sequential(nn.Linear(40, 24)).eval()
    gm = _graph(model, "native", [])
    gm.to(torch.float64)  # no layout has float64: the call runs on torch, same function
    x = torch.randn(20, 40, dtype=torch.float64)
    with torch.no_grad(), refcore.enabled("native"):
        torch.testing.assert_close(gm(x), model.to(torch.float64)(x))


def test_optimize_packs_by_default() -> None:
    """refcore.optimize runs prepack last: the fused linear ops' weights are packed too."""
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32)).eval()
    x = torch.randn(40, 64)
    opt = refcore.optimize(model, example_inputs=(x,), provider="auto")
    torch.testing.assert_close(opt(x), model(x), atol=5e-5, rtol=1e-5)
    if choose_layout("linear", "float32") is None:
        assert any("left plain" in n for n in opt.notes), opt.notes
    else:
        assert "prepack: 2 linear weight(s) packed once" in opt.notes, opt.notes
        ran = str(refcore.explain(opt, x))
        assert "prepacked linear_gelu" in ran and "prepacked linear " in ran, ran
