"""all-MiniLM-L6-v2 on its real weights, through refcore's references, against torch."""

from __future__ import annotations

import numpy as np
import pytest

from refcore.demo import SENTENCES, RecordingOps
from refcore.models.minilm import MiniLM, model_dir, torch_ops


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return MiniLM.load()


def test_model_code_matches_sentence_transformers(model: MiniLM, monkeypatch) -> None:
    """Our forward (on torch's functions) is the real model: agree with sentence-transformers."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir()), device="cpu")
    expected = st.encode(list(SENTENCES), normalize_embeddings=True).astype(np.float64)
    ours = model.encode(SENTENCES, torch_ops(), as_torch=True)
    assert (ours * expected).sum(1).min() > 0.99999


@pytest.mark.parametrize(("dtype", "min_cos"), [("float32", 0.99999), ("bfloat16", 0.99)])
def test_references_encode_like_torch(model: MiniLM, dtype: str, min_cos: float) -> None:
    rec = RecordingOps("reference")
    ours = model.encode(SENTENCES, rec, dtype=dtype)
    theirs = model.encode(SENTENCES, torch_ops(), dtype=dtype, as_torch=True)
    assert (ours * theirs).sum(1).min() > min_cos
    assert rec.counts["linear"] == 6 * 6 and rec.counts["scaled_dot_product_attention"] == 6
    assert all(why.chosen == ("reference", "reference") for why in rec.explained.values())


def test_demo_runs(capsys) -> None:
    from refcore.demo import main

    assert main(repeat=1) == 0
    out = capsys.readouterr().out
    assert "cosine per sentence" in out and "x eager" in out and "which kernel ran" in out
    assert "needs autograd" not in out  # the optimized module routes in grad mode too


def test_demo_says_when_the_cpu_level_is_capped(capsys, monkeypatch) -> None:
    from refcore.demo import _capability_note

    monkeypatch.setenv("REFCORE_CPU_CAPABILITY", "portable")
    assert "no AVX-512/AMX" in _capability_note()


PROVIDERS = ["reference", "auto"]


@pytest.fixture(scope="module")
def resnet():
    import torch
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    return ResNetModel(ResNetConfig()).eval().to(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, vocab_size=512)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_resnet50_optimized_matches_eager(resnet, provider: str) -> None:
    import torch

    import refcore

    x = torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = resnet(x).pooler_output
        fast = refcore.optimize(resnet, provider=provider)
        got = fast(x).pooler_output
        got_other_batch = fast(x[:1]).pooler_output
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got_other_batch, expected[:1], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_llama_greedy_tokens_identical(llama, provider: str) -> None:
    import torch

    import refcore

    ids = torch.tensor([[1, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        expected = llama.generate(ids, max_new_tokens=8, do_sample=False)
        logits = llama(ids).logits
        fast = refcore.optimize(llama, provider=provider)
        fast_logits = fast(ids).logits
        with refcore.enabled(provider=provider) as rep:
            got = llama.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, expected)
    assert rep.counts, "nothing was routed"
    torch.testing.assert_close(fast_logits, logits, atol=1e-4, rtol=1e-4)
    assert fast.notes


@pytest.mark.parametrize(("dtype", "min_cos"), [("float32", 0.9999), ("bfloat16", 0.99)])
def test_minilm_optimized_matches_eager_fp32(dtype: str, min_cos: float) -> None:
    """The real model through refcore.optimize (dynamo capture, passes, best kernels)."""
    import torch

    import refcore
    from refcore.demo import best_provider, embed
    from refcore.models import zoo

    torch._dynamo.reset()
    eager = zoo.minilm()
    enc = MiniLM.load().tokenizer.encode_batch(list(SENTENCES))
    batch = {"input_ids": torch.tensor([e.ids for e in enc]),
             "attention_mask": torch.tensor([e.attention_mask for e in enc])}  # fmt: skip
    fast = refcore.optimize(eager, dtype=getattr(torch, dtype), provider=best_provider())
    cos = (embed(fast, batch) * embed(eager, batch)).sum(1)
    assert float(cos.min()) >= min_cos, fast.notes
    assert any("captured by dynamo" in n for n in fast.notes)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_unet_optimized_matches_eager(dtype: str) -> None:
    """A Stable-Diffusion-style UNet (diffusers, random weights) through refcore.optimize with
    the best kernels: fp32 agrees with eager to fp32 rounding; bf16 is as close to the fp32
    model as eager bf16 is (both against fp32 eager), and its group_norm + SiLU pairs fuse."""
    import copy

    import torch

    import refcore
    from refcore.demo import best_provider
    from refcore.models import zoo

    torch._dynamo.reset()
    base = zoo.unet(channels=(32, 64), layers=1)
    inputs = zoo.inputs("unet", 2, 16)
    with torch.no_grad():
        ref = base(**inputs).sample
        dt = getattr(torch, dtype)
        model = base if dt == torch.float32 else copy.deepcopy(base).to(dt)
        low = {k: v.to(dt) if v.is_floating_point() else v for k, v in inputs.items()}
        eager = model(**low).sample.float()
        fast = refcore.optimize(model, dtype=dt, provider=best_provider())
        got = fast(**low).sample.float()
    assert any("group_norm_silu" in n for n in fast.notes), fast.notes
    if dt == torch.float32:
        torch.testing.assert_close(got, eager, atol=1e-4, rtol=1e-4)
    else:
        err_eager, err_fast = (eager - ref).abs().max(), (got - ref).abs().max()
        assert err_fast <= 2 * err_eager + 1e-2, (float(err_fast), float(err_eager))
        cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
        assert cos >= 0.999, float(cos)
