"""Backward references of the attention family (refcore.ops.grad): scaled_dot_product_attention."""

from __future__ import annotations

import math

import numpy as np

from refcore.ops.attention import attention_probs
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
    E = q.shape[-1]
    s = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else scale
    p = attention_probs(query, key, attn_mask, is_causal, scale)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    return {
        "query": round_to(unbroadcast(ds @ k * s, query.shape), query.dtype),
        "key": round_to(unbroadcast(np.swapaxes(ds, -1, -2) @ q * s, key.shape), key.dtype),
        "value": round_to(unbroadcast(np.swapaxes(p, -1, -2) @ g, value.shape), value.dtype),
    }
