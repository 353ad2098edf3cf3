"""Native activation formulas against the float64 reference over dense fp32 grids.

The generic suite (test_kernels.py) draws random samples; the vector gelu/silu formulas are
approximations whose error varies with x, so this walks a dense, deterministic set of fp32
inputs across both tails (every 61st fp32 with |x| in [2^-4, 16), all bf16 values) plus the
special values, and holds every native variant to the op's spec tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import refcore_native

from refcore.ops import elementwise as ref_ops
from refcore.registry import default_registry
from refcore.tensors import BFLOAT16

F = np.float32


def _grid() -> np.ndarray:
    lo, hi = F(2.0**-4).view(np.int32), F(16.0).view(np.int32)
    mag = np.arange(lo, hi, 61, dtype=np.int32).view(F)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e4, -1e4, 3e38, -3e38])
    return np.concatenate([mag, -mag, special.astype(F)])


def _all_bf16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BFLOAT16)


CASES = [
    (k, dt, approx)
    for k in refcore_native.make_provider().kernels
    if k.op in ("gelu", "silu")
    for dt in sorted(k.dtypes)
    for approx in (("none", "tanh") if k.op == "gelu" else (None,))
]


@pytest.mark.parametrize(
    "kernel,dtype,approximate",
    CASES,
    ids=[f"{k.name}-{dt}-{a}" for k, dt, a in CASES],
)
def test_activation_within_tolerance_on_dense_grid(kernel, dtype, approximate):
    x = _grid() if dtype == "float32" else _all_bf16()
    kw = {} if approximate is None else {"approximate": approximate}
    got = kernel.fn(x, **kw).astype(np.float64)
    with np.errstate(invalid="ignore"):  # ml_dtypes warns when widening bf16 NaNs
        want = getattr(ref_ops, kernel.op)(x, **kw).astype(np.float64)
    tol = default_registry().op(kernel.op).tolerance_for(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    same = got[ok] == want[ok]  # equal infinities included
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf (counted as same)
        err = np.where(same, 0.0, np.abs(got[ok] - want[ok]))
    bound = tol.atol + tol.rtol * np.abs(want[ok])
    worst = np.argmax(err / bound)
    assert err[worst] <= bound[worst], (
        f"{kernel.name} {dtype}: x = {x[ok][worst]!r} gives {got[ok][worst]!r}, "
        f"reference {want[ok][worst]!r}"
    )
