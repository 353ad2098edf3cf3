"""Output buffers for kernels: large arrays come from a bounded pool of recycled memory blocks.

A fresh large allocation page-faults on its first write, one fault per 4 KiB page: on this
project's machine ``empty(64 MB)`` plus a fill costs ~30 ms against ~3 ms into memory already
touched, and in a transformer forward pass the faults cost more than some kernels. Providers
allocate their outputs with `empty`; an array of at least `MIN_BYTES` is a view of a block from
the pool, and the block goes back to the pool when the last array, view or torch tensor sharing its
memory is gone (the caching-allocator idea of torch's CUDA allocator, here for CPU outputs). So the
caller owns an ordinary array that no one else writes, and a repeated call of the same shape writes
into memory that is already mapped.

The pool keeps freed blocks up to ``REFCORE_BUFFER_POOL_MB`` megabytes (default 1024; ``0`` turns
pooling off, every output is then a plain ``np.empty``). Blocks are 64-byte aligned and sized in
classes of at most 25% slack, so nearby shapes (another sequence length) share blocks.

Example:
    >>> a = empty((512, 512), "float32")
    >>> a.shape, a.dtype.name, a.ctypes.data % 64
    ((512, 512), 'float32', 0)
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from typing import Any

import numpy as np

from refcore import tensors

MIN_BYTES = 1 << 18  # below this, malloc's own free lists serve the array without page faults
POOL_ENV = "REFCORE_BUFFER_POOL_MB"
_ALIGN = 64


class _Pool:
    """Free blocks by size class, at most ``limit`` bytes cached."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.cached = 0
        self.free: dict[int, list[tuple[np.ndarray, int]]] = {}  # (block, its address)
        # re-entrant: a _Lease in a reference cycle is freed by whichever allocation triggers the
        # garbage collector, possibly one made while this thread holds the lock (give's
        # setdefault); its __del__ then calls give, which a plain Lock would deadlock
        self.lock = threading.RLock()
        self.hits = self.misses = 0
        self.mapped = 0  # bytes of the blocks this pool made that are alive: leased or cached

    def take(self, size: int) -> tuple[np.ndarray, int]:
        with self.lock:
            blocks = self.free.get(size)
            if blocks:
                self.cached -= size
                self.hits += 1
                return blocks.pop()
            self.misses += 1
            self.mapped += size
        raw = np.empty(size + _ALIGN, np.uint8)
        addr = raw.ctypes.data
        off = -addr % _ALIGN
        return raw[off : off + size], addr + off

    def give(self, block: np.ndarray, addr: int) -> None:
        size = block.nbytes
        with self.lock:
            if self.cached + size > self.limit:
                self.mapped -= size
                return  # over the bound: the block is freed
            self.free.setdefault(size, []).append((block, addr))
            self.cached += size

    def clear(self) -> None:
        self.trim(0)

    def trim(self, keep: int) -> None:
        """Free cached blocks, largest first, until at most ``keep`` bytes stay cached."""
        with self.lock:
            for size in sorted(self.free, reverse=True):
                blocks = self.free[size]
                while blocks and self.cached > keep:
                    blocks.pop()
                    self.cached -= size
                    self.mapped -= size
                if not blocks:
                    del self.free[size]


class _Lease:
    """Owns a block while any array made from it lives; gives it back when collected."""

    __slots__ = ("__array_interface__", "_addr", "_block", "_pool")

    def __init__(self, pool: _Pool, block: np.ndarray, addr: int) -> None:
        self._pool, self._block, self._addr = pool, block, addr
        self.__array_interface__ = {
            "data": (addr, False),
            "shape": (block.nbytes,),
            "typestr": "|u1",
            "version": 3,
        }

    def __del__(self) -> None:
        # an instance __init__ never ran on owns nothing: dynamo makes one with object.__new__
        # to probe the class when it traces into a kernel wrapper
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.give(self._block, self._addr)


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def pool() -> _Pool:
    """The process's pool, created on first use (its limit read from the environment then)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = _Pool(_limit_from_env())
    return _pool


def _limit_from_env() -> int:
    raw = os.environ.get(POOL_ENV, "1024")
    try:
        mb = float(raw)
    except ValueError:
        msg = f"{POOL_ENV}={raw!r}: expected a number of megabytes (0 turns it off)"
        raise ValueError(msg) from None
    if mb < 0:
        raise ValueError(f"{POOL_ENV}={raw!r}: expected a number of megabytes >= 0")
    return int(mb * (1 << 20))


def size_class(nbytes: int) -> int:
    """The block size serving ``nbytes``: whole pages, rounded up to one of 4 steps per power of
    two (at most 25% slack), so nearby sizes share a class."""
    pages = -(-nbytes // 4096)
    step = max(1 << max(pages - 1, 0).bit_length(), 8) // 8  # a power of two at or above pages / 8
    return -(-pages // step) * step * 4096


def empty(shape: tuple[int, ...] | list[int], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array, from the pool when it is large (see the module doc)."""
    dt = tensors.numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dt.itemsize
    p = pool()
    if nbytes < MIN_BYTES or p.limit == 0:
        return np.empty(shape, dt)
    block, addr = p.take(size_class(nbytes))
    raw = np.asarray(_Lease(p, block, addr))
    return raw[:nbytes].view(dt).reshape(shape)


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """The output pool's state (`memory_stats`); bytes unless named otherwise."""

    limit: int  #: at most this many bytes of freed blocks are kept (`set_memory_limit`)
    cached: int  #: freed blocks kept for reuse
    in_use: int  #: blocks behind arrays still alive
    mapped: int  #: cached + in_use: what the pool holds from the system
    hits: int  #: large outputs served from a cached block
    misses: int  #: large outputs that needed a new block

    def __str__(self) -> str:
        mb = 1 << 20
        return (f"buffer pool: {self.mapped / mb:.1f} MB mapped ({self.in_use / mb:.1f} in use, "
                f"{self.cached / mb:.1f} cached of a {self.limit / mb:.0f} MB limit), "
                f"{self.hits} hits, {self.misses} misses")  # fmt: skip


def memory_stats() -> MemoryStats:
    """What the output pool holds and how often it served a large output (see the module doc)."""
    p = pool()
    with p.lock:
        return MemoryStats(p.limit, p.cached, p.mapped - p.cached, p.mapped, p.hits, p.misses)


def set_memory_limit(megabytes: float) -> None:
    """Keep at most ``megabytes`` of freed output blocks from now on (0: no pooling at all).

    Overrides ``REFCORE_BUFFER_POOL_MB``; cached blocks above the new limit are freed at once.
    Arrays already handed out are untouched (the pool never owns memory a caller still uses).
    """
    if (
        isinstance(megabytes, bool)
        or not isinstance(megabytes, (int, float))
        or not (megabytes >= 0 and math.isfinite(megabytes))
    ):
        expected = "expected a finite number >= 0"
        raise ValueError(
            f"refcore.set_memory_limit: argument 'megabytes' {expected}; got {megabytes!r}"
        )
    p = pool()
    with p.lock:
        p.limit = int(megabytes * (1 << 20))
        p.trim(p.limit)
