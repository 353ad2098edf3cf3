"""Attention reference: scaled_dot_product_attention (inference: no dropout, no GQA).

Batch dims broadcast as in torch (query (4, 3, 8) with key / value (4, 4, 6, 8) gives (4, 4, 3, 8)).

Precision policy: upcast query, key, value (and a float mask) to float64, compute the scores, the
softmax and the weighted sum there, round once to the input dtype.
NOTE: torch's CPU flash kernel for bf16 rounds the softmax probabilities to bf16 before the
``P @ V`` product, so torch itself is up to a few 1e-3 off the round-once result (the spec's
``oracle_tolerance`` says so); fp32 agrees to ~1e-6.
"""

from __future__ import annotations

import math

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to

_OP = "scaled_dot_product_attention"


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def check_scaled_dot_product_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    attn_mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        _checks.rank(_OP, name, t, range(2, 99), " (..., seq, features)")
    # Batch dims broadcast as torch's matmuls do: query's with key's give the scores' (which a
    # mask must broadcast to without growing them), those with value's the output's.
    batch = _batch(query.shape[:-2], "key", key.shape)
    _batch(batch, "value", value.shape)
    L, E = query.shape[-2:]
    S = key.shape[-2]
    if key.shape[-1] != E:
        _checks.fail(_OP, "key", f"last dim {E} (query's feature size)", f"shape {key.shape}")
    if value.shape[-2] != S:
        _checks.fail(
            _OP, "value", f"dim -2 of size {S} (key's sequence length)", f"shape {value.shape}"
        )
    if attn_mask is not None:
        target = (*batch, L, S)
        try:
            ok = np.broadcast_shapes(attn_mask.shape, target) == target
        except ValueError:
            ok = False
        if not ok:
            _checks.fail(_OP, "attn_mask", f"a shape broadcastable to {target}", attn_mask.shape)
        if is_causal:
            _checks.fail(_OP, "attn_mask", "None when is_causal=True", f"shape {attn_mask.shape}")


def _batch(batch: tuple[int, ...], name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``batch`` broadcast with the batch dims of argument ``name`` of ``shape``."""
    try:
        return np.broadcast_shapes(batch, shape[:-2])
    except ValueError:
        _checks.fail(_OP, name, f"batch dims broadcastable with {batch}", f"shape {shape}")
        raise  # unreachable


def scaled_dot_product_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    attn_mask: np.ndarray | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> np.ndarray:
    """softmax(query @ key^T * scale + mask) @ value; a bool mask's True means "attend"."""
    check_scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale
    )
    probs = attention_probs(query, key, attn_mask, is_causal, scale)
    return round_to(probs @ _f64(value), query.dtype)


def attention_probs(query: np.ndarray, key: np.ndarray, attn_mask: np.ndarray | None,
                    is_causal: bool, scale: float | None) -> np.ndarray:  # fmt: skip
    """softmax(query @ key^T * scale + mask) in float64, unrounded (the backward reads it too);
    a row with nothing to attend is 0."""
    L, E = query.shape[-2:]
    S = key.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else 1.0  # E == 0: every score is 0 whatever the scale
    scores = (_f64(query) @ np.swapaxes(_f64(key), -1, -2)) * scale
    if is_causal:  # top-left aligned: query i sees keys j <= i, also when L != S
        scores = np.where(np.tri(L, S, dtype=bool), scores, -np.inf)
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        scores = np.where(attn_mask, scores, -np.inf)
    elif attn_mask is not None:
        scores = scores + _f64(attn_mask)
    # NOTE: a row with nothing to attend (all masked, or S == 0) gives 0, as torch 2.13 does on
    # CPU for fp32 and bf16 (its math path uses _safe_softmax; the flash kernel agrees).
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)
