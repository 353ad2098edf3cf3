"""``python -m refcore generate``: SmolLM2-135M-Instruct continuing a prompt, greedily, token by
token, eager or through `refcore.optimize`; then the prefill time, the decode rate and the kernels
a decode step ran.

The model has real trained weights (`refcore.models.zoo.smollm2`, offline); greedy decoding makes
the text a function of the model alone, so eager and optimized runs can be compared token for
token (tests/test_llm.py does).

Example:
    >>> g = generate("The capital of France is", max_new_tokens=8)   # doctest: +SKIP
    >>> g.text                                                         # doctest: +SKIP
    ' Paris.\\n\\nThe answer is:'
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}


@dataclass
class Generation:
    """What one `generate` call made and how long it took."""

    prompt_tokens: int
    tokens: list[int]
    text: str
    prefill_s: float  # prompt in, first new token out
    decode_s: list[float] = field(default_factory=list)  # each further token
    report: Any = None  # refcore's routing report of the last decode step (optimize only)

    @property
    def tokens_per_s(self) -> float:
        return len(self.decode_s) / sum(self.decode_s) if self.decode_s else 0.0


#: generate's group size per scheme when none is given (else the scheme's own, specs/schemes.yaml)
GROUP_SIZES = {"woq_int8": 64}
#: layers generate keeps in float per scheme: SmolLM2's GGUF keeps its output layer (tied to the
#: token embedding) at 8 bits (Q8_0), as llama.cpp runs it; in 4 bits it costs 6% of perplexity
SKIP = {"woq_int4": ("lm_head",)}


def _group(scheme: str, group_size: int | None) -> int | None:
    """The group size generate quantizes ``scheme`` with: ``group_size`` (0: per channel, None),
    else `GROUP_SIZES`' or the scheme's own."""
    from refcore.registry import default_registry

    if group_size is not None:
        return group_size or None
    return GROUP_SIZES.get(scheme, default_registry().quant_schemes[scheme].group_size)


def generate(prompt: str, *, max_new_tokens: int = 32, dtype: str = "float32",
             provider: str = "auto", optimize: bool = True, chat: bool = False,
             scheme: str | None = None, group_size: int | None = None,
             stream: TextIO | None = None,
             loaded: tuple[Any, Any] | None = None) -> Generation:  # fmt: skip
    """Continue ``prompt`` with SmolLM2 (greedy, at most ``max_new_tokens``, stopping at the end
    of sequence), writing the text to ``stream`` as it comes. ``chat`` wraps the prompt in the
    model's chat template; ``loaded`` reuses a (model, tokenizer) of `zoo.smollm2`. ``scheme``
    (``woq_int8``, ``woq_int4``) quantizes the linear layers first (`refcore.quantize`, a scale
    per ``group_size`` weights: by default 64 for woq_int8, whose per-channel scales cost this
    model 1.3% of perplexity, and the scheme's 32 for woq_int4); the quantized layers route
    themselves and the rest runs eager (``optimize`` is not applied on top of a quantized model
    yet)."""
    import torch

    import refcore
    from refcore.integration import report, reporting
    from refcore.models import zoo
    from refcore.quantize import SCHEMES

    if scheme is not None and scheme not in SCHEMES:
        raise ValueError(f"generate: scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    if scheme == "woq_int4" and group_size == 0:
        raise ValueError("generate: woq_int4 has no per-channel form here; group_size 0 is for "
                         "woq_int8")  # fmt: skip
    if dtype not in DTYPES:
        raise ValueError(f"generate: dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1; got {max_new_tokens}")
    model, tokenizer = loaded or zoo.smollm2(getattr(torch, DTYPES[dtype]))
    if chat:
        turn = [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    else:
        text = prompt
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    if scheme is not None:
        run = refcore.quantize(model, scheme, provider, group_size=_group(scheme, group_size),
                               skip=SKIP.get(scheme, ()))  # fmt: skip
    else:
        run = refcore.optimize(model, provider=provider) if optimize else model
    made: list[int] = []
    t0 = time.perf_counter()
    first: list[float] = []

    def on_token(tok: Any) -> None:
        if not first:
            first.append(time.perf_counter() - t0)
        made.append(int(tok[0, 0]))
        if stream is not None:  # token by token (one that ends inside a character shows a mark)
            stream.write(tokenizer.decode(made[-1:], skip_special_tokens=True))
            stream.flush()

    with torch.no_grad(), reporting(provider) as rep:  # what quantized layers ran, if any
        _, steps = zoo.greedy_decode(run, ids, max_new_tokens - 1, on_token,
                                     stop=tokenizer.eos_token_id)  # fmt: skip
    ran = rep if scheme is not None else report() if optimize else None
    return Generation(prompt_tokens=ids.shape[1], tokens=made,
                      text=tokenizer.decode(made, skip_special_tokens=True), prefill_s=first[0],
                      decode_s=steps, report=ran)  # fmt: skip


def main(prompt: str, max_new_tokens: int, dtype: str, provider: str, eager: bool,
         chat: bool, scheme: str | None = None, group_size: int | None = None) -> int:  # fmt: skip
    out = sys.stdout
    out.write(prompt)
    out.flush()
    g = generate(prompt, max_new_tokens=max_new_tokens, dtype=dtype, provider=provider,
                 optimize=not eager, chat=chat, scheme=scheme, group_size=group_size,
                 stream=out)  # fmt: skip
    how = "eager" if eager else f"refcore.optimize(provider={provider!r})"
    if scheme is not None:
        group_size = _group(scheme, group_size)
        per = f"a scale per {group_size} weights" if group_size else "a scale per channel"
        how = f"refcore.quantize({scheme}, {per}, provider={provider!r}), eager elsewhere"
    rate = f"{g.tokens_per_s:.1f} tokens/s (the first calls include graph capture)"
    out.write(f"\n\n[{how}, {DTYPES[dtype]}] prompt {g.prompt_tokens} tokens: prefill "
              f"{g.prefill_s * 1e3:.0f} ms; {len(g.decode_s)} more tokens at {rate}\n")  # fmt: skip
    if g.report is not None:
        what = "the quantized layers ran" if scheme is not None else "a decode step ran"
        out.write(f"{what}:\n{g.report}\n")
    return 0
