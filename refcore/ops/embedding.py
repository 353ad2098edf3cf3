"""Embedding references: embedding (row gather) and embedding_bag (pooled gather).

Precision policy: embedding copies rows, so it is exact. embedding_bag upcasts the gathered rows
(times per_sample_weights) to float64, pools each bag there and rounds once to the weight dtype.
NOTE: torch's bf16 ``mode='mean'`` rounds the bag sum to bf16 before dividing (two roundings,
within one bf16 ulp of the round-once result); the bf16 tolerance covers it, refcore keeps one
rounding. padding_idx and max_norm are not supported (not in the signatures).
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks
from refcore.tensors import round_to


def check_embedding(input: np.ndarray, weight: np.ndarray) -> None:
    _checks.rank("embedding", "weight", weight, [2], " (num_embeddings, embedding_dim)")
    _checks.index_range("embedding", "input", input, weight.shape[0])


def embedding(input: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``weight[input]``: one row of ``weight`` per index, shape ``input.shape + (D,)``."""
    check_embedding(input, weight)
    return np.take(weight, np.asarray(input, np.int64), axis=0)  # a copy, also for 0-D input


def check_embedding_bag(
    input: np.ndarray,
    weight: np.ndarray,
    offsets: np.ndarray | None = None,
    *,
    mode: str = "mean",
    per_sample_weights: np.ndarray | None = None,
    include_last_offset: bool = False,
) -> None:
    op = "embedding_bag"
    _checks.rank(op, "weight", weight, [2], " (num_embeddings, embedding_dim)")
    _checks.rank(op, "input", input, [1, 2], " (indices with offsets, or a (bags, length) batch)")
    if input.ndim == 2 and offsets is not None:
        _checks.fail(op, "offsets", "None when input is 2-D (fixed-length bags)", offsets.shape)
    if input.ndim == 1:
        _bag_offsets(op, input, offsets, include_last_offset)
    if per_sample_weights is not None:
        if mode != "sum":
            _checks.fail(op, "per_sample_weights", "None unless mode='sum'", f"mode={mode!r}")
        _checks.shape(op, "per_sample_weights", per_sample_weights, input.shape, " (input's)")
    _checks.index_range(op, "input", input, weight.shape[0])


def _bag_offsets(
    op: str, input: np.ndarray, offsets: np.ndarray | None, include_last_offset: bool
) -> None:
    if offsets is None:
        _checks.fail(op, "offsets", "a 1-D tensor when input is 1-D", "None")
    _checks.rank(op, "offsets", offsets, [1])
    off = np.asarray(offsets, np.int64)
    n = input.shape[0]
    if include_last_offset and off.size == 0:
        _checks.fail(op, "offsets", "at least 1 value with include_last_offset=True", "shape (0,)")
    if n and off.size == 0:
        # Every index must fall in a bag; with no bag torch 2.13 ignores the indices for sum
        # and mean and segfaults for max, so refcore rejects it (and the ilo case below).
        _checks.fail(op, "offsets", "at least 1 bag when input is non-empty", "shape (0,)")
    # compared, not subtracted: np.diff of int64 offsets wraps around (-2**63 after 3 read as
    # an increase, and numba merged_embedding_bag read far outside its table; found by refcore.fuzz)
    drops = np.flatnonzero(off[1:] < off[:-1])
    if drops.size:
        i = int(drops[0])
        _checks.fail(op, "offsets", "non-decreasing values", f"{off[i]} then {off[i + 1]} at {i}")
    if off.size and off[-1] > n:
        _checks.fail(op, "offsets", f"values <= len(input) = {n}", int(off[-1]))
    if include_last_offset and off[-1] != n:
        # The CSR form torch documents; for other last offsets torch 2.13 disagrees with itself
        # (sum stops at offsets[-1], mean divides by the count up to len(input), max pools up to
        # len(input) and segfaults for offsets == [0]), so refcore rejects them.
        want = f"offsets[-1] == len(input) = {n} with include_last_offset=True"
        _checks.fail(op, "offsets", want, int(off[-1]))
    if off.size and off[0] != 0:
        _checks.fail(op, "offsets", "a first offset of 0", int(off[0]))


def _bags(input: np.ndarray, offsets: np.ndarray | None, include_last_offset: bool):
    """(start, end) positions of every bag in the flattened input."""
    if input.ndim == 2:
        n, length = input.shape
        starts = np.arange(n) * length
        return starts, starts + length
    off = np.asarray(offsets, np.int64)
    if include_last_offset:  # CSR row pointers: offsets[-1] == len(input)
        return off[:-1], off[1:]
    return off, np.append(off[1:], input.shape[0])


def embedding_bag(
    input: np.ndarray,
    weight: np.ndarray,
    offsets: np.ndarray | None = None,
    *,
    mode: str = "mean",
    per_sample_weights: np.ndarray | None = None,
    include_last_offset: bool = False,
) -> np.ndarray:
    """Sum, mean or max of the rows ``weight[input]`` in each bag; shape ``(bags, D)``."""
    check_embedding_bag(
        input, weight, offsets, mode=mode, per_sample_weights=per_sample_weights,
        include_last_offset=include_last_offset,
    )  # fmt: skip
    rows = np.asarray(weight, np.float64)[np.asarray(input, np.int64).reshape(-1)]
    if per_sample_weights is not None:
        rows = rows * np.asarray(per_sample_weights, np.float64).reshape(-1, 1)
    starts, ends = _bags(input, offsets, include_last_offset)
    out = np.zeros((len(starts), weight.shape[1]))
    pool = {"sum": np.sum, "mean": np.mean, "max": np.max}[mode]
    for b, (s, e) in enumerate(zip(starts, ends)):
        # NOTE: an empty bag gives 0 in every mode, as torch does (max included).
        if e > s:
            out[b] = pool(rows[s:e], axis=0)
    return round_to(out, weight.dtype)
