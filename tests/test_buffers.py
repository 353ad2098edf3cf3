"""The output-buffer pool: reuse only after every array sharing a block is gone, bounds, classes."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refcore import buffers, tensors


@pytest.fixture
def pool(monkeypatch):
    """A fresh pool of 64 MB for the test (the process's pool is left as it was)."""
    p = buffers._Pool(64 << 20)
    monkeypatch.setattr(buffers, "_pool", p)
    return p


def test_small_arrays_bypass_the_pool(pool):
    a = buffers.empty((16, 16), "float32")
    assert a.base is None and pool.misses == 0


def test_block_returns_only_after_every_view_and_tensor_is_gone(pool):
    torch = pytest.importorskip("torch")
    a = buffers.empty((512, 512), "bfloat16")
    a[:] = 1
    view = a[3:, ::2]
    t = tensors.to_torch(a)
    addr = a.ctypes.data
    del a
    gc.collect()
    assert pool.cached == 0  # the view and the tensor still use it
    b = buffers.empty((512, 512), "bfloat16")
    assert b.ctypes.data != addr
    del view
    gc.collect()
    assert pool.cached == 0  # the tensor still uses it
    assert float(t[0, 0]) == 1.0 and t.dtype == torch.bfloat16
    del t
    gc.collect()
    assert pool.cached == buffers.size_class(512 * 512 * 2)
    c = buffers.empty((512, 512), "bfloat16")
    assert c.ctypes.data == addr and pool.hits == 1
    del b, c


def test_arrays_are_aligned_contiguous_writable_and_typed(pool):
    for dtype in ("float32", "bfloat16", "int64"):
        a = buffers.empty((300, 1001), dtype)
        assert a.shape == (300, 1001) and a.dtype == tensors.numpy_dtype(dtype)
        assert a.flags.c_contiguous and a.flags.writeable and a.ctypes.data % 64 == 0


def test_pool_keeps_at_most_its_limit(pool):
    pool.limit = 3 << 20
    arrays = [buffers.empty((1 << 20,), np.uint8) for _ in range(5)]
    del arrays
    gc.collect()
    assert pool.cached == 3 << 20


def test_limit_zero_turns_pooling_off(monkeypatch):
    monkeypatch.setattr(buffers, "_pool", None)
    monkeypatch.setenv(buffers.POOL_ENV, "0")
    a = buffers.empty((1024, 1024), "float32")
    assert a.base is None and buffers.pool().limit == 0


@pytest.mark.parametrize("raw", ["lots", "-1"])
def test_bad_limit_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setattr(buffers, "_pool", None)
    monkeypatch.setenv(buffers.POOL_ENV, raw)
    with pytest.raises(ValueError, match=buffers.POOL_ENV):
        buffers.empty((1024, 1024), "float32")


@given(st.integers(1, 1 << 30))
def test_size_class_covers_the_request_with_at_most_a_quarter_slack(n):
    c = buffers.size_class(n)
    assert c >= n and c % 4096 == 0
    assert c <= max(n * 1.25, n + 4096) + 4096


def test_threads_never_share_a_live_block(pool):
    seen: list[tuple[int, int]] = []
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(200):
            a = buffers.empty((256, 1024), "float32")
            a.fill(k)
            if not (a == k).all():
                errors.append(f"thread {k}: its buffer was overwritten")
            seen.append((k, a.ctypes.data))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.hits > 0  # blocks were reused


def test_a_block_freed_by_the_collector_inside_the_pool_lock_returns(pool):
    """A leased array in a reference cycle is freed by whichever allocation runs the collector,
    possibly one the pool makes while holding its lock: the give-back must not deadlock."""
    a = buffers.empty((256, 1024), "float32")
    done = threading.Event()

    def reenter() -> None:
        nonlocal a
        with pool.lock:
            del a  # the _Lease.__del__ runs here, in this thread, as under the collector
        done.set()

    t = threading.Thread(target=reenter, daemon=True)  # a deadlock must not hang the run
    t.start()
    t.join(timeout=10)
    assert done.is_set(), "giving a block back inside the pool's lock deadlocked"
    assert pool.cached == buffers.size_class(256 * 1024 * 4)


def test_memory_stats_follow_leases_hits_and_misses(pool, monkeypatch):
    monkeypatch.setattr(buffers, "pool", lambda: pool)
    size = buffers.size_class(1 << 20)
    a = buffers.empty((1 << 20,), np.uint8)
    s = buffers.memory_stats()
    assert (s.misses, s.hits, s.in_use, s.cached, s.mapped) == (1, 0, size, 0, size)
    del a
    gc.collect()
    s = buffers.memory_stats()
    assert (s.in_use, s.cached, s.mapped) == (0, size, size)
    b = buffers.empty((1 << 20,), np.uint8)
    assert buffers.memory_stats().hits == 1 and "1 hits, 1 misses" in str(buffers.memory_stats())
    del b


def test_set_memory_limit_frees_cached_blocks_above_it(pool, monkeypatch):
    monkeypatch.setattr(buffers, "pool", lambda: pool)
    arrays = [buffers.empty((1 << 20,), np.uint8) for _ in range(4)]
    del arrays
    gc.collect()
    size = buffers.size_class(1 << 20)
    assert pool.cached == 4 * size
    buffers.set_memory_limit(2.5 * size / (1 << 20))
    s = buffers.memory_stats()
    assert s.cached == 2 * size == s.mapped and s.limit == int(2.5 * size)
    buffers.set_memory_limit(0)
    assert buffers.memory_stats().mapped == 0
    c = buffers.empty((1 << 20,), np.uint8)  # limit 0: a plain array, not from the pool
    assert c.base is None and buffers.memory_stats().misses == 4


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "64", True, None])
def test_set_memory_limit_rejects_what_is_not_a_size(bad):
    with pytest.raises(ValueError, match=r"set_memory_limit: argument 'megabytes' expected"):
        buffers.set_memory_limit(bad)
