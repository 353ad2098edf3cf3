"""``python -m refcore bench optim``: an optimizer step over many parameters, against torch.

For each optimizer of specs/optim.yaml, three steppers over the same parameter sizes (by default
25 tensors of 1M elements and 25 of 1000: 25M parameters), timed interleaved (`refcore.bench`):

- ``torch``: torch's own optimizer with ``fused=True`` on float32 parameters (Lamb, which torch
  lacks: refcore.oracles.Lamb, the same rule in plain torch ops);
- ``float32``: refcore.optim's class on float32 parameters and gradients (routing as it is);
- ``split_bf16``: refcore.optim's class on bfloat16 parameters with split-BF16 masters and
  bfloat16 gradients (what bf16 training feeds it).

Ratios are torch's time over ours (> 1: refcore is faster). Each step touches every byte of the
parameters, gradients and state once, so DRAM bandwidth bounds all three: the split-BF16 step
reads 2 bytes less per parameter (the bf16 gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from refcore.bench import interleaved

CLASSES = {"sgd": "SGD", "adagrad": "Adagrad", "adam": "Adam", "adamw": "AdamW", "lamb": "Lamb"}
HYPER = {"sgd": dict(lr=0.01, momentum=0.9)}  # SGD without momentum is a plain axpy
SIZES = (1_000_000,) * 25 + (1000,) * 25


@dataclass(frozen=True)
class Row:
    optimizer: str
    params: int
    us: dict[str, float]  # stepper -> median microseconds per step
    routes: dict[str, str]  # refcore stepper -> what ran

    def ratio(self, stepper: str) -> float:
        return self.us["torch"] / self.us[stepper]


def steppers(name: str, sizes: tuple[int, ...]) -> tuple[dict[str, Callable[[], Any]], dict]:
    import torch

    import refcore.optim as ro
    from refcore import oracles

    hp = HYPER.get(name, {})
    cls = CLASSES[name]
    g = torch.Generator().manual_seed(0)

    def params(dtype: torch.dtype) -> list[torch.nn.Parameter]:
        ps = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in sizes]
        for p in ps:
            p.grad = (torch.randn(p.shape, generator=g) * 1e-2).to(dtype)
        return ps

    theirs = (
        oracles.Lamb(params(torch.float32), **hp)
        if name == "lamb"
        else getattr(torch.optim, cls)(params(torch.float32), fused=True, **hp)
    )
    ours32 = getattr(ro, cls)(params(torch.float32), **hp)
    split_ps = params(torch.float32)
    ours16 = getattr(ro, cls)(split_ps, master="split_bf16", **hp)
    for p in split_ps:  # the split made them bf16; bf16 training feeds bf16 gradients
        p.grad = torch.randn(p.shape, generator=g).to(torch.bfloat16) * 1e-2
    fns = {"torch": theirs.step, "float32": ours32.step, "split_bf16": ours16.step}
    return fns, {"float32": ours32, "split_bf16": ours16}


def optim_rows(names: list[str], repeat: int = 5, sizes: tuple[int, ...] = SIZES,
               progress: Callable[[str], Any] | None = None) -> list[Row]:  # fmt: skip
    rows = []
    for name in names:
        if progress:
            progress(f"{name}: {sum(sizes) / 1e6:.1f}M parameters")
        fns, ours = steppers(name, sizes)
        us = interleaved(fns, repeat, warmup=2, min_seconds=0.0)
        routes = {k: "; ".join(r.split("\n")[0] for r in o.routes) for k, o in ours.items()}
        rows.append(Row(name, sum(sizes), us, routes))
        del fns, ours
    return rows


def table(rows: list[Row]) -> list[list[str]]:
    out = [["optimizer", "params", "torch ms", "float32 ms", "x", "split_bf16 ms", "x", "ran"]]
    for r in rows:
        out.append([
            r.optimizer, f"{r.params / 1e6:.1f}M", f"{r.us['torch'] / 1e3:.1f}",
            f"{r.us['float32'] / 1e3:.1f}", f"{r.ratio('float32'):.2f}",
            f"{r.us['split_bf16'] / 1e3:.1f}", f"{r.ratio('split_bf16'):.2f}",
            " | ".join(f"{k}: {v.removeprefix('group 0: ')}" for k, v in r.routes.items()),
        ])  # fmt: skip
    return out
