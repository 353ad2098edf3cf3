"""`refcore.optimize(model, optimizer=opt, dtype=...)`: a model and optimizer ready to train.

What ``ipex.optimize`` does for training, with refcore's parts: the optimizer becomes the
refcore.optim class of the same rule (`SGD`, `Adagrad`, `Adam`, `AdamW`, `Lamb`) over the
model's parameters, with the same groups, hyper-parameters and state; with
``dtype=torch.bfloat16`` the parameters become bf16 with split-BF16 masters (exact float32
masters, no extra memory) and the model casts its floating inputs to bf16. The model's graph
is not rewritten: refcore's fused ops have no backward kernels yet, so a training forward
keeps torch's ops (and its autograd) unchanged.

Example:
    >>> import torch, refcore
    >>> m = torch.nn.Linear(4, 2)
    >>> m2, opt = refcore.optimize(m, optimizer=torch.optim.AdamW(m.parameters()),
    ...                            dtype=torch.bfloat16)
    >>> m2.weight.dtype, type(opt).__name__, opt.param_groups[0]["master"]
    (torch.bfloat16, 'AdamW', 'split_bf16')
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from refcore.dispatch import AUTO

#: torch (or refcore) optimizer class name -> refcore.optim class name
RULES = {"SGD": "SGD", "Adagrad": "Adagrad", "Adam": "Adam", "AdamW": "AdamW", "Lamb": "Lamb"}


def prepare(model: Any, optimizer: Any, dtype: Any = None, provider: str = AUTO,
            inplace: bool = False) -> tuple[Any, Any]:  # fmt: skip
    """(model, optimizer) for training. The optimizer is always new (it steps the returned
    model's parameters, its state copied from the given one's); ``model`` is copied unless
    ``inplace``, and then the given optimizer, whose parameters changed dtype, is not to be
    stepped again."""
    import torch

    import refcore.optim as ro

    name = type(optimizer).__name__
    if not isinstance(optimizer, torch.optim.Optimizer) or name not in RULES:
        raise TypeError(f"optimize: optimizer expected one of torch.optim's or refcore.optim's "
                        f"{sorted(RULES)}; got {type(optimizer).__name__}")  # fmt: skip
    if dtype not in (None, torch.float32, torch.bfloat16):
        raise TypeError(f"optimize: training dtype expected torch.float32 or torch.bfloat16, "
                        f"got {dtype!r}")  # fmt: skip
    old = list(model.parameters())
    m = model if inplace else copy.deepcopy(model)
    new = dict(zip(map(id, old), m.parameters()))
    missing = [i for g in optimizer.param_groups for i, p in enumerate(g["params"])
               if id(p) not in new]  # fmt: skip
    if missing:
        raise ValueError("optimize: the optimizer steps parameters that are not the model's")
    master = "split_bf16" if dtype == torch.bfloat16 else "float32"
    groups = [
        {**{k: v for k, v in g.items() if k not in ("master", "provider")},
         "params": [new[id(p)] for p in g["params"]]}
        for g in optimizer.param_groups
    ]  # fmt: skip
    cls = getattr(ro, RULES[name])
    bases = ("torch.", "refcore.oracles")
    base = next(c for c in cls.__mro__[1:] if c.__module__.startswith(bases))
    takes = inspect.signature(base.__init__).parameters  # AdamW's defaults hold more than it takes
    defaults = {k: v for k, v in optimizer.defaults.items() if k in takes and k != "params"}
    opt = cls(groups, master=master, provider=provider, **defaults)
    for og, g in zip(optimizer.param_groups, opt.param_groups):
        for op, p in zip(og["params"], g["params"]):
            for k, v in optimizer.state.get(op, {}).items():
                if torch.is_tensor(v) and k != "step" and v.is_floating_point():
                    v = v.to(torch.float32)  # the masters' state is float32
                opt.state[p][k] = v.clone() if torch.is_tensor(v) else v
    if dtype == torch.bfloat16:
        m.to(torch.bfloat16)  # buffers and anything the optimizer does not step
        m.register_forward_pre_hook(_to(torch.bfloat16), with_kwargs=True)
    m.train()
    return m, opt


def _to(dtype: Any) -> Any:
    def cast(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        from refcore.optimize import _cast

        return _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}

    return cast
