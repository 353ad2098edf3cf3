"""Numba kernels for the int8 family (specs/int8.yaml): quantize_per_tensor and
dequantize_per_tensor, for CPUs where the native provider has no compiler or no vector tier.

Both run one flat loop over a dense input (C-contiguous or any permutation of it: channels-last,
a transpose) and give the output the same memory order, as the native kernels and torch's
``empty_like`` do; other strides are declined with the reason.

The float steps are the reference's (refcore/ops/int8.py), in float32: quantize computes
r = rint(x * float32(1 / scale)) (half to even), maps NaN to quant_min, clamps r to
[quant_min - zero_point, quant_max - zero_point] before adding the zero point (so +-inf and huge
values saturate without an integer overflow); dequantize computes float32(q - zero_point) *
float32(scale). Integer outputs are bit-exact; bf16 inputs are widened exactly.

Example:
    >>> import numpy as np
    >>> quantize_per_tensor(np.float32([0.5, -1.0, 300.0]), 0.5, 128, 0, 255, "uint8").tolist()
    [129, 126, 255]
"""

from __future__ import annotations

import numba
import numpy as np

from refcore import buffers
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_numba._runtime import as_bits, bf16_to_f32, sync_threads
from refcore_numba.elementwise import _dense_axes

F32 = np.float32


@numba.njit(inline="always", cache=True)
def _code(v, inv, lo, hi, zp, qmin):
    r = np.rint(v * inv)
    if r != r:  # NaN
        return qmin
    r = min(max(r, lo), hi)
    return np.int32(r) + zp


@numba.njit(parallel=True, cache=True)
def _quantize_f32(x, inv, lo, hi, zp, qmin, out):
    for i in numba.prange(x.size):
        out[i] = _code(x[i], inv, lo, hi, zp, qmin)


@numba.njit(parallel=True, cache=True)
def _quantize_bf16(x, inv, lo, hi, zp, qmin, out):
    for i in numba.prange(x.size):
        out[i] = _code(bf16_to_f32(x[i]), inv, lo, hi, zp, qmin)


@numba.njit(parallel=True, cache=True)
def _dequantize(q, zp, scale, out):
    for i in numba.prange(q.size):
        out[i] = F32(np.int32(q[i]) - zp) * scale


def _flat(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """``a`` as a C-contiguous permutation (a view) and the axes that give it."""
    axes = _dense_axes(a)
    assert axes is not None  # the rules decline other strides
    return a.transpose(axes), axes


def _dense_rule(call: Call) -> Verdict:
    a = call.arguments["input"]
    if a.size > 1 and _dense_axes(a) is None:
        return no(f"input has strides {a.strides} for shape {a.shape}: not dense in any order")
    return YES


def quantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                        quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
    sync_threads()
    x, axes = _flat(as_bits(input))
    out = buffers.empty(x.shape, np.dtype(dtype))
    fn = _quantize_bf16 if x.dtype == np.uint16 else _quantize_f32
    lo, hi = F32(quant_min - zero_point), F32(quant_max - zero_point)
    fn(x.reshape(-1), F32(1.0 / scale), lo, hi, np.int32(zero_point), np.int32(quant_min),
       out.reshape(-1))  # fmt: skip
    return out.transpose(np.argsort(axes))


def dequantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                          quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
    sync_threads()
    q, axes = _flat(input)
    out = buffers.empty(q.shape, np.float32)
    _dequantize(q.reshape(-1), np.int32(zero_point), F32(scale), out.reshape(-1))
    return out.transpose(np.argsort(axes))


_ANY = frozenset({"strided"})  # any strides: the rule declines what is not dense
_BOTH, _F32 = frozenset({"float32", "bfloat16"}), frozenset({"float32"})
KERNELS = (
    Kernel(
        "quantize_per_tensor",
        "quantize_per_tensor",
        quantize_per_tensor,
        _BOTH,
        _ANY,
        rule=_dense_rule,
    ),
    Kernel(
        "dequantize_per_tensor",
        "dequantize_per_tensor",
        dequantize_per_tensor,
        _F32,
        _ANY,
        rule=_dense_rule,
    ),
)
