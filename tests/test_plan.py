"""Planned execution (`refcore.plan`): a plan computes what the routed graph computes, records what
it records, and a call its guards reject takes the routing path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import refcore
from refcore import plan as planmod
from refcore.integration import RoutedOp, reporting
from refcore.plan import Planned, Step
from refcore.provider import installed

PROVIDERS = [p for p in ("reference", "native", "numba", "auto")
             if p == "auto" or installed()[p].availability().available]  # fmt: skip


class Block(torch.nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(d, h), torch.nn.Linear(h, d)
        self.ln = torch.nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l2(torch.nn.functional.gelu(self.l1(x))) + x
        # positional, as F.softmax's spec maps it (a plan once read ``dim`` by keyword)
        return torch.nn.functional.softmax(torch.relu(self.ln(y)) * 2.0, -1)


def _routed(model: torch.nn.Module, provider: str, **kw) -> torch.fx.GraphModule:
    opt = refcore.optimize(model, provider=provider, capture="fx", **kw)
    assert opt.self_routing
    return opt.inner


def _run(fn, *args):
    with torch.no_grad(), reporting("test") as rep:
        out = fn(*args)
    return out, dict(rep.counts)


@pytest.mark.parametrize("provider", PROVIDERS)
@given(rows=st.integers(1, 40), d=st.sampled_from([8, 16, 24]), seed=st.integers(0, 2**16))
def test_a_plan_computes_and_records_what_the_routed_graph_does(provider, rows, d, seed) -> None:
    torch.manual_seed(seed)
    gm = _routed(Block(d, 2 * d).eval(), provider)
    planned = Planned(gm)
    x = torch.randn(rows, d)
    want, want_rep = _run(gm, x)
    for _ in range(3):  # the planning run, then replays
        got, got_rep = _run(planned, x)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got_rep == want_rep
    assert len(planned.plans) == 1


def test_calls_torch_runs_become_torch_calls_in_the_planned_code() -> None:
    gm = _routed(Block(8, 16).eval(), "auto", passes=("functionalize", "route"))
    planned = Planned(gm)
    _run(planned, torch.randn(4, 8))  # auto leaves calls this small on torch
    (code,) = [p[0].code for p in planned.plans.values()]
    routed = [n for n in gm.graph.nodes if isinstance(n.target, RoutedOp)]
    assert routed and "refcore_routed" in gm.code
    assert "refcore_routed" not in code and "torch.nn.functional.layer_norm(" in code


def test_a_structure_the_guard_rejects_takes_the_routing_path() -> None:
    gm = _routed(Block(8, 16).eval(), "reference")
    planned = Planned(gm)
    x = torch.randn(6, 8)
    _run(planned, x)
    (got,) = planned.plans.values()
    steps = got[1]
    assert steps and all(isinstance(s, Step) for s in steps)
    strided = torch.randn(8, 6).t()  # same input class (shape, dtype), other strides
    want, want_rep = _run(gm, strided)
    out, rep = _run(planned, strided)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert rep == want_rep and len(planned.plans) == 1
    assert all(s.missed == 0 for s in steps)  # counted back into the report
    _run(got[0], strided)  # the planned code alone: its first step's guard sends it back
    assert steps[0].missed == 1


def test_inputs_of_another_class_get_their_own_plan_and_the_count_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(planmod, "MAX_PLANS", 2)
    gm = _routed(Block(8, 16).eval(), "reference")
    planned = Planned(gm)
    for rows in (3, 4, 5, 200):  # four classes: the third and fourth run unplanned
        x = torch.randn(rows, 8)
        torch.testing.assert_close(_run(planned, x)[0], _run(gm, x)[0], rtol=0, atol=0)
    assert len(planned.plans) == 2
    assert planmod.input_class((torch.randn(33, 8),), {}) == planmod.input_class(
        (torch.randn(64, 8),), {}
    )


def test_autograd_inputs_run_the_routed_graph_and_gradients_flow() -> None:
    torch.manual_seed(0)
    gm = _routed(Block(8, 16).eval(), "reference")
    planned = Planned(gm)
    x = torch.randn(4, 8, requires_grad=True)
    planned(x).sum().backward()
    assert x.grad is not None and not planned.plans


def test_keyword_inputs_map_to_placeholders() -> None:
    class Two(torch.nn.Module):
        def forward(self, a, b):
            return torch.relu(a) + b

    gm = _routed(Two(), "reference")
    planned = Planned(gm)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out, _ = _run(lambda: planned(a, b=b))
    torch.testing.assert_close(out, torch.relu(a) + b)


def test_a_provider_disabled_in_a_scope_is_not_run_from_a_plan() -> None:
    if not installed()["numba"].availability().available:
        pytest.skip("numba is not installed: no second provider to disable")
    gm = _routed(Block(8, 16).eval(), "auto")
    planned = Planned(gm)
    x = torch.randn(200, 8)  # large enough for auto to route
    with refcore.provider.disabled("native", "numba"):
        _, want = _run(gm, x)
    _run(planned, x)  # planned with every provider
    with refcore.provider.disabled("native", "numba"):
        _, got = _run(planned, x)
    assert got == want and not any(o.startswith(("native/", "numba/")) for _, o in got)


def test_a_prepacked_call_is_planned_and_follows_a_changed_weight() -> None:
    from unittest import mock

    from refcore.passes.prepack import PrepackedOp, choose_layout

    dtypes = [d for d in ("float32", "bfloat16") if choose_layout("linear_gelu", d, "native")]
    if not dtypes:
        pytest.skip("no native kernel on this CPU reads a packed weight")
    dtype = getattr(torch, dtypes[0])
    torch.manual_seed(0)
    model = Block(16, 64).eval().to(dtype)
    gm = _routed(model, "native")
    packed = [n for n in gm.graph.nodes if isinstance(n.target, PrepackedOp)]
    assert packed
    planned = Planned(gm)
    x = torch.randn(64, 16).to(dtype)
    want, want_rep = _run(gm, x)
    _run(planned, x)
    # a replay runs the packed kernel itself: the prepacked node (the adapter's fallback) never runs
    fell_back = AssertionError("the plan fell back to the prepacked node")
    with mock.patch.object(PrepackedOp, "__call__", autospec=True, side_effect=fell_back):
        got, got_rep = _run(planned, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_rep == want_rep
    (code,) = [p[0].code for p in planned.plans.values()]
    assert "prepacked" not in code and "refcore_step_" in code
    with torch.no_grad():  # the graph's own copy of the weight changes: the plan must see it
        w = gm.get_parameter(packed[0].kwargs["weight"].target)
        w.mul_(-1.0)
    want = gm(x)
    torch.testing.assert_close(_run(planned, x)[0], want, rtol=0, atol=0)


def test_a_prepacked_linear_torch_runs_is_planned_as_torch_linear() -> None:
    from refcore.passes.prepack import PrepackedOp, choose_layout

    if choose_layout("linear", "float32", "auto") is None:
        pytest.skip("no kernel on this CPU reads a packed float32 weight: nothing is prepacked")
    torch.manual_seed(0)
    gm = _routed(torch.nn.Sequential(torch.nn.Linear(16, 8)).eval(), "auto")
    assert any(isinstance(n.target, PrepackedOp) for n in gm.graph.nodes)
    planned = Planned(gm)
    x = torch.randn(2, 16)  # auto leaves calls this small on torch, packed or plain
    want, want_rep = _run(gm, x)
    _run(planned, x)
    got, got_rep = _run(planned, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_rep == want_rep
    (code,) = [p[0].code for p in planned.plans.values()]
    assert "refcore_plain_linear" in code


class _LinearGelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.lin(x))


def test_a_prepacked_fused_op_torch_runs_is_planned_as_its_torch_chain() -> None:
    """Where torch runs a packed fused call and every call of its chain, a replay calls the
    chain's torch functions: no prepacked node, no routed composition; and a changed weight
    takes the node's own path again."""
    from unittest import mock

    from refcore.integration import FusedOp
    from refcore.passes.prepack import PrepackedOp, choose_layout

    if choose_layout("linear_gelu", "float32", "auto") is None:
        pytest.skip("no kernel on this CPU reads a packed float32 weight: nothing is prepacked")
    torch.manual_seed(0)
    gm = _routed(_LinearGelu().eval(), "auto")
    packed = [n for n in gm.graph.nodes if isinstance(n.target, PrepackedOp)]
    assert [n.target.op for n in packed] == ["linear_gelu"]
    planned = Planned(gm)
    x = torch.randn(2, 16)  # auto leaves calls this small on torch, packed or plain
    want, want_rep = _run(gm, x)
    _run(planned, x)
    routed = AssertionError("the replay routed the call")
    with (
        mock.patch.object(PrepackedOp, "__call__", autospec=True, side_effect=routed),
        mock.patch.object(FusedOp, "composition", autospec=True, side_effect=routed),
    ):
        got, got_rep = _run(planned, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_rep == want_rep
    (code,) = [p[0].code for p in planned.plans.values()]
    assert "refcore_plain_linear_gelu" in code
    with torch.no_grad():
        gm.get_parameter(packed[0].kwargs["weight"].target).mul_(-1.0)
    torch.testing.assert_close(_run(planned, x)[0], gm(x), rtol=0, atol=0)
