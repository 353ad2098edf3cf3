"""refcore.enable / enabled / disable: torch models run through refcore kernels, unchanged."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import refcore
from refcore.provider import Provider, installed, using_providers

PROVIDERS = ["reference", *sorted(n for n, p in installed().items()
                                  if n != "reference" and p.availability().available)]  # fmt: skip


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8),
        torch.nn.SiLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Softmax(dim=-1),
    ).eval()  # fmt: skip


@pytest.mark.parametrize("provider", [*PROVIDERS, "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_outputs_unchanged(provider: str, dtype: torch.dtype) -> None:
    model, x = _mlp().to(dtype), torch.randn(5, 16, dtype=dtype)
    with torch.no_grad():
        expected = model(x)
        with refcore.enabled(provider=provider) as rep:
            got = model(x)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    ran = {outcome for _, _, outcome in rep.rows()}
    if provider == "reference":
        assert "reference/reference" in ran, str(rep)
    assert refcore.explain() is rep


def test_routing_report_names_kernels_and_reasons() -> None:
    model, x = _mlp(), torch.randn(3, 16)
    rep = refcore.explain(model, x, provider="reference")
    text = str(rep)
    assert "torch.nn.functional.layer_norm" in text and "reference/reference" in text
    assert "torch.nn.functional.softmax" in text


def test_training_stays_on_torch_and_gradients_match() -> None:
    model, x = _mlp().train(), torch.randn(4, 16)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with refcore.enabled(provider="reference") as rep:
        model(x).sum().backward()
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)
    assert all(o == "torch: needs autograd" for _, _, o in rep.rows()), str(rep)


def test_enable_disable_global() -> None:
    x = torch.randn(3, 8)
    refcore.enable(provider="reference")
    try:
        torch.nn.functional.gelu(x)
        assert ("torch._C._nn.gelu" in str(refcore.explain())
                or "torch.nn.functional.gelu" in str(refcore.explain()))  # fmt: skip
    finally:
        refcore.disable()
    before = sum(refcore.explain().counts.values())
    torch.nn.functional.gelu(x)
    assert sum(refcore.explain().counts.values()) == before
    refcore.disable()  # a no-op when nothing is enabled


def test_unavailable_provider_warns_or_raises() -> None:
    broken = Provider(name="broken", probe=lambda: (False, "no compiler"))
    with using_providers(broken):
        with pytest.warns(RuntimeWarning, match="'broken' is unavailable \\(no compiler\\)"):
            with refcore.enabled(provider="broken"):
                torch.nn.functional.relu(torch.ones(2))
        with pytest.raises(RuntimeError, match="no compiler"):
            with refcore.enabled(provider="broken", strict=True):
                pass


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown provider 'nope'"):
        refcore.enable(provider="nope")
    with pytest.raises(ValueError, match="unknown ops \\['nope'\\]"):
        refcore.enable(ops=["nope"])
    with pytest.raises(TypeError, match="expected an op name, a module or a callable"):
        refcore.explain(42)


def test_ops_filter_limits_routing() -> None:
    with warnings.catch_warnings(), refcore.enabled(provider="reference", ops=["relu"]) as rep:
        torch.nn.functional.gelu(torch.ones(3))
        torch.nn.functional.relu(torch.ones(3))
    assert [f for f, _, _ in rep.rows()] == ["torch.nn.functional.relu"]


@pytest.mark.parametrize("provider", [*PROVIDERS, "auto"])
def test_minilm_sentence_embeddings(provider: str, monkeypatch) -> None:
    """Real weights through sentence-transformers, routed: cosine >= 0.9999 to eager fp32."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from refcore.demo import SENTENCES
    from refcore.models.minilm import model_dir

    st = SentenceTransformer(str(model_dir()), device="cpu")
    eager = st.encode(list(SENTENCES), normalize_embeddings=True)
    with refcore.enabled(provider=provider) as rep:
        ours = st.encode(list(SENTENCES), normalize_embeddings=True)
    assert float(np.min((ours * eager).sum(1))) >= 0.9999, str(rep)
    assert rep.counts, "no torch call was routed"


def test_torch_compile_backend_is_registered_and_keeps_the_function() -> None:
    import torch._dynamo

    from refcore.compile_backend import backend

    assert "refcore" in torch._dynamo.list_backends()
    model, x = _mlp(), torch.randn(4, 16)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend=backend(provider="reference"))(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert "reference/reference" in str(refcore.explain())


def _tiny_bert(attn: str = "sdpa") -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64,
                     attn_implementation=attn)  # fmt: skip
    return BertModel(cfg).eval()


