"""One optimizer step (specs/optim.yaml) per optimizer x stepper, torch's fused step as the
baseline: the same three steppers as ``python -m refcore bench optim`` (`refcore.bench_optim`),
over 4M parameters in 8 tensors plus 8 small ones (25M takes too long per asv sample)."""

from __future__ import annotations

from refcore import bench_optim

THREADS = 2
SIZES = (500_000,) * 8 + (1000,) * 8


class TimeOptimizerStep:
    params = (list(bench_optim.CLASSES), ["torch", "float32", "split_bf16"])
    param_names = ["optimizer", "stepper"]
    timeout = 300

    def setup(self, optimizer: str, stepper: str) -> None:
        import torch

        torch.set_num_threads(THREADS)
        fns, self._keep = bench_optim.steppers(optimizer, SIZES)
        self.fn = fns[stepper]
        self.fn()  # first step: state allocation and the step plan

    def time_step(self, optimizer: str, stepper: str) -> None:
        self.fn()
