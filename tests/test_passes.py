"""Graph passes keep the function: random small models give the same outputs before and after."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

import refcore
from refcore.passes.channels_last import channels_last, channels_last_graph
from refcore.passes.dropout import drop_dropout
from refcore.passes.fold_bn import fold_batch_norm, fold_bn
from refcore.passes.fold_constants import fold_constants
from refcore.passes.functional import functionalize
from refcore.passes.fuse import fuse, fuse_attention
from refcore.registry import default_registry

ACTS = [nn.ReLU, nn.GELU, lambda: nn.GELU(approximate="tanh"), nn.SiLU, nn.Sigmoid]
FUSED_OPS = {f.op for f in default_registry().fusions.values() if f.op}
# model-level properties: each example builds, traces and runs models, so the ci profile's 200
# examples would cost minutes; 60 still cover every drawn variant many times
MODEL_EXAMPLES = settings(max_examples=min(60, settings.default.max_examples))


def _randomize_bn(bn: nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        bn.running_mean.normal_(generator=g)
        bn.running_var.uniform_(0.5, 2.0, generator=g)
        bn.weight.normal_(generator=g)
        bn.bias.normal_(generator=g)


@st.composite
def mlps(draw) -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    width, layers = draw(st.integers(1, 12)), []
    for _ in range(draw(st.integers(1, 4))):
        out = draw(st.integers(1, 12))
        layers.append(nn.Linear(width, out, bias=draw(st.booleans())))
        kind = draw(st.sampled_from(["act", "bn", "ln", "none"]))
        if kind == "act":
            layers.append(draw(st.sampled_from(ACTS))())
        elif kind == "bn":
            layers.append(nn.BatchNorm1d(out))
            _randomize_bn(layers[-1], g)
        elif kind == "ln":
            layers.append(nn.LayerNorm(out))
        width = out
    model = nn.Sequential(*layers).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model, torch.randn(draw(st.integers(1, 5)), model[0].in_features, generator=g)


@st.composite
def convnets(draw) -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    c, layers = draw(st.integers(1, 4)), []
    for _ in range(draw(st.integers(1, 3))):
        out, k = draw(st.integers(1, 6)), draw(st.sampled_from([1, 3]))
        layers.append(nn.Conv2d(c, out, k, padding=k // 2, bias=draw(st.booleans())))
        layers.append(nn.BatchNorm2d(out))
        _randomize_bn(layers[-1], g)
        if draw(st.booleans()):
            layers.append(nn.ReLU())
        c = out
    return nn.Sequential(*layers).eval(), torch.randn(2, layers[0].in_channels, 5, 5, generator=g)


@st.composite
def group_norm_nets(draw) -> tuple[nn.Module, torch.Tensor]:
    """Conv / GroupNorm / SiLU stacks as in a diffusion UNet's ResNet blocks (no batch-norm: a
    group norm after folded layers amplifies their rounding when its block is near constant)."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    c, layers = draw(st.integers(1, 8)), []
    for _ in range(draw(st.integers(1, 3))):
        out = draw(st.integers(1, 8))
        layers.append(nn.Conv2d(c, out, 3, padding=1))
        groups = draw(st.sampled_from([d for d in range(1, out + 1) if out % d == 0]))
        layers.append(nn.GroupNorm(groups, out, affine=draw(st.booleans())))
        if layers[-1].affine:
            with torch.no_grad():
                layers[-1].weight.normal_(generator=g)
                layers[-1].bias.normal_(generator=g)
        if draw(st.booleans()):
            layers.append(nn.SiLU())
        c = out
    return nn.Sequential(*layers).eval(), torch.randn(2, layers[0].in_channels, 5, 5, generator=g)


def _same(model: nn.Module, gm: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)


