"""Pack / unpack references of the prepacked weight layouts (specs/layouts.yaml).

A weight (N, K) is zero-padded to whole blocks and reordered; unpack drops the padding again, so
``unpack(pack(w), w.shape) == w`` bit for bit (NaN payloads included: only copies, no arithmetic).
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks


def _padded(op: str, weight: np.ndarray, bn: int, bk: int) -> np.ndarray:
    _checks.rank(op, "weight", weight, (2,), " (N, K)")
    n, k = weight.shape
    out = np.zeros((-(-n // bn) * bn, -(-k // bk) * bk), weight.dtype)
    out[:n, :k] = weight
    return out


def _logical(op: str, packed: np.ndarray, shape: tuple[int, int], want: tuple[int, ...]) -> None:
    if tuple(packed.shape) != want:
        _checks.fail(op, "packed", f"shape {want} for weight shape {tuple(shape)}", packed.shape)


def pack_amx_bf16_vnni2(weight: np.ndarray) -> np.ndarray:
    """(N, K) -> (ceil(N/16), ceil(K/32), 16, 16, 2), packed[nb, kb, r, c, t] =
    weight[16 nb + c, 32 kb + 2 r + t]."""
    p = _padded("pack_amx_bf16_vnni2", weight, 16, 32)
    nb, kb = p.shape[0] // 16, p.shape[1] // 32
    # (nb, c, kb, r, t) -> (nb, kb, r, c, t)
    return np.ascontiguousarray(p.reshape(nb, 16, kb, 16, 2).transpose(0, 2, 3, 1, 4))


def unpack_amx_bf16_vnni2(packed: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The (N, K) weight back from `pack_amx_bf16_vnni2`."""
    n, k = shape
    nb, kb = -(-n // 16), -(-k // 32)
    _logical("unpack_amx_bf16_vnni2", packed, shape, (nb, kb, 16, 16, 2))
    full = packed.transpose(0, 3, 1, 2, 4).reshape(nb * 16, kb * 32)
    return np.ascontiguousarray(full[:n, :k])


def pack_avx512_f32_panel32(weight: np.ndarray) -> np.ndarray:
    """(N, K) -> (ceil(N/32), K, 32): packed[nb, k, c] = weight[32 nb + c, k]."""
    p = _padded("pack_avx512_f32_panel32", weight, 32, 1)
    nb, k = p.shape[0] // 32, p.shape[1]
    return np.ascontiguousarray(p.reshape(nb, 32, k).transpose(0, 2, 1))


def unpack_avx512_f32_panel32(packed: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The (N, K) weight back from `pack_avx512_f32_panel32`."""
    n, k = shape
    nb = -(-n // 32)
    _logical("unpack_avx512_f32_panel32", packed, shape, (nb, k, 32))
    return np.ascontiguousarray(packed.transpose(0, 2, 1).reshape(nb * 32, k)[:n])
