"""Shared runtime pieces for the numba kernels: bf16 bit casts, views, thread count.

bf16 travels as uint16 bit patterns: widen with ``bf16_to_f32`` (a shift into the high half), and
narrow with ``f32_to_bf16`` (round-to-nearest-even, NaN kept quiet), exactly as torch and ml_dtypes
round fp32 to bf16. The bit casts are LLVM bitcasts (numba has no scalar view), so they vectorize.

Example:
    >>> import numpy as np
    >>> as_bits(np.zeros(2, np.float32)).dtype
    dtype('float32')
"""

from __future__ import annotations

import sys

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from refcore.tensors import BFLOAT16


@intrinsic
def _u32_as_f32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@intrinsic
def _f32_as_u32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@numba.njit(inline="always", cache=True)
def bf16_to_f32(h):
    return _u32_as_f32(np.uint32(h) << np.uint32(16))


@numba.njit(inline="always", cache=True)
def f32_to_bf16(f):
    u = _f32_as_u32(np.float32(f))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) | np.uint32(0x40))  # NaN: keep it a quiet NaN
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    return np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


def as_bits(a: np.ndarray) -> np.ndarray:
    """The array numba sees: bf16 as a uint16 view, float32 as is (no copy)."""
    return a.view(np.uint16) if a.dtype == BFLOAT16 else a


def from_bits(a: np.ndarray, like_dtype: np.dtype) -> np.ndarray:
    """Undo `as_bits` on an output (no copy)."""
    return a.view(BFLOAT16) if like_dtype == BFLOAT16 else a


def sync_threads() -> None:
    """Run numba's parallel regions on as many threads as torch uses (when torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is not None and not _launched:
        _launch_keeping(torch)
    want = torch.get_num_threads() if torch is not None else numba.config.NUMBA_NUM_THREADS
    want = max(1, min(want, numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != want:
        numba.set_num_threads(want)


_launched = False


def _launch_keeping(torch) -> None:
    """Start numba's thread pool and keep torch's thread count as it was.

    numba starts its pool on first use; its OpenMP layer then sets the OpenMP thread count to
    ``NUMBA_NUM_THREADS``, and torch reads its own count from that same OpenMP setting, so without
    this a user's ``torch.set_num_threads(1)`` came back as 2 after the first numba kernel.
    """
    global _launched
    before = torch.get_num_threads()
    numba.get_num_threads()  # launches the pool
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)
    _launched = True
