"""Every op x every available provider x dtype, with stock torch as the baseline in the same class.

Inputs are each op's ``tier: large`` sample from its spec (seeded), built outside the timed body;
threads are fixed to 2.
"""

from __future__ import annotations

import refcore
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.sampling import RandomDraw, cases, draw_sample
from refcore.testing import call_torch

THREADS = 2


def _providers() -> list[str]:
    return ["torch"] + sorted(n for n, p in installed().items() if p.availability().available)


class TimeOps:
    params = (
        sorted(n for n, s in default_registry().ops.items() if cases(s, "float32", "large")),
        _providers(),
        ["float32", "bfloat16"],
    )
    param_names = ["op", "provider", "dtype"]
    timeout = 120

    def setup(self, op: str, provider: str, dtype: str) -> None:
        import torch

        torch.set_num_threads(THREADS)
        spec = default_registry().op(op)
        if dtype not in spec.dtypes or not cases(spec, dtype, "large"):
            raise NotImplementedError(f"{op} has no large {dtype} sample")
        sample = draw_sample(spec, dtype, RandomDraw(0), tier="large")
        if provider == "torch":
            fn, args = resolve(spec.torch.function), sample.torch_args()
            self.go = lambda: call_torch(spec, fn, args)
            return
        views = sample.args
        why = refcore.explain(op, provider=provider, **views)
        if why.chosen is None or why.chosen[0] != provider:
            raise NotImplementedError(f"{provider} does not run {op}: {why}")
        self.go = lambda: refcore.run(op, provider=provider, **views)

    def time_op(self, op: str, provider: str, dtype: str) -> None:
        self.go()
