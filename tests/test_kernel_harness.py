"""The generic kernel suite catches wrong kernels: a toy provider, one right kernel, one wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refcore.provider import Kernel, Verdict
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample
from refcore.testing import HypothesisDraw, check_kernel

RELU = default_registry().op("relu")


def _right(input):
    return np.where(np.isnan(input), input, np.maximum(input, 0)).astype(input.dtype)


F32 = frozenset({"float32"})
GOOD = Kernel(op="relu", name="toy_relu", fn=_right, dtypes=F32, layouts=frozenset({"contiguous"}))
OFF_BY_1PCT = Kernel(
    op="relu", name="toy_relu_bad", fn=lambda input: _right(input) * np.float32(1.01), dtypes=F32
)
WRITES = Kernel(
    op="relu", name="toy_relu_inplace", fn=lambda input: np.maximum(input, 0, out=input), dtypes=F32
)
NO_REASON = Kernel(
    op="relu", name="toy_mute", fn=_right, dtypes=F32, rule=lambda call: Verdict(False, "")
)


@given(data=st.data())
def test_correct_kernel_passes(data) -> None:
    check_kernel(GOOD, RELU, draw_sample(RELU, "float32", HypothesisDraw(data)))


@pytest.mark.parametrize(
    ("kernel", "message"),
    [
        (OFF_BY_1PCT, "differ beyond"),
        (WRITES, "wrote to its inputs"),
        (NO_REASON, "without a reason"),
    ],
)
def test_wrong_kernel_is_caught(kernel, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        for seed in range(50):
            check_kernel(kernel, RELU, draw_sample(RELU, "float32", RandomDraw(seed)))


def test_declines_with_reason() -> None:
    strided = next(
        s for s in (draw_sample(RELU, "float32", RandomDraw(i)) for i in range(100))
        if s.layout == "strided" and s.args["input"].size > 1
    )  # fmt: skip
    assert check_kernel(GOOD, RELU, strided) is False