def test_fold_batch_norm_matches_torch() -> None:
    from torch.nn.utils.fusion import fuse_conv_bn_weights

    g = torch.Generator().manual_seed(0)
    for shape in [(8, 3, 3, 3), (4, 1, 1, 1), (16, 8)]:
        w, b = torch.randn(shape, generator=g), torch.randn(shape[0], generator=g)
        m, v = torch.randn(shape[0], generator=g), torch.rand(shape[0], generator=g) + 0.1
        gamma, beta = torch.randn(shape[0], generator=g), torch.randn(shape[0], generator=g)
        ours = fold_batch_norm(w, b, m, v, 1e-5, gamma, beta)
        theirs = fuse_conv_bn_weights(w, b, m, v, 1e-5, gamma, beta)
        torch.testing.assert_close(ours[0], theirs[0].detach())
        torch.testing.assert_close(ours[1], theirs[1].detach())


@given(mlps())
def test_functionalize_keeps_the_function(case) -> None:
    model, x = case
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    assert not [n for n in gm.graph.nodes if n.op == "call_module"]
    _same(model, gm, x)


@given(st.one_of(mlps(), convnets()))
def test_fold_bn_keeps_the_function(case) -> None:
    model, x = case
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    result = fold_bn(gm)
    left = [n for n in gm.graph.nodes if n.target is torch.nn.functional.batch_norm]
    unfoldable = sum(isinstance(b, nn.modules.batchnorm._BatchNorm)
                     and not isinstance(a, (nn.Linear, nn.Conv2d))
                     for a, b in zip(model, list(model)[1:]))  # fmt: skip
    assert len(left) == unfoldable, "every linear/conv -> batch_norm pair folds"
    assert result.changed == sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model) - (
        unfoldable
    )
    assert sum(int(line.split()[1]) for line in result.left) == unfoldable, result.left
    _same(model, gm, x)


@given(group_norm_nets())
def test_fuse_group_norm_silu_keeps_the_function(case) -> None:
    model, x = case
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    notes: list[str] = []
    fuse(gm, "reference", FUSED_OPS, notes)
    _same(model, gm, x)
    pairs = sum(isinstance(a, nn.GroupNorm) and isinstance(b, nn.SiLU)
                for a, b in zip(model, list(model)[1:]))  # fmt: skip
    fused = [n.target.op for n in gm.graph.nodes if type(n.target).__name__ == "FusedOp"]
    assert fused.count("group_norm_silu") == pairs, notes


@given(mlps())
def test_fuse_keeps_the_function(case) -> None:
    model, x = case
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    notes: list[str] = []
    fuse(gm, "reference", FUSED_OPS, notes)
    _same(model, gm, x)
    fusable = sum(isinstance(a, nn.Linear) and isinstance(b, (nn.ReLU, nn.GELU, nn.SiLU))
                  for a, b in zip(model, list(model)[1:]))  # fmt: skip
    fused = sum(type(n.target).__name__ == "FusedOp" for n in gm.graph.nodes)
    assert fused == fusable, notes


