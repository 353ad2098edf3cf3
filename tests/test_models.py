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

    assert main("auto") == 0
    out = capsys.readouterr().out
    assert "cosine(refcore, torch)" in out and "which kernel ran each op" in out
