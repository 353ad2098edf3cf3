"""Every kernel of every installed provider against the reference, over inputs drawn from specs.

Parameters come from the installed providers (entry points) and the registry: a provider that adds
a kernel gets it tested here without writing a test. Run once per ISA level by setting
REFCORE_CPU_CAPABILITY (``.ci/run`` does).
"""

from __future__ import annotations

import pytest
from conftest import count_example
from hypothesis import event, given
from hypothesis import strategies as st

from refcore.provider import installed
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample
from refcore.testing import HypothesisDraw, check_kernel

REG = default_registry()


def kernel_params() -> list:
    out = []
    for pname, prov in sorted(installed().items()):
        if pname == "reference" or not prov.availability().available:
            continue
        for k in prov.kernels:
            if k.op not in REG.ops:  # an optimizer's step: tests/test_optim.py
                continue
            for dt in sorted(k.dtypes & set(REG.op(k.op).dtypes)):
                out.append(pytest.param(pname, k, dt, id=f"{pname}-{k.op}-{k.name}-{dt}"))
    return out


PARAMS = kernel_params()


def packed_params() -> list:
    """(provider, kernel, dtype, arg, layout) for every kernel that reads a packed layout."""
    out = []
    for pname, prov in sorted(installed().items()):
        if pname == "reference" or not prov.availability().available:
            continue
        for k in prov.kernels:
            if k.op not in REG.ops:
                continue
            for lay in sorted(k.layouts & set(REG.layouts)):
                spec = REG.layouts[lay]
                args = [a.split(".", 1)[1] for a in spec.args if a.split(".", 1)[0] == k.op]
                for dt in sorted(k.dtypes & set(spec.dtypes) & set(REG.op(k.op).dtypes)):
                    for arg in args:
                        pid = f"{pname}-{k.op}-{k.name}-{dt}-{arg}:{lay}"
                        out.append(pytest.param(pname, k, dt, arg, lay, id=pid))
    return out


PACKED = packed_params()


def test_kernel_suite_collected_every_kernel() -> None:
    """Every kernel of every available provider is in the suite (guards the parametrization)."""
    expected = sum(
        len(k.dtypes & set(REG.op(k.op).dtypes))
        for name, p in installed().items() if name != "reference" and p.availability().available
        for k in p.kernels
        if k.op in REG.ops
    )  # fmt: skip
    assert len(PARAMS) == expected


if PARAMS:

    @pytest.mark.parametrize(("provider", "kernel", "dtype"), PARAMS)
    @given(data=st.data())
    def test_kernel_matches_reference(provider: str, kernel, dtype: str, data) -> None:
        sample = draw_sample(REG.op(kernel.op), dtype, HypothesisDraw(data))
        count_example()
        ran = check_kernel(kernel, REG.op(kernel.op), sample)
        event("ran" if ran else "declined")

    @pytest.mark.parametrize(("provider", "kernel", "dtype"), PARAMS)
    def test_kernel_accepts_some_samples(provider: str, kernel, dtype: str) -> None:
        """A kernel that declines every drawn sample would pass the suite vacuously."""
        op = REG.op(kernel.op)
        ran = sum(
            check_kernel(kernel, op, draw_sample(op, dtype, RandomDraw(s))) for s in range(40)
        )
        assert ran > 0, f"{kernel.name} declined all 40 drawn {op.name} samples"


if PACKED:

    @pytest.mark.parametrize(("provider", "kernel", "dtype", "arg", "layout"), PACKED)
    @given(data=st.data())
    def test_kernel_on_packed_weights(provider, kernel, dtype, arg, layout, data) -> None:
        """Kernels that declare a packed layout, on the same samples with that argument packed."""
        sample = draw_sample(REG.op(kernel.op), dtype, HypothesisDraw(data))
        count_example()
        ran = check_kernel(kernel, REG.op(kernel.op), sample, packed={arg: layout})
        event("ran" if ran else "declined")

    @pytest.mark.parametrize(("provider", "kernel", "dtype", "arg", "layout"), PACKED)
    def test_kernel_accepts_some_packed_samples(provider, kernel, dtype, arg, layout) -> None:
        op = REG.op(kernel.op)
        ran = sum(
            check_kernel(kernel, op, draw_sample(op, dtype, RandomDraw(s)), packed={arg: layout})
            for s in range(40)
        )
        assert ran > 0, f"{kernel.name} declined all 40 drawn {op.name} samples with {layout}"
