"""Backward references of the attention family (refcore.ops.grad): scaled_dot_product_attention."""

from __future__ import annotations

import math

import numpy as np

from refcore.ops.grad.elementwise import unbroadcast
from refcore.tensors import round_to

f64 = np.float64


def scaled_dot_product_attention(grad_output: np.ndarray, *, query: np.ndarray,
                                 key: np.ndarray, value: np.ndarray,
                                 attn_mask: np.ndarray | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False,
                                 scale: float | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """P = softmax(q k^T s + mask) as the forward (a row with nothing to attend is 0); with
    dO = g: dV = P^T dO, dS = P (dO V^T - rowsum(P dO V^T)), dQ = dS K s, dK = dS^T Q s."""
    q, k, v, g = f64(query), f64(key), f64(value), f64(grad_output)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    s = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else scale
    scores = (q @ np.swapaxes(k, -1, -2)) * s
    if is_causal:
        scores = np.where(np.tri(L, S, dtype=bool), scores, -np.inf)
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        scores = np.where(attn_mask, scores, -np.inf)
    elif attn_mask is not None:
        scores = scores + f64(attn_mask)
    top = np.max(scores, axis=-1, keepdims=True, initial=-np.inf)
    e = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return {
        "query": round_to(unbroadcast(ds @ k * s, query.shape), query.dtype),
        "key": round_to(unbroadcast(np.swapaxes(ds, -1, -2) @ q * s, key.shape), key.dtype),
        "value": round_to(unbroadcast(np.swapaxes(p, -1, -2) @ g, value.shape), value.dtype),
    }
