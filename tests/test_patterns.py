"""The pattern language (refcore/patterns.py): captures, commutativity, optional casts, where
conditions, containment, failure reasons, multi-output replacement, and the patterns transformers
models need (rms_norm with its casts, residual add + rms_norm, rotary, SwiGLU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from refcore import derive
from refcore.passes.fuse import rewrite
from refcore.patterns import match
from refcore.registry import _pattern, default_registry
from refcore.spec import FusionSpec

REG = default_registry()


def _trace(fn, *example: torch.Tensor) -> fx.GraphModule:
    gm = fx.symbolic_trace(fn)
    if example:
        ShapeProp(gm).propagate(*example)
    return gm


def _root(gm: fx.GraphModule) -> fx.Node:
    return next(iter(n for n in gm.graph.nodes if n.op == "output")).args[0]


def _pattern_spec(name: str, raw: dict, **kw) -> FusionSpec:
    return FusionSpec(name, "test", _pattern(raw, name), **kw)


def test_captures_name_the_fused_arguments() -> None:
    gm = _trace(lambda x, y: torch.relu(x + y))
    m, why = match(REG.fusions["add_relu"], _root(gm), gm)
    assert why == "" and {k: v.name for k, v in m.captures.items()} == {"input": "x", "other": "y"}
    assert [n.name for n in m.nodes] == ["relu", "add"]


def test_add_and_mul_match_in_either_order_unless_ordered() -> None:
    linear = {"op": "linear", "input": "$input", "weight": "$weight"}
    either = _pattern_spec("either", {"op": "add", "input": linear, "other": "$other"})
    gm = _trace(lambda x, w, r: r + F.linear(x, w))
    m, why = match(either, _root(gm), gm)
    assert why == "" and m.captures["other"].name == "r" and m.captures["input"].name == "x"
    m, why = match(REG.fusions["linear_add"], _root(gm), gm)  # ordered: linear(...) + other
    assert m is None and "r is not a call of linear" in why
    gm = _trace(lambda a, b: b * F.silu(a))
    assert match(REG.fusions["swiglu"], _root(gm), gm)[0].captures["gate"].name == "a"


def test_a_name_seen_twice_binds_one_value() -> None:
    pat = _pattern_spec("square", {"op": "mul", "input": "$x", "other": "$x"})
    gm = _trace(lambda a, b: a * b)
    m, why = match(pat, _root(gm), gm)
    assert m is None and "$x would be both" in why
    gm = _trace(lambda a: a * a)
    assert match(pat, _root(gm), gm)[0].captures["x"].name == "a"


def test_optional_views_may_or_may_not_be_there() -> None:
    view = {"op": "view", "optional": True, "open": True, "input": "$x"}
    pat = _pattern_spec("relu_of_view", {"op": "relu", "input": view})
    for f in (lambda a: F.relu(a.reshape(-1)), lambda a: F.relu(a.view(2, 3)), lambda a: F.relu(a)):
        gm = _trace(f)
        m, why = match(pat, _root(gm), gm)
        assert why == "" and m.captures["x"].name == "a", gm.code


def test_an_intermediate_used_outside_the_match_is_refused() -> None:
    def f(x, y):
        s = x + y
        return torch.relu(s) + s

    gm = _trace(f)
    relu = next(n for n in gm.graph.nodes if n.target is torch.relu)
    m, why = match(REG.fusions["add_relu"], relu, gm)
    assert m is None and "also used outside the match" in why


def test_in_place_forms_only_on_the_match_own_intermediate() -> None:
    def f(x, y):
        x += y  # mutates an input: not fusable
        return torch.relu(x)

    gm = _trace(f)
    for n in gm.graph.nodes:  # fx traces += as operator.add; write the in-place form
        if n.op == "call_function" and n.target.__name__ == "add":
            import operator

            n.target = operator.iadd
    m, why = match(REG.fusions["add_relu"], _root(gm), gm)
    assert m is None and "in-place add of a value from outside the match" in why


def test_failure_reason_says_what_did_not_fit() -> None:
    gm = _trace(lambda x, y: F.gelu(x + y, approximate="tanh"))
    m, why = match(REG.fusions["add_relu"], _root(gm), gm)
    assert m is None and "is not relu" in why
    gm = _trace(lambda x, y: torch.relu(torch.add(x, y, alpha=2.0)))
    m, why = match(REG.fusions["add_relu"], _root(gm), gm)
    assert m is None and "alpha=2.0, which the pattern leaves out" in why


def test_where_declines_with_the_unknown_fact_or_the_false_condition() -> None:
    fusion = REG.fusions["attention"]

    def attn(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.5 + mask, dim=-1) @ v

    q = torch.randn(1, 2, 3, 4)
    gm = _trace(attn)
    m, why = match(fusion, _root(gm), gm)
    assert m is None and "unknown" in why and "mask" in why
    gm = _trace(attn, q, q, q, torch.zeros(1, 1, 3, 3, dtype=torch.bool))
    m, why = match(fusion, _root(gm), gm)
    assert m is None and "is false" in why and "attn_mask" in why
    gm = _trace(attn, q, q, q, torch.zeros(1, 1, 3, 3))
    assert match(fusion, _root(gm), gm)[0].captures["scale"] == 0.5


def test_multi_output_replacement() -> None:
    """The op's first output replaces the root, the next the named intermediate (used outside)."""
    fusion = _pattern_spec(
        "add_relu_both",
        {"op": "relu", "input": {"op": "add", "as": "sum", "input": "$input", "other": "$other"}},
        outputs=("sum",), rewrite="test_patterns:_both",
    )  # fmt: skip

    def f(x, y):
        s = x + y
        return torch.relu(s) * 2 + s

    gm = _trace(f)
    x, y = torch.randn(3), torch.randn(3)
    want = f(x, y)
    assert rewrite(gm, "fuse", fusions=[fusion]) == {"add_relu_both": 1}
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(_add_relu2) == 1
    torch.testing.assert_close(gm(x, y), want)


