"""Optimizers (specs/optim.yaml) run by refcore kernels.

- `step` / `explain`: one step of an update rule over a parameter group's arrays, dispatched
  like an op (refcore.optim.call).
- `SGD`, `Adagrad`, `Adam`, `AdamW`, `Lamb`: torch optimizers (subclasses of torch's own, or of
  a plain torch Lamb) whose ``step`` runs refcore's kernels, with ``master="split_bf16"`` for
  bf16 parameters trained with the exactness of a float32 master (refcore.optim.torch_front).
  They import torch on first use: ``import refcore.optim`` does not.

Example:
    >>> import numpy as np, refcore.optim
    >>> p = np.float32([1.0])
    >>> refcore.optim.step("sgd", [p], [np.float32([1.0])], [{}], step=1, lr=0.5,
    ...                    provider="reference")
    ('reference', 'reference')
    >>> p.tolist()
    [0.5]
"""

from __future__ import annotations

from typing import Any

from refcore.optim.call import StepCall, bind, explain, step

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Lamb", "StepCall", "bind", "explain", "step"]
_FRONT = ("SGD", "Adagrad", "Adam", "AdamW", "Lamb")


def __getattr__(name: str) -> Any:
    if name in _FRONT:
        from refcore.optim import torch_front

        return getattr(torch_front, name)
    raise AttributeError(f"module 'refcore.optim' has no attribute {name!r}")
