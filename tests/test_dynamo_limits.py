"""An optimized model stays captured and routed when other compiled copies of its model class
have used up dynamo's recompile limit (it counts every graph of the class's forward code)."""

from __future__ import annotations

import copy

import torch

import refcore


def _tiny_bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    return BertModel(cfg).eval()


def test_a_model_class_compiled_elsewhere_does_not_leave_optimize_uncaptured() -> None:
    torch._dynamo.reset()
    model = _tiny_bert()
    ids = torch.randint(1, 100, (2, 8))
    other = torch.compile(copy.deepcopy(model), backend="eager")
    # (config.patch, not monkeypatch: undoing a setattr on dynamo's config hides the option)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        other(input_ids=ids)  # the class's forward code now holds the one graph the limit allows
        fast = refcore.optimize(model, provider="reference")
        got = fast(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, model(input_ids=ids).last_hidden_state, atol=1e-4, rtol=1e-4)
    assert "reference/reference" in str(refcore.explain()), refcore.explain()
    torch._dynamo.reset()