def _add_relu2(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = a + b
    return torch.relu(s), s


def _both(gm: fx.GraphModule, m) -> fx.Node:
    return gm.graph.call_function(_add_relu2, (m.captures["input"], m.captures["other"]))


# ---- rms_norm as transformers writes it


class HFRMSNorm(nn.Module):
    """transformers' LlamaRMSNorm.forward, written out (with its casts, or without)."""

    def __init__(self, d: int, eps: float = 1e-6, casts: bool = True) -> None:
        super().__init__()
        self.weight, self.variance_epsilon, self.casts = nn.Parameter(torch.randn(d)), eps, casts

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        if self.casts:
            hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.casts:
            return self.weight * hidden_states.to(input_dtype)
        return self.weight * hidden_states


def _llama_rms_norm(d: int) -> nn.Module:
    try:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
    except ImportError:
        return HFRMSNorm(d)
    m = LlamaRMSNorm(d, eps=1e-6)
    with torch.no_grad():
        m.weight.normal_()
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", ["transformers", "no_casts"])
def test_hf_rms_norm_becomes_rms_norm(dtype: torch.dtype, which: str) -> None:
    torch.manual_seed(0)
    model = _llama_rms_norm(48) if which == "transformers" else HFRMSNorm(48, casts=False)
    model = model.eval().to(dtype)
    x = torch.randn(2, 5, 48, dtype=dtype) * 3
    gm = _trace(model, x)
    notes: list[str] = []
    assert rewrite(gm, "fuse", notes=notes) == {"rms_norm_hf": 1}, notes
    gm.graph.eliminate_dead_code()  # x.dtype, read by the cast that went
    called = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert called == [F.rms_norm], gm.code
    tol = REG.op("rms_norm").tolerance_for(str(dtype).removeprefix("torch."))
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), atol=tol.atol, rtol=tol.rtol)


def test_hf_rms_norm_needs_known_shapes() -> None:
    gm = _trace(HFRMSNorm(8))  # no example input: the input's shape and dtype are unknown
    notes: list[str] = []
    assert rewrite(gm, "fuse", notes=notes) == {}
    assert any("rms_norm_hf: 1 match(es) left" in n and "unknown" in n for n in notes), notes


def test_residual_add_rms_norm_rotary_and_swiglu_are_reported() -> None:
    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = HFRMSNorm(8)

        def forward(self, h, r, q, cos, sin, gate, up):
            s = h + r
            rot = (q * cos) + (rotate_half(q) * sin)
            return self.norm(s), s, rot, F.silu(gate) * up

    x = torch.randn(2, 8)
    gm = _trace(Block(), *[x] * 7)
    notes: list[str] = []
    rewrite(gm, "fuse", notes=notes)
    for name in ("add_rms_norm", "rotary_embedding", "swiglu"):
        assert f"{name}: 1 match(es) found, left as they are (no fused op declared)" in notes


def test_round_once_computes_in_fp32_and_rounds_once() -> None:
    from refcore.derive import _reference
    from refcore.tensors import round_to

    spec, fusion = REG.op("add_gelu"), REG.fusions["add_gelu"]
    once = dataclasses.replace(fusion, round="once")
    rng = np.random.default_rng(0)
    x, y = (round_to(rng.standard_normal((4, 33)) * 4, "bfloat16") for _ in range(2))
    args = {"input": x, "other": y, "approximate": "none"}
    got = _reference(spec, once, args)
    f32 = {"input": x.astype(np.float32), "other": y.astype(np.float32), "approximate": "none"}
    np.testing.assert_array_equal(got, round_to(derive.reference("add_gelu")(**f32), "bfloat16"))
    each = _reference(spec, fusion, args)
    assert got.dtype == each.dtype and not np.array_equal(got, each)  # two roundings differ