class _Residual(nn.Module):
    """conv -> + residual -> relu (a ResNet block's tail)."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.relu(self.conv(x) + x)


@pytest.mark.parametrize("inplace", [True, False])
def test_fuse_conv_residual_add_relu(inplace: bool) -> None:
    """Also ``y += x`` (operator.iadd, as dynamo captures ResNet's residual add; fx traces it as
    operator.add, so the test writes the in-place form into the graph)."""
    import operator

    model = _Residual(3).eval()
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    if inplace:
        (add,) = [n for n in gm.graph.nodes if n.target is operator.add]
        add.target = operator.iadd
        gm.recompile()
    notes: list[str] = []
    fuse(gm, "reference", FUSED_OPS, notes)
    fused = [n.target.op for n in gm.graph.nodes if type(n.target).__name__ == "FusedOp"]
    assert fused == ["conv2d_add_relu"], notes
    _same(model, gm, torch.randn(2, 3, 6, 6))


def test_unimplemented_fused_op_is_left_unfused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    gm = functionalize(torch.fx.symbolic_trace(model))
    notes: list[str] = []
    fuse(gm, "auto", set(), notes)
    assert not [n for n in gm.graph.nodes if type(n.target).__name__ == "FusedOp"]
    assert any("left unfused" in n for n in notes)


@given(st.one_of(mlps(), convnets()), st.integers(1, 7))
def test_optimize_keeps_the_function_at_other_batch_sizes(case, batch) -> None:
    model, x = case
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = refcore.optimize(model, provider="reference", example_inputs=(x,))
    _same(model, fast, torch.cat([x] * batch))  # another batch size than the example's
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), "optimize changed the caller's model"


def test_optimize_bad_input() -> None:
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got function"):
        refcore.optimize(lambda x: x)
    with pytest.raises(ValueError, match="unknown passes"):
        refcore.optimize(nn.ReLU(), passes=["nope"])
    with pytest.raises(ValueError, match="parameters are on \\['meta'\\]"):
        refcore.optimize(nn.Linear(2, 2, device="meta"))


def test_untraceable_model_is_routed_and_noted() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x)) if x.sum() > 0 else self.lin(x)

    model, x = Branchy().eval(), torch.ones(2, 4)
    fast = refcore.optimize(model, provider="reference")
    assert any("not captured by torch.fx" in n for n in fast.notes)
    _same(model, fast, x)
    assert "reference/reference" in str(refcore.explain())
    # asked for by name, fx capture that cannot trace is an error, not another capture
    with pytest.raises(ValueError, match="capture='fx': torch.fx cannot trace Branchy"):
        refcore.optimize(model, provider="reference", capture="fx")


@MODEL_EXAMPLES
@given(mlps(), st.floats(0.0, 0.9))
def test_drop_dropout_keeps_the_function(case, p) -> None:
    model, x = case
    layers: list[nn.Module] = []
    for layer in model:
        layers += [layer, nn.Dropout(p)]
    with_dropout = nn.Sequential(*layers).eval()
    gm = torch.fx.symbolic_trace(copy.deepcopy(with_dropout))
    gm = drop_dropout(functionalize(gm))
    assert not [n for n in gm.graph.nodes if n.op == "call_module"]
    _same(with_dropout, gm, x)


def test_drop_dropout_keeps_training_dropout() -> None:
    class Functional(nn.Module):
        def forward(self, x):
            a = torch.nn.functional.dropout(x, 0.5, training=False)
            return torch.nn.functional.dropout(a, 0.5)  # training=True by default: kept

    gm = drop_dropout(torch.fx.symbolic_trace(Functional()))
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        torch.nn.functional.dropout
    ]


# parameter-only expressions: each maps a (n, n) weight to another (n, n) tensor
EXPRS = [
    lambda w, b: w * 2.0,
    lambda w, b: w.t(),
    lambda w, b: w + b,
    lambda w, b: torch.tanh(w),
    lambda w, b: w @ w.t() / w.shape[0],
    lambda w, b: torch.nn.functional.layer_norm(w, (w.shape[1],)),
]


class ParamExpr(nn.Module):
    def __init__(self, n: int, picks: list[int], g: torch.Generator) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n, generator=g))
        self.b = nn.Parameter(torch.randn(n, generator=g))
        self.picks = picks

    def forward(self, x):
        w = self.w
        for i in self.picks:
            w = EXPRS[i](w, self.b)
        return torch.nn.functional.linear(x, w, self.b) + self.b.sum()


@given(st.integers(1, 8), st.lists(st.integers(0, len(EXPRS) - 1), max_size=4),
       st.integers(0, 2**16))  # fmt: skip
def test_fold_constants_keeps_the_function(n, picks, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    model = ParamExpr(n, picks, g).eval()
    x = torch.randn(3, n, generator=g)
    gm = torch.fx.symbolic_trace(copy.deepcopy(model))
    result = fold_constants(gm)
    _same(model, gm, x)
    computed = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(computed) == 2, gm.code  # linear(x, ...) + folded constant; nothing else left
    assert result.changed == (1 if not picks else 2)


def test_fold_constants_leaves_random_ops() -> None:
    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x + torch.rand_like(self.w)

    assert fold_constants(torch.fx.symbolic_trace(Noisy())).changed == 0


@MODEL_EXAMPLES
@given(convnets())
def test_channels_last_keeps_the_function(case) -> None:
    model, x = case
    fast = copy.deepcopy(model)
    assert channels_last(fast) == sum(isinstance(m, nn.Conv2d) for m in model)
    for m in fast.modules():
        if isinstance(m, nn.Conv2d):
            assert m.weight.is_contiguous(memory_format=torch.channels_last)
    _same(model, fast, x)
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    fold_bn(gm)
    assert channels_last_graph(gm) == sum(isinstance(m, nn.Conv2d) for m in model)
    _same(model, gm, x)


class EagerAttention(nn.Module):
    """Attention spelled out, in the variants real models write."""

    def __init__(self, scale: str, masked: bool, swap: tuple[int, int]) -> None:
        super().__init__()
        self.scale, self.masked, self.swap = scale, masked, swap

    def forward(self, q, k, v, mask):
        s = q @ k.transpose(*self.swap)
        if self.scale == "mul":
            s = s * (q.shape[-1] ** -0.5)
        elif self.scale == "div":
            s = s / 3.0
        if self.masked:
            s = s + mask
        return torch.matmul(torch.softmax(s, dim=-1), v)


@MODEL_EXAMPLES
@given(st.sampled_from(["mul", "div", "none"]), st.booleans(),
       st.sampled_from([(-2, -1), (-1, -2), (2, 3)]),
       st.tuples(*[st.integers(1, 5)] * 5), st.integers(0, 2**16))  # fmt: skip
def test_fuse_attention_keeps_the_function(scale, masked, swap, dims, seed) -> None:
    b, h, lq, lk, e = dims
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, e, generator=g) for n in (lq, lk, lk))
    mask = torch.where(torch.rand(b, 1, lq, lk, generator=g) < 0.3, -1e9, 0.0)
    model = EagerAttention(scale, masked, swap)
    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(q, k, v, mask)
    gm = fuse_attention(gm)
    assert gm.refcore_attention == 1, gm.code
    torch.testing.assert_close(gm(q, k, v, mask), model(q, k, v, mask), atol=1e-5, rtol=1e-5)


def test_fuse_attention_leaves_a_mask_of_unknown_or_other_dtype() -> None:
    model = EagerAttention("mul", True, (-2, -1))
    gm = fuse_attention(torch.fx.symbolic_trace(model))  # no shapes/dtypes known
    assert gm.refcore_attention == 0
    q = torch.randn(1, 1, 2, 4)
    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(q, q, q, torch.zeros(1, 1, 2, 2, dtype=torch.bool))
    assert fuse_attention(gm).refcore_attention == 0


@given(st.one_of(mlps(), convnets()), st.sampled_from(["reference", "auto"]))
def test_route_keeps_the_function_and_routes_without_a_mode(case, provider) -> None:
    from refcore.integration import RoutedOp, reporting, routable
    from refcore.passes.route import route

    model, x = case
    gm = functionalize(torch.fx.symbolic_trace(copy.deepcopy(model)))
    assert route(gm, provider).applied
    nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert not [n for n in nodes if routable(n.target)], "every spec'd torch call is a RoutedOp"
    routed = [n for n in nodes if isinstance(n.target, RoutedOp)]
    with reporting(provider) as rep:
        _same(model, gm, x)
    assert sum(n for _, n, _ in rep.rows()) == len(routed) > 0
    if provider == "reference":  # an explicit provider runs every call it accepts
        assert any(outcome == "reference/reference" for _, _, outcome in rep.rows()), str(rep)


def test_route_leaves_graphs_that_call_submodules() -> None:
    from refcore.passes.route import route

    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.GELU()))
    result = route(gm)
    assert not result.applied and "calls 2 submodule(s)" in result.left[0]
    assert [n.op for n in gm.graph.nodes].count("call_module") == 2


def test_in_place_tells_operator_and_from_iand() -> None:
    """operator.and_ / or_ are named for the keyword, not in place; operator's i-forms write
    their first argument (a 4-bit weight's unpacking was taken for an input write)."""
    import operator

    from refcore.passes import in_place, writes_inputs_or_state

    g = torch.fx.Graph()
    q, r = g.placeholder("q"), g.placeholder("r")
    lo = g.call_function(operator.and_, (q, 15))
    hi = g.call_function(operator.or_, (lo, g.call_function(operator.rshift, (q, 4))))
    g.output(hi)
    gm = torch.fx.GraphModule(nn.Module(), g)
    assert not any(in_place(n) for n in gm.graph.nodes)
    assert writes_inputs_or_state(gm) == ""
    with g.inserting_before(hi):
        g.call_function(operator.iand, (r, 3))
    gm = torch.fx.GraphModule(nn.Module(), g)
    assert [n.target for n in gm.graph.nodes if in_place(n)] == [operator.iand]
    assert writes_inputs_or_state(gm).startswith("r in place")


# in-place steps on a fresh tensor, then reads of it (canonicalize threads the reads)
_STEPS = {
    "add_": lambda c, x: c.add_(x),
    "mul_": lambda c, x: c.mul_(1.5),
    "clamp_": lambda c, x: c.clamp_(min=-0.25),
    "read": lambda c, x: c + 1.0,  # a read between the writes: it must see the earlier writes
}


@given(st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=6),
       st.integers(1, 5), st.integers(0, 2**31 - 1))  # fmt: skip
