"""A fused op is one declaration, its pattern: its reference, check and torch oracle are derived
from it (`refcore.derive`; tests/test_reference_vs_torch.py and tests/test_kernels.py test them
as every op), and the pattern matches the very composition its oracle runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import count_example
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.passes.shape_prop import ShapeProp

from refcore import derive, library
from refcore.passes.fuse import rewrite
from refcore.registry import default_registry, resolve
from refcore.sampling import draw_sample
from refcore.testing import HypothesisDraw, call_torch

REG = default_registry()
FUSED = sorted(n for n, s in REG.ops.items() if "fused" in s.tags)
PATTERNS = [f.name for f in REG.fusions.values() if f.op in FUSED]


def test_every_fused_op_has_a_pattern() -> None:
    named = {f.op for f in REG.fusions.values()}
    assert set(FUSED) <= named, f"fused ops without a pattern: {sorted(set(FUSED) - named)}"


@pytest.mark.parametrize("op", FUSED)
def test_fused_meaning_is_derived(op: str) -> None:
    """No hand-written reference or oracle is left for a fused op (one declaration)."""
    spec = REG.op(op)
    for dotted in (spec.reference, spec.check, spec.torch.function):
        assert isinstance(resolve(dotted), derive.Derived), dotted


@pytest.mark.parametrize("op", FUSED)
@settings(max_examples=8, deadline=None)
@given(data=st.data(), bf16=st.booleans())
def test_built_torch_call_is_the_oracle(op: str, data, bf16: bool) -> None:
    """`derive.torch_call` (the oracle built once into closures, what plans replay where torch
    runs a fused op) makes torch's very calls: bit-identical to the interpreted oracle."""
    count_example()
    dtype = "bfloat16" if bf16 else "float32"
    spec = REG.op(op)
    if dtype not in spec.dtypes:
        dtype = "float32"
    sample = draw_sample(spec, dtype, HypothesisDraw(data), oracle=True)
    named = sample.torch_args()
    want = call_torch(spec, derive.oracle(op), named)
    got = derive.torch_call(op)(named)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
        torch.testing.assert_close(g, w, rtol=0.0, atol=0.0, equal_nan=True, msg=op)


class _Composition(torch.nn.Module):
    """A fused op's derived torch oracle as a module whose tensors are its inputs."""

    def __init__(self, op: str, names: list[str], consts: dict) -> None:
        super().__init__()
        self.oracle, self.names, self.consts = derive.oracle(op), names, consts

    def forward(self, t0, t1=None, t2=None, t3=None, t4=None) -> torch.Tensor:  # no *args
        return self.oracle(**dict(zip(self.names, (t0, t1, t2, t3, t4))), **self.consts)


class _CustomComposition(_Composition):
    """A quantized fused op's pattern as the graph of a `refcore.quantize`d layer under dynamo
    has it: torch.ops.refcore.<op> nodes (refcore.oracles' int8 steps are Python code a trace
    would go through)."""

    def __init__(self, op: str, names: list[str], consts: dict) -> None:
        super().__init__(op, names, consts)
        pattern = next(f.pattern for f in REG.fusions.values() if f.op == op)

        def call(component: str, kw: dict) -> torch.Tensor:
            if "quantized" in REG.op(component).tags:
                return library.torch_op(component)(**kw)
            return resolve(REG.op(component).torch.function)(**kw)

        defaults = {a.name: a.default for a in REG.op(op).signature.args if a.has_default}
        self.oracle = lambda **named: derive._compose(pattern, {**defaults, **named}, call)


@pytest.mark.parametrize("pattern", PATTERNS)
@settings(max_examples=min(20, settings.default.max_examples))  # each example traces a model
@given(data=st.data())
def test_pattern_matches_its_own_composition(pattern: str, data) -> None:
    """Trace the derived oracle: the pattern finds it and fuses it into its op, same values."""
    fusion = REG.fusions[pattern]
    sample = draw_sample(REG.op(fusion.op), "float32", HypothesisDraw(data), oracle=True)
    count_example()
    names = [k for k, v in sample.args.items() if isinstance(v, np.ndarray)]
    tensors = [torch.from_numpy(np.ascontiguousarray(sample.args[k])) for k in names]
    tensors += [None] * (5 - len(tensors))
    consts = {k: v for k, v in sample.args.items() if k not in names}
    quantized = "quantized" in REG.op(fusion.op).tags
    model = (_CustomComposition if quantized else _Composition)(fusion.op, names, consts)
    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*tensors)
    notes: list[str] = []
    done = rewrite(gm, "fuse", "reference", None, notes)
    assert done == {pattern: 1}, (notes, gm.code)
    tol = REG.op(fusion.op).tolerance_for("float32", oracle=True)
    with library.using("reference"):  # the custom ops' nodes (quantized) by the references
        got, want = gm(*tensors), model(*tensors)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
