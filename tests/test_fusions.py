"""Each fused op means the composition of its pattern's ops, through the pattern's bindings."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import count_example
from hypothesis import given
from hypothesis import strategies as st

from refcore.registry import default_registry, resolve
from refcore.sampling import draw_sample
from refcore.testing import HypothesisDraw

REG = default_registry()
PATTERNS = [
    pytest.param(f.name, dt, id=f"{f.name}-{dt}")
    for f in REG.fusions.values() if f.op for dt in REG.op(f.op).dtypes
]  # fmt: skip


def compose(fusion, args: dict):
    """Run the chain's references, feeding each op's output to the next as 'prev'."""
    prev = None
    for op, binding in zip(fusion.chain, fusion.inputs):
        kwargs = {name: prev if src == "prev" else args[src] for name, src in binding.items()
                  if src == "prev" or src in args}  # fmt: skip
        prev = resolve(REG.op(op).reference)(**kwargs)
    return prev


@pytest.mark.parametrize(("pattern", "dtype"), PATTERNS)
@given(data=st.data())
def test_fused_reference_is_the_composition(pattern: str, dtype: str, data) -> None:
    fusion = REG.fusions[pattern]
    sample = draw_sample(REG.op(fusion.op), dtype, HypothesisDraw(data))
    count_example()
    fused = resolve(REG.op(fusion.op).reference)(**sample.args)
    np.testing.assert_array_equal(
        fused.astype(np.float32), compose(fusion, sample.args).astype(np.float32)
    )


def test_every_fused_op_has_a_pattern() -> None:
    named = {f.op for f in REG.fusions.values()}
    fused = {n for n, s in REG.ops.items() if "fused" in s.tags}
    assert fused <= named, f"fused ops without a pattern: {sorted(fused - named)}"