def test_canonicalize_keeps_the_function(steps, n, seed) -> None:
    """Reads after an in-place call read its result (the same tensor at run time): outputs are
    the same, and after threading no read of the fresh tensor comes after one of its writes."""
    from refcore.passes.canonical import canonicalize

    def f(x: torch.Tensor) -> torch.Tensor:
        c = x.new_zeros(x.shape)
        reads = []
        for s in steps:
            out = _STEPS[s](c, x)
            if s == "read":
                reads.append(out)
        return c.sum() + sum(r.sum() for r in reads)

    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    gm = torch.fx.symbolic_trace(f)
    want = gm(x)
    canonicalize(gm)
    torch.testing.assert_close(gm(x), want, rtol=0, atol=0)
    nodes = list(gm.graph.nodes)
    (fresh,) = [nd for nd in nodes if nd.target == "new_zeros"]
    writes = [i for i, nd in enumerate(nodes) if nd.op == "call_method" and nd.target in _STEPS]
    reads = [i for i, nd in enumerate(nodes) if fresh in nd.args and nd.target not in _STEPS]
    assert all(i < writes[0] for i in reads) if writes else True


def test_canonicalize_turns_recorded_sizes_into_values() -> None:
    """Under dynamo, ``v.size()[1]`` of a static dim becomes the int and the size read leaves
    the graph (PyG's scatter reads its message's size so, which kept the message alive)."""
    from refcore.passes.canonical import canonicalize

    seen = {}

    def backend(gm: torch.fx.GraphModule, example: list) -> object:
        seen["result"] = canonicalize(gm)
        seen["targets"] = [nd.target for nd in gm.graph.nodes]
        return gm.forward

    lin = nn.Linear(3, 5)  # its weight makes the feature dim static (a guard), after tracing

    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        m = x.index_select(0, i)
        size = m.size()[:0] + (x.shape[0],) + m.size()[1:]  # as PyG's scatter writes it
        return lin(m.new_zeros(size) + 2.0)

    torch._dynamo.reset()
    x, i = torch.randn(6, 3), torch.tensor([0, 2, 2, 5])
    with torch.no_grad():
        got = torch.compile(f, backend=backend, dynamic=True)(x, i)
        torch.testing.assert_close(got, f(x, i))
    assert seen["result"].changed >= 1 and "size" not in seen["targets"], seen
