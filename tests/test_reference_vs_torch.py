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
    want = spec.output_dtype(dtype, sample.args)
    assert tensors.dtype_name(got) == want, f"output dtype {got.dtype}, expected {want}"
    assert snapshot(sample.args) == before, "the reference wrote to its inputs"
    expected = torch_oracle(spec, sample)
    assert_close(got, expected, spec.tolerance_for(dtype, oracle=True), f"{op} vs torch")
    # The same call on torch tensors sharing the arrays' memory gives a torch tensor, same values.
    views = {
        k: tensors.to_torch(v) if isinstance(v, np.ndarray) else v for k, v in sample.args.items()
    }
    got_t = refcore.run(op, provider="reference", **views)
    assert tensors.is_torch(got_t) and str(got_t.dtype) == f"torch.{want}"
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seed", range(4))
def test_attention_equal_keys_give_the_values_mean(dtype: str, seed: int) -> None:
    """The equal-keys, scale 1e20 sample, where torch is no oracle (specs/attention.yaml): every
    score of a row is the same number, so the softmax is uniform and the output the values' mean."""
    rng = np.random.default_rng(seed)
    S, E, V = int(rng.integers(9, 32)), int(rng.integers(9, 41)), int(rng.integers(1, 9))
    np_dtype = tensors.numpy_dtype(dtype)
    query = rng.standard_normal((2, 3, E)).astype(np_dtype)
    key = np.full((2, S, E), 0.5, dtype=np_dtype)
    value = rng.standard_normal((2, S, V)).astype(np_dtype)
    got = refcore.run(
        "scaled_dot_product_attention",
        provider="reference",
        query=query,
        key=key,
        value=value,
        scale=1e20,
    )
    mean = value.astype(np.float64).mean(axis=1, keepdims=True)
    spec = default_registry().op("scaled_dot_product_attention")
    assert_close(got, np.broadcast_to(mean, got.shape), spec.tolerance_for(dtype), "equal keys")
