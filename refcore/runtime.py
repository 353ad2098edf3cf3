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