def _ids(batch: int, seq: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(batch * 100 + seq)
    ids = torch.randint(1, 100, (batch, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[0, seq // 2 :] = 0  # padding in the first sentence
    return {"input_ids": ids, "attention_mask": mask}


def test_optimize_captures_transformers_models_with_dynamo_and_fuses() -> None:
    """BERT is not fx-traceable: dynamo captures it, dropout goes, the spec'd chains fuse, and
    other batch sizes and sequence lengths run without optimizing again."""
    torch._dynamo.reset()
    model = _tiny_bert()
    fast = refcore.optimize(model, provider="reference", example_inputs=_ids(2, 8))
    notes = "\n".join(fast.notes)
    assert "not captured by torch.fx" in notes and "captured by dynamo" in notes
    assert "drop_dropout" in notes and "into linear_gelu" in notes, notes
    assert "into add_layer_norm" in notes or "into linear_add" in notes, notes
    with torch.no_grad():
        for batch, seq in [(2, 8), (3, 13), (5, 21)]:
            inputs = _ids(batch, seq)
            got = fast(**inputs).last_hidden_state
            torch.testing.assert_close(got, model(**inputs).last_hidden_state, atol=1e-4,
                                       rtol=1e-4)  # fmt: skip
    assert "fused linear_gelu" in str(refcore.explain())
    assert "fused linear_gelu" in str(refcore.explain(fast, **_ids(2, 8)))
    with refcore.enabled("reference"), torch.no_grad():  # a caller's mode: not traced by dynamo
        got = fast(**_ids(2, 8)).last_hidden_state
    torch.testing.assert_close(got, model(**_ids(2, 8)).last_hidden_state, atol=1e-4, rtol=1e-4)


def test_optimize_falls_back_to_routing_when_capture_fails(monkeypatch) -> None:
    from refcore import pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("boom: this pass cannot handle the graph")

    torch._dynamo.reset()
    monkeypatch.setattr(pipeline, "run", broken)
    model = _tiny_bert()
    fast = refcore.optimize(model, provider="reference", example_inputs=_ids(2, 8))
    assert any("dynamo capture failed" in n and "boom" in n for n in fast.notes), fast.notes
    inputs = _ids(3, 5)
    with torch.no_grad():
        got = fast(**inputs).last_hidden_state
        torch.testing.assert_close(got, model(**inputs).last_hidden_state, atol=1e-4, rtol=1e-4)
    assert "reference/reference" in str(refcore.explain())


class _OptionalMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.lin(x)
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return torch.nn.functional.gelu(y)


def test_optimize_keeps_both_branches_of_an_optional_argument() -> None:
    """fx traces ``if mask is not None`` with a proxy for ``mask``: one branch for good. A
    forward with an argument defaulting to None is captured by dynamo, which guards on it."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _OptionalMask().eval()
    fast = refcore.optimize(model, provider="auto")
    assert any("not captured by torch.fx" in n and "default to None" in n for n in fast.notes)
    x = torch.randn(4, 16)
    mask = torch.rand(4, 16) > 0.5
    with torch.no_grad():
        for args in ((x,), (x, mask), (x,)):
            torch.testing.assert_close(fast(*args), model(*args))


def test_optimize_bfloat16_casts_weights_and_inputs() -> None:
    model = _mlp()
    x = torch.randn(4, 16)
    fast = refcore.optimize(model, dtype=torch.bfloat16, provider="auto", example_inputs=(x,))
    assert all(p.dtype == torch.float32 for p in model.parameters()), "caller's model changed"
    with torch.no_grad():
        got = fast(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), model(x), atol=2e-2, rtol=2e-2)
    with pytest.raises(TypeError, match="dtype expected a floating torch.dtype"):
        refcore.optimize(model, dtype=torch.int8)
    with pytest.raises(TypeError, match="example_inputs expected a tuple"):
        refcore.optimize(model, example_inputs=x)


def test_optimize_turns_eager_attention_into_sdpa() -> None:
    torch._dynamo.reset()
    model = _tiny_bert("eager")
    fast = refcore.optimize(model, provider="reference", example_inputs=_ids(2, 8))
    assert any("2 matmul-softmax-matmul pattern(s)" in n for n in fast.notes), fast.notes
    inputs = _ids(3, 11)
    with torch.no_grad():
        got = fast(**inputs).last_hidden_state
        torch.testing.assert_close(got, model(**inputs).last_hidden_state, atol=1e-4, rtol=1e-4)
    assert "torch.nn.functional.scaled_dot_product_attention" in str(refcore.explain())


def test_module_calls_with_torch_only_arguments_route() -> None:
    """nn.Embedding/EmbeddingBag/ReLU/SiLU/Softmax pass torch-only arguments: the specs' torch data
    maps them, an in-place call stays on torch (it must mutate its input), and x + y routes."""
    torch.manual_seed(0)
    emb, bag = torch.nn.Embedding(10, 4, padding_idx=0), torch.nn.EmbeddingBag(10, 4, mode="sum")
    ids, offsets, x = torch.tensor([1, 0, 3]), torch.tensor([0, 2]), torch.randn(3, 4)
    with torch.no_grad():
        expected = [emb(ids), bag(ids, offsets), torch.nn.Softmax(-1)(x), torch.relu(x), x + x]
        with refcore.enabled("reference") as rep:
            got = [emb(ids), bag(ids, offsets), torch.nn.Softmax(-1)(x), torch.nn.ReLU()(x), x + x]
            y = x.clone()
            torch.nn.ReLU(inplace=True)(y)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert torch.equal(y, torch.relu(x)), "the in-place call mutated its input"
    ran = {(f, o) for f, _, o in rep.rows()}
    for f in ("embedding", "embedding_bag", "softmax", "relu"):
        assert (f"torch.nn.functional.{f}", "reference/reference") in ran, rep
    assert any(f.startswith("torch.Tensor.") and o == "reference/reference" for f, o in ran), rep
    assert any("inplace=True" in o for _, o in ran), rep


def test_optimize_folds_batch_norms_of_a_dynamo_captured_resnet() -> None:
    from transformers import ResNetConfig, ResNetModel

    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = ResNetConfig(hidden_sizes=[8, 16, 16, 16], embedding_size=8, depths=[1, 1, 1, 1])
    model = ResNetModel(cfg).eval()
    for bn in model.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):  # non-trivial statistics to fold
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
    fast = refcore.optimize(model, provider="auto", example_inputs=(torch.randn(2, 3, 32, 32),))
    notes = "\n".join(fast.notes)
    assert "captured by dynamo" in notes and "freeze:" in notes and "fold_bn" in notes, notes
    with torch.no_grad():
        for batch, side in [(2, 32), (3, 40)]:
            x = torch.randn(batch, 3, side, side)
            torch.testing.assert_close(fast(x).pooler_output, model(x).pooler_output,
                                       atol=1e-4, rtol=1e-4)  # fmt: skip


def test_bench_overhead_rows_name_what_ran() -> None:
    from refcore.bench import overhead_rows

    rows = overhead_rows("reference", repeat=1)
    assert rows[0][:2] == ["call", "torch µs"] and len(rows) == 7
    ran = {r[0]: r[-1] for r in rows[1:]}
    assert ran["torch.tanh (not routed)"] == "-"
    assert ran["F.relu"] == "reference/reference"
    assert ran["x + 1.0 (kept on torch)"].startswith("torch: not a refcore add call")


def test_plannable_ops_are_those_whose_checks_read_no_tensor_values() -> None:
    from refcore.call import plannable
    from refcore.registry import default_registry

    reg = default_registry()
    assert plannable(reg.op("layer_norm")) and plannable(reg.op("linear"))
    assert not plannable(reg.op("embedding")) and not plannable(reg.op("embedding_bag"))
    # int8 codes are data no check reads; per-channel zero points (int64) are checked
    assert plannable(reg.op("qconv2d_relu_quantize")) and plannable(reg.op("qlinear"))
    assert not plannable(reg.op("dequantize_per_channel"))
    assert not plannable(reg.op("roi_align"))  # its boxes' values are checked (checked_values)


@pytest.mark.parametrize("provider", ["auto", "native", "reference"])
def test_a_bad_box_is_rejected_after_a_good_call_of_the_same_structure(provider: str) -> None:
    """A call's outcome does not depend on the calls before it: roi_align's checks read its
    boxes, so a valid call must not let the next one of the same shapes skip them."""
    x = torch.randn(1, 2, 4, 4)
    good = torch.tensor([[0.0, 0.0, 0.0, 2.0, 2.0]])
    refcore.run("roi_align", x, good, [2, 2], provider=provider)
    nan, past = [0.0, 0.0, 0.0, float("nan"), 2.0], [1.0, 0.0, 0.0, 2.0, 2.0]
    for bad, error, why in ((nan, ValueError, "finite"), (past, IndexError, "batch indices")):
        with pytest.raises(error, match=why):
            refcore.run("roi_align", x, torch.tensor([bad]), [2, 2], provider=provider)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_plan_binds_a_repeated_structure_as_bind_does(dtype: torch.dtype) -> None:
    from refcore.call import bind, plan
    from refcore.registry import default_registry

    spec = default_registry().op("layer_norm")
    x, w = torch.randn(6, 32, dtype=dtype), torch.randn(32, dtype=dtype)
    first = bind(spec, (x, [32], w), {"eps": 1e-3})
    p = plan(first, (x, [32], w), {"eps": 1e-3})
    assert p is not None
    x2, w2 = torch.randn(6, 32, dtype=dtype), torch.randn(32, dtype=dtype)
    fast, full = p.bind((x2, [32], w2), {"eps": 1e-3}), bind(spec, (x2, [32], w2), {"eps": 1e-3})
    assert fast.dtype == full.dtype and fast.arguments.keys() == full.arguments.keys()
    for name, v in full.arguments.items():
        if isinstance(v, np.ndarray):
            assert fast.arguments[name].ctypes.data == v.ctypes.data  # zero-copy views
            np.testing.assert_array_equal(fast.arguments[name], v)
        else:
            assert fast.arguments[name] == v


def test_a_repeated_structure_with_bad_indices_is_still_checked() -> None:
    """Embedding's checks read the indices: its calls are bound in full every time, so an index
    out of range on a structure seen before reaches torch (which raises), not the kernel."""
    w = torch.randn(10, 8)
    ok, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 2, 30])
    with refcore.enabled(provider=PROVIDERS[-1]), torch.no_grad():
        torch.testing.assert_close(torch.nn.functional.embedding(ok, w), w[ok])
        with pytest.raises(IndexError):
            torch.nn.functional.embedding(bad, w)


def test_a_fused_op_torch_runs_routes_the_calls_of_its_chain() -> None:
    """linear_gelu with no fused kernel runs as linear then gelu; gelu still reaches a kernel."""
    from refcore.integration import FusedOp, reporting
    from refcore.provider import Kernel

    seen = []

    def gelu(input, approximate="none"):
        seen.append(input.shape)
        return refcore.reference("gelu")(input, approximate=approximate)

    only_gelu = Provider(name="gelu_only", priority=5, kernels=(
        Kernel(op="gelu", name="g", fn=gelu, dtypes=frozenset({"float32"})),
    ))  # fmt: skip
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    with using_providers(only_gelu), reporting("gelu_only") as rep, torch.no_grad():
        got = FusedOp("linear_gelu", "gelu_only")(input=x, weight=w, bias=b, approximate="none")
    torch.testing.assert_close(got, torch.nn.functional.gelu(x @ w.T + b))
    assert seen == [(3, 5)]
    outcomes = {f: o for f, _, o in rep.rows()}
    assert outcomes["torch.nn.functional.gelu"] == "gelu_only/g", str(rep)
    assert outcomes["fused linear_gelu"].startswith("torch: "), str(rep)


def test_a_provider_disabled_after_a_call_is_not_run_from_the_memo() -> None:
    """Routing decisions are memoised per provider set: a structure seen with a provider on must
    not reach that provider's kernel inside `disabled` (nor the other way round)."""
    from refcore.provider import Kernel, disabled

    ran = []

    def relu(input, inplace=False):
        ran.append(1)
        return np.maximum(input, 0)

    toy = Provider(name="toy", kernels=(Kernel(op="relu", name="k", fn=relu,
                                               dtypes=frozenset({"float32"})),))  # fmt: skip
    x = torch.randn(4, 4)
    with using_providers(toy), torch.no_grad():
        with refcore.enabled("toy") as rep:
            torch.nn.functional.relu(x)
            with disabled("toy"):
                torch.nn.functional.relu(x)
            torch.nn.functional.relu(x)
    assert len(ran) == 2, str(rep)
    outcomes = {o for _, _, o in rep.rows()}
    assert "toy/k" in outcomes and any(o.startswith("torch: ") for o in outcomes), str(rep)


def test_an_op_no_kernel_implements_skips_the_routing_path(monkeypatch) -> None:
    """A call of an op the provider implements no kernel for goes straight to torch (no structure
    key, no binding: ~15 us a call, which a model pays ~3x between torch's parallel regions) and
    is still recorded; the verdict is per provider set, so an op that gains a kernel inside the
    enabled region routes again."""
    from refcore import integration
    from refcore.provider import Kernel

    def relu(input):
        return np.maximum(input, 0)

    keyed: list[Any] = []
    real_key = integration._key
    monkeypatch.setattr(integration, "_key", lambda *a: keyed.append(a) or real_key(*a))
    x = torch.randn(64, 64)
    none = Provider(name="toy", kernels=())
    some = Provider(name="toy", kernels=(Kernel(op="relu", name="c", fn=relu,
                                                dtypes=frozenset({"float32"})),))  # fmt: skip
    with torch.no_grad(), using_providers(none), refcore.enabled("toy"):
        y = torch.nn.functional.relu(x)
        assert not keyed
        with using_providers(some):
            torch.nn.functional.relu(x)
        assert keyed
    torch.testing.assert_close(y, torch.relu(x))
    rows = {o for f, _, o in refcore.explain().rows() if f == "torch.nn.functional.relu"}
    assert "torch: implements no kernel for relu" in rows and len(rows) == 2, rows
