"""DLRM references: merged_embedding_bag (many equal-shape tables in one call) and interaction.

Precision policy: float64 compute, one rounding to the input dtype, as the rest of refcore.
NOTE: DLRM (facebookresearch/dlrm, ``interact_features`` "dot") computes the interaction with
torch.bmm in the input dtype, i.e. fp32 accumulation for bf16 inputs rounded once, which is what
one rounding of a float64 result reproduces within one bf16 ulp.
"""

from __future__ import annotations

import numpy as np

from refcore.ops import _checks, embedding
from refcore.tensors import round_to


def check_merged_embedding_bag(
    input: np.ndarray,
    weight: np.ndarray,
    offsets: np.ndarray,
    *,
    mode: str = "sum",
    include_last_offset: bool = False,
) -> None:
    op = "merged_embedding_bag"
    _checks.rank(op, "input", input, (2,), " (tables, indices per table)")
    _checks.rank(op, "weight", weight, (3,), " (tables, rows, dim)")
    _checks.rank(op, "offsets", offsets, (2,), " (tables, bags)")
    tables = weight.shape[0]
    _checks.shape(op, "input", input, (tables, input.shape[1]), " (one row of indices per table)")
    _checks.shape(op, "offsets", offsets, (tables, offsets.shape[1]), " (one row per table)")
    for t in range(tables):
        try:
            embedding.check_embedding_bag(input[t], weight[t], offsets[t], mode=mode,
                                          include_last_offset=include_last_offset)  # fmt: skip
        except (ValueError, IndexError) as e:
            raise type(e)(f"{op}: table {t}: {e}") from None


def merged_embedding_bag(
    input: np.ndarray,
    weight: np.ndarray,
    offsets: np.ndarray,
    *,
    mode: str = "sum",
    include_last_offset: bool = False,
) -> np.ndarray:
    """Table t's embedding_bag(input[t], weight[t], offsets[t]) as out[:, t]: (bags, tables, dim).

    The (bags, tables, dim) layout is what `interaction` takes as its sparse features.
    """
    check_merged_embedding_bag(input, weight, offsets, mode=mode,
                               include_last_offset=include_last_offset)  # fmt: skip
    bags = [
        embedding.embedding_bag(input[t], weight[t], offsets[t], mode=mode,
                                include_last_offset=include_last_offset)
        for t in range(weight.shape[0])
    ]  # fmt: skip
    if not bags:
        n = offsets.shape[1] - (1 if include_last_offset else 0)
        return np.zeros((max(n, 0), 0, weight.shape[2]), weight.dtype)
    return np.stack(bags, axis=1)


def check_interaction(dense: np.ndarray, sparse: np.ndarray) -> None:
    op = "interaction"
    _checks.rank(op, "dense", dense, (2,), " (batch, dim)")
    _checks.rank(op, "sparse", sparse, (3,), " (batch, features, dim)")
    _checks.shape(op, "sparse", sparse, (dense.shape[0], sparse.shape[1], dense.shape[1]),
                  " (same batch and dim as dense)")  # fmt: skip


def interaction(dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
    """DLRM's dot interaction: [dense, tril(Z Z^T, -1) flattened row-major], Z = [dense; sparse].

    Z stacks the dense vector over the sparse features: (batch, 1 + F, dim). The strictly-lower
    triangle of each Z Z^T in row-major order ((1,0), (2,0), (2,1), ...) is torch.tril_indices'
    order, as DLRM uses. Output: (batch, dim + (F + 1) F / 2).
    """
    check_interaction(dense, sparse)
    z = np.concatenate([dense[:, None, :], sparse], axis=1).astype(np.float64)
    gram = z @ z.transpose(0, 2, 1)
    rows, cols = np.tril_indices(z.shape[1], k=-1)
    out = np.concatenate([dense.astype(np.float64), gram[:, rows, cols]], axis=1)
    return round_to(out, dense.dtype)
