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


# Fused ops: torch's own functions, composed as the pattern in specs/fusions.yaml composes them.


def add_relu(input: Any, other: Any) -> Any:
    import torch

    return torch.relu(torch.add(input, other))


def add_gelu(input: Any, other: Any, *, approximate: str = "none") -> Any:
    import torch

    return torch.nn.functional.gelu(torch.add(input, other), approximate=approximate)


def add_silu(input: Any, other: Any) -> Any:
    import torch

    return torch.nn.functional.silu(torch.add(input, other))


def add_layer_norm(input: Any, other: Any, normalized_shape: Any, weight: Any = None,
                   bias: Any = None, eps: float = 1e-5) -> Any:  # fmt: skip
    import torch

    return torch.nn.functional.layer_norm(
        torch.add(input, other), normalized_shape, weight, bias, eps
    )


def linear_relu(input: Any, weight: Any, bias: Any = None) -> Any:
    import torch

    return torch.relu(torch.nn.functional.linear(input, weight, bias))


def linear_gelu(input: Any, weight: Any, bias: Any = None, *, approximate: str = "none") -> Any:
    import torch

    return torch.nn.functional.gelu(
        torch.nn.functional.linear(input, weight, bias), approximate=approximate
    )


def linear_silu(input: Any, weight: Any, bias: Any = None) -> Any:
    import torch

    return torch.nn.functional.silu(torch.nn.functional.linear(input, weight, bias))


def linear_add(input: Any, weight: Any, bias: Any, other: Any) -> Any:
    import torch

    return torch.add(torch.nn.functional.linear(input, weight, bias), other)
