"""The runtime: how many threads refcore's kernels and torch's run on, one number for every layer.

torch's intra-op thread count is the one setting: the native provider passes
``torch.get_num_threads()`` to each parallel C region (its OpenMP is torch's own libgomp, one
thread pool), and the numba provider resizes its pool to it before each parallel call. So
`set_num_threads` sets torch's count and, when numba is loaded, numba's at once, and `threads` is
the same as a context that restores the previous count on exit (also when the body raises).

What cannot be changed from inside a running process: how long idle OpenMP threads spin before
they sleep (``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``, read once when libgomp loads, i.e. when torch
is imported). `python -m refcore launch` sets them for the process it starts; see
`refcore.launch` and ``python -m refcore bench threads`` for what they cost and save here.

`MultiStream` runs one model as N streams in this process, each pinned to its own cores.

Example:
    >>> with threads(1):
    ...     get_num_threads()
    1
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


def get_num_threads() -> int:
    """The thread count torch, the native and the numba provider use for one op."""
    import torch

    return torch.get_num_threads()


def _check(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"refcore.set_num_threads: argument 'n' expected an int >= 1; got {n!r}")
    if n < 1:
        raise ValueError(f"refcore.set_num_threads: argument 'n' expected an int >= 1; got {n}")
    return n


def set_num_threads(n: int) -> None:
    """Run torch's and refcore's parallel ops on ``n`` threads from now on.

    numba's pool cannot grow past ``NUMBA_NUM_THREADS`` (fixed when numba loads, by default the
    CPU count); above it numba runs on all it has, and torch and the native provider on ``n``.
    """
    import torch

    _check(n)
    numba = sys.modules.get("numba")  # not imported here: an unloaded numba has no pool to resize
    if numba is not None:
        # first: numba's first pool start resets the OpenMP count torch reads (refcore_numba)
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(n)


@contextlib.contextmanager
def threads(n: int) -> Iterator[int]:
    """``with refcore.threads(1): ...``: `set_num_threads` inside the block, the old count after."""
    before = get_num_threads()
    set_num_threads(n)
    try:
        yield n
    finally:
        set_num_threads(before)


class MultiStream:
    """Run ``model`` as ``streams`` streams in this process, each on its own cores, a batch split
    across them (IPEX's multi-stream module).

    ``MultiStream(model, streams=2)(x)`` cuts every tensor argument whose first dimension is the
    batch (that of the first tensor argument) into ``streams`` contiguous chunks, runs the chunks
    at once on worker threads and joins the outputs along dimension 0 (tensors, and tuples, lists,
    dicts and ``ModelOutput``-style mappings of them). Each worker is pinned to its share of the
    cores (``cores``, default: the cores this process may use, split evenly) and runs torch and
    refcore's providers on that many threads. torch's thread count is one per process (set in any
    thread, read by all), so while a MultiStream is open the process runs on the streams' count
    and `close` (or leaving its ``with`` block) gives the previous count back; setting it per
    call instead cost more than the streams gained (a 4 x Linear(1024) stack, batch 256, on the
    2-vCPU Zen 3: 24 ms against 15 ms a call). torch's grad mode is the caller's. The outputs
    are those of ``model`` on the whole batch when the model treats samples independently (no
    batch norm in training mode, no cross-sample ops). A batch smaller than ``streams`` uses
    fewer streams.
    """

    def __init__(self, model, streams: int = 2, cores=None) -> None:
        import os
        import queue
        import threading

        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(
                f"MultiStream: argument 'streams' expected an int >= 1; got {streams!r}"
            )
        cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
        if streams > len(cores):
            raise ValueError(
                f"MultiStream: argument 'streams' expected at most {len(cores)} (one core each on "
                f"cores {cores}); got {streams}"
            )
        per = len(cores) // streams
        self._threads_before = get_num_threads()
        set_num_threads(per)
        self.model, self.streams = model, streams
        self.cores = [tuple(cores[i * per : (i + 1) * per]) for i in range(streams)]
        self._jobs = [queue.SimpleQueue() for _ in range(streams)]
        self._workers = [
            threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"refcore-stream-{i}")
            for i in range(streams)
        ]
        for w in self._workers:
            w.start()

    def _serve(self, i: int) -> None:
        import os

        import torch

        os.sched_setaffinity(0, self.cores[i])  # this thread; the OpenMP team it makes inherits it
        while True:
            job = self._jobs[i].get()
            if job is None:
                return
            grad, args, kwargs, done = job
            try:
                with torch.set_grad_enabled(grad):
                    done.put((True, self.model(*args, **kwargs)))
            except BaseException as e:  # the caller re-raises it
                done.put((False, e))

    def __call__(self, *args, **kwargs):
        import queue

        import torch

        if not any(w.is_alive() for w in self._workers):
            raise RuntimeError("MultiStream: called after close()")
        batch = _batch_size(args, kwargs)
        n = min(self.streams, batch) if batch else 1
        if n == 1:
            return self.model(*args, **kwargs)
        bounds = [(batch * k // n, batch * (k + 1) // n) for k in range(n)]
        done = [queue.SimpleQueue() for _ in range(n)]
        grad = torch.is_grad_enabled()
        for k, (lo, hi) in enumerate(bounds):
            part = _slice((args, kwargs), batch, lo, hi)
            self._jobs[k].put((grad, part[0], part[1], done[k]))
        results = [d.get() for d in done]
        for ok, value in results:
            if not ok:
                raise value
        return _join([v for _, v in results])

    def close(self) -> None:
        """Stop the worker threads and give torch the thread count it had before (idempotent)."""
        if not any(w.is_alive() for w in self._workers):
            return
        for q in self._jobs:
            q.put(None)
        for w in self._workers:
            w.join()
        set_num_threads(self._threads_before)

    def __enter__(self) -> MultiStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tensors(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _batch_size(args, kwargs) -> int:
    first = next(_tensors((args, kwargs)), None)
    return 0 if first is None or first.dim() == 0 else first.shape[0]


def _slice(obj, batch: int, lo: int, hi: int):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj[lo:hi] if obj.dim() > 0 and obj.shape[0] == batch else obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_slice(o, batch, lo, hi) for o in obj)
    if isinstance(obj, dict):
        return {k: _slice(v, batch, lo, hi) for k, v in obj.items()}
    return obj


def _join(parts):
    import torch

    first = parts[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            raise TypeError(
                "MultiStream: a 0-dim output (a loss?) has no batch to join over streams"
            )
        return torch.cat(parts, 0)
    if isinstance(first, (tuple, list)):
        items = [_join([p[i] for p in parts]) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    if isinstance(first, dict):
        joined = {k: _join([p[k] for p in parts]) for k in first}
        return type(first)(**joined) if type(first) is not dict else joined
    if first is None:
        return None
    raise TypeError(f"MultiStream: cannot join outputs of type {type(first).__name__} over streams")
