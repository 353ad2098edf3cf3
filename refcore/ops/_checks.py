"""Validation helpers shared by the reference ``check_*`` functions.

Every helper raises with the op, the argument, what was expected and what was given.

Example:
    >>> import numpy as np
    >>> normalize_dim("softmax", "dim", -1, 2)
    1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def fail(op: str, arg: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> None:
    raise exc(f"{op}: argument {arg!r} expected {expected}; got {got}")


def rank(op: str, arg: str, a: np.ndarray, ranks: Sequence[int] | range, what: str = "") -> None:
    """``a.ndim`` must be in ``ranks``."""
    if a.ndim not in ranks:
        want = (
            f"{min(ranks)}-D or more"
            if isinstance(ranks, range) and ranks.stop > 64
            else (" or ".join(f"{r}-D" for r in ranks))
        )
        fail(op, arg, f"a {want} tensor{what}", f"{a.ndim}-D with shape {tuple(a.shape)}")


def shape(
    op: str, arg: str, a: np.ndarray | None, expected: tuple[int, ...], why: str = ""
) -> None:
    """``a.shape`` must equal ``expected`` (skipped when ``a`` is None)."""
    if a is not None and tuple(a.shape) != tuple(expected):
        fail(op, arg, f"shape {tuple(expected)}{why}", f"shape {tuple(a.shape)}")


def normalize_dim(op: str, arg: str, dim: int, ndim: int) -> int:
    """Wrap a negative dim; a dim outside [-ndim, ndim) is an error (0-D counts as 1-D)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        fail(op, arg, f"a dim in [{-n}, {n - 1}]", dim, IndexError)
    return dim % n


def broadcast(op: str, a: tuple[int, ...], b: tuple[int, ...], names=("input", "other")) -> tuple:
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        fail(op, names[1], f"a shape broadcastable with {names[0]} {a}", b)
        raise  # unreachable, keeps type checkers calm


def index_range(op: str, arg: str, idx: np.ndarray, high: int, low: int = 0) -> None:
    """Every index must be in [low, high)."""
    # An expanded (stride-0) index repeats values: check each distinct element once.
    idx = idx[tuple(slice(0, 1) if s == 0 else slice(None) for s in idx.strides)]
    if idx.size and (int(idx.min()) < low or int(idx.max()) >= high):
        fail(op, arg, f"indices in [{low}, {high})", f"range [{int(idx.min())}, {int(idx.max())}]",
             IndexError)  # fmt: skip


def positive(op: str, arg: str, value: float | int, *, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        fail(op, arg, "a positive value" if strict else "a non-negative value", value)
