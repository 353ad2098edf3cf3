"""Pack / unpack references of the prepacked weight layouts (specs/layouts.yaml).

A weight (N, K) is zero-padded to whole blocks and reordered; unpack drops the padding again, so
``unpack(pack(w), w.shape) == w`` bit for bit (NaN payloads included: only copies, no arithmetic).
"""

from __future__ import annotations

from typing import Any

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


#: a conv the onednn_conv layout's blocked weight is made for: (input size (N, C, H, W), stride,
#: padding, dilation (pairs, symmetric padding), groups)
OnednnConvKey = tuple[tuple[int, ...], tuple[int, int], tuple[int, int], tuple[int, int], int]


def onednn_conv_key(weight_shape: tuple[int, ...], input_size: tuple[int, ...], stride: Any,
                    padding: Any, dilation: Any, groups: int) -> OnednnConvKey | None:  # fmt: skip
    """The `OnednnConvKey` of a conv2d call, or None when oneDNN's pointwise conv cannot run it
    (padding that differs top / bottom or left / right: 'same' with an even kernel)."""
    from refcore.ops.conv import pads, pair

    dil = pair(dilation)
    (top, bottom), (left, right) = pads(padding, _Shape(weight_shape), dil)
    if top != bottom or left != right:
        return None
    return (tuple(int(d) for d in input_size), pair(stride), (top, left), dil, int(groups))


class _Shape:  # what refcore.ops.conv.pads reads of a weight: its shape
    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def onednn_conv_reorder(weight: np.ndarray, key: OnednnConvKey) -> Any:
    """oneDNN's blocked form of ``weight`` for the conv ``key`` (a torch mkldnn tensor, a copy),
    or None where torch's oneDNN cannot reorder it here (no oneDNN; bf16 without a bf16 path)."""
    import torch

    from refcore import tensors

    if not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype == tensors.BFLOAT16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    size, stride, padding, dilation, groups = key
    w = tensors.to_torch(np.ascontiguousarray(weight))
    return torch.ops.mkldnn._reorder_convolution_weight(
        w, list(padding), list(stride), list(dilation), groups, list(size)
    )


def pack_onednn_conv(weight: np.ndarray, input_size: Any = None, stride: Any = 1,
                     padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:  # fmt: skip
    """(O, C / groups, kH, kW) -> (the same array, ``{key: oneDNN's blocked weight}``) for the
    conv of the params (see specs/layouts.yaml); the blocked weight is left out when the input
    size is not given or oneDNN cannot run the conv or dtype here."""
    _checks.rank("pack_onednn_conv", "weight", weight, (4,), " (O, C / groups, kH, kW)")
    held: dict[Any, Any] = {}
    if input_size is not None:
        key = onednn_conv_key(weight.shape, input_size, stride, padding, dilation, groups)
        form = None if key is None else onednn_conv_reorder(weight, key)
        if form is not None:
            held[key] = form
    return np.ascontiguousarray(weight), held


def unpack_onednn_conv(packed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The weight back from `pack_onednn_conv` (its data is the weight)."""
    _logical("unpack_onednn_conv", packed, shape, tuple(shape))
    return np.ascontiguousarray(packed)
