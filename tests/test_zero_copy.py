"""No hidden copies on the hot path: kernels see the caller's memory, and return theirs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import refcore
from refcore.provider import Provider, installed, using_providers
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample

REG = default_registry()
KERNELS = [
    pytest.param(k, id=f"{name}-{k.op}-{k.name}")
    for name, p in sorted(installed().items())
    if name != "reference" and p.availability().available
    for k in p.kernels
    if k.op in REG.ops  # optimizer steps write the caller's arrays in place: tests/test_optim.py
]  # fmt: skip


def _spy(kernel):
    seen: dict = {}

    def fn(**arguments):
        seen["in"] = {k: v.__array_interface__["data"][0] for k, v in arguments.items()
                      if isinstance(v, np.ndarray)}  # fmt: skip
        out = kernel.fn(**arguments)
        seen["out"] = out.__array_interface__["data"][0]
        return out

    return dataclasses.replace(kernel, fn=fn), seen


def test_bind_views_torch_memory() -> None:
    from refcore.call import bind

    x = torch.randn(4, 6, dtype=torch.bfloat16)
    call = bind(REG.op("relu"), (x,), {})
    assert call.arguments["input"].__array_interface__["data"][0] == x.data_ptr()


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_sees_inputs_and_returns_output_without_copies(kernel) -> None:
    op = REG.op(kernel.op)
    spy, seen = _spy(kernel)
    for seed in range(30):
        dtype = sorted(kernel.dtypes)[seed % len(kernel.dtypes)]
        sample = draw_sample(op, dtype, RandomDraw(seed))
        args = {k: torch.from_numpy(np.ascontiguousarray(v).view(np.int16)).view(torch.bfloat16)
                if isinstance(v, np.ndarray) and v.dtype == refcore.tensors.BFLOAT16
                else torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray)
                else v for k, v in sample.args.items()}  # fmt: skip
        with using_providers(Provider(name="spy", kernels=(spy,), priority=100)):
            why = refcore.explain(kernel.op, provider="spy", **args)
            if why.chosen is None:
                continue
            out = refcore.run(kernel.op, provider="spy", **args)
        ptrs = {k: v.data_ptr() for k, v in args.items()
                if isinstance(v, torch.Tensor) and v.numel()}  # fmt: skip
        for k, p in ptrs.items():
            assert seen["in"][k] == p, f"{kernel.name}: argument {k} was copied before the kernel"
        if out.numel():
            assert out.data_ptr() == seen["out"], f"{kernel.name}: output copied after the kernel"
        return
    pytest.fail(f"{kernel.name} accepted none of 30 contiguous samples")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_all_finite_sees_every_inf_and_nan(dtype) -> None:
    from refcore.tensors import all_finite, numpy_dtype

    dt = numpy_dtype(dtype)
    a = np.linspace(-3e38, 3e38, 257).astype(np.float64).astype(dt)
    assert all_finite(a) and all_finite(a[::3]) and all_finite(a[:0])
    for v in (np.inf, -np.inf, np.nan):
        for i in (0, 128, 256):
            b = a.copy()
            b[i] = v
            assert not all_finite(b) and not all_finite(b.reshape(1, 257)[:, ::-1])
