"""Scratch providers for tests/test_fuzz.py, loaded by fuzz worker processes (``--factory``).

``toy`` holds relu kernels that are right, wrong by 1%, abort the process, or hang: the fuzz
harness must report them as ok, wrong, crash and hang.
"""

from __future__ import annotations

import os
import time

import numpy as np

from refcore.provider import Kernel, Provider

F32 = frozenset({"float32", "bfloat16"})


def _right(input):
    return np.where(np.isnan(input), input, np.maximum(input, 0)).astype(input.dtype)


def _off(input):
    return (_right(input) * 1.01).astype(input.dtype)


def _abort(input):
    if input.size in (4, 7):  # 3 of seed 0's first 30 calls: the worker dies mid-batch, restarts
        os.abort()
    return _right(input)


def _hang(input):
    if input.size == 1518:  # one of seed 0's first 30 calls
        time.sleep(3600)
    return _right(input)


def providers() -> list[Provider]:
    kernels = (
        Kernel(op="relu", name="right", fn=_right, dtypes=F32),
        Kernel(op="relu", name="off_by_1pct", fn=_off, dtypes=F32),
        Kernel(op="relu", name="aborts", fn=_abort, dtypes=F32),
        Kernel(op="relu", name="hangs", fn=_hang, dtypes=F32),
    )
    return [Provider(name="toy", kernels=kernels)]
