"""Every benchmark shape (specs/benchmarks.yaml) x provider x dtype, torch as the baseline.

``provider="torch"`` is stock torch on the same inputs, in the same class, so ``asv compare`` and
the HTML show each provider against torch. Inputs are seeded and built in ``setup``; threads
fixed to 2. A provider without a kernel for a shape is skipped (asv shows n/a).
"""

from __future__ import annotations

import refcore
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.sampling import draw_bench
from refcore.testing import call_torch

THREADS = 2


def _shapes() -> list[str]:
    return [
        f"{op}: {b.label}" for op, bs in sorted(default_registry().benchmarks.items()) for b in bs
    ]


def _providers() -> list[str]:
    avail = [n for n, p in installed().items() if p.availability().available and n != "reference"]
    return ["torch", *sorted(avail)]


class TimeOps:
    params = (_shapes(), _providers(), ["float32", "bfloat16"])
    param_names = ["shape", "provider", "dtype"]
    timeout = 300

    def setup(self, shape: str, provider: str, dtype: str) -> None:
        import torch

        torch.set_num_threads(THREADS)
        op, label = shape.split(": ", 1)
        reg = default_registry()
        spec = reg.op(op)
        if dtype not in spec.dtypes:
            raise NotImplementedError(f"{op} does not declare {dtype}")
        bench = next(b for b in reg.benchmarks[op] if b.label == label)
        args = draw_bench(spec, bench, dtype).torch_args()
        if provider == "torch":
            fn = resolve(bench.torch or spec.torch.function)  # the shape's anchor, if named
            self.go = lambda: call_torch(spec, fn, args)
            return
        why = refcore.explain(op, provider=provider, **args)
        if why.chosen is None:
            raise NotImplementedError(f"{provider} does not run {op}: {why}")
        self.go = lambda: refcore.run(op, provider=provider, **args)

    def time_op(self, shape: str, provider: str, dtype: str) -> None:
        self.go()
