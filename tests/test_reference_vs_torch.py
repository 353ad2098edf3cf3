"""Every reference against torch's own op (an independent oracle), over inputs drawn from specs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import count_example
from hypothesis import given
from hypothesis import strategies as st
from registry_params import op_dtypes

import refcore
from refcore import tensors
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample
from refcore.testing import HypothesisDraw, assert_close, snapshot, torch_oracle


def _check(op: str, dtype: str, sample) -> None:
    spec = default_registry().op(op)
    before = snapshot(sample.args)
    got = refcore.run(op, provider="reference", **sample.args)
    assert isinstance(got, np.ndarray), f"NumPy inputs must give a NumPy output, got {type(got)}"
    assert tensors.dtype_name(got) == dtype, f"output dtype {got.dtype}, expected {dtype}"
    assert snapshot(sample.args) == before, "the reference wrote to its inputs"
    expected = torch_oracle(spec, sample)
    assert_close(got, expected, spec.tolerance_for(dtype, oracle=True), f"{op} vs torch")
    # The same call on torch tensors sharing the arrays' memory gives a torch tensor, same values.
    views = {
        k: tensors.to_torch(v) if isinstance(v, np.ndarray) else v for k, v in sample.args.items()
    }
    got_t = refcore.run(op, provider="reference", **views)
    assert tensors.is_torch(got_t) and str(got_t.dtype) == f"torch.{dtype}"
    assert_close(got_t, got, spec.tolerance_for(dtype), "torch-in vs numpy-in")


@pytest.mark.parametrize(("op", "dtype"), op_dtypes())
@given(data=st.data())
def test_reference_matches_torch(op: str, dtype: str, data) -> None:
    sample = draw_sample(default_registry().op(op), dtype, HypothesisDraw(data), oracle=True)
    count_example()
    _check(op, dtype, sample)


@pytest.mark.parametrize(("op", "dtype"), op_dtypes("large"))
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_set_matches_torch(op: str, dtype: str, seed: int) -> None:
    """The larger, fixed-seed reference set (``tier: large`` samples)."""
    sample = draw_sample(
        default_registry().op(op), dtype, RandomDraw(seed), tier="large", oracle=True
    )
    count_example()
    _check(op, dtype, sample)
