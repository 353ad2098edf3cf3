"""Torch-side adapters for ops that torch has no functional form for.

A spec whose op torch only offers through an object (e.g. a sparse CSR tensor) names an adapter
here as its oracle (``torch.function: refcore.oracles:<op>``). Each adapter takes the op's
arguments as torch tensors (and attributes) in spec order, builds torch's own objects, calls
torch's kernel and returns a torch tensor. Adapters compute nothing themselves, so the oracle
stays independent of the references in `refcore.ops`.

Example:
    >>> import torch
    >>> spmm_reduce(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([2.0]),
    ...             torch.ones(1, 3), "sum")
    tensor([[2., 2., 2.]])
"""

from __future__ import annotations

import warnings
from typing import Any


def spmm_reduce(crow_indices: Any, col_indices: Any, values: Any, dense: Any, reduce: str) -> Any:
    """torch.sparse.mm(csr, dense, reduce) with csr = CSR(crow, col, values) of shape (rows, K)."""
    import torch

    size = (crow_indices.shape[0] - 1, dense.shape[0])
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR support is in beta; it says nothing here.
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        csr = torch.sparse_csr_tensor(
            crow_indices, col_indices, values, size=size, check_invariants=False
        )
        return torch.sparse.mm(csr, dense, reduce)
