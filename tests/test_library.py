"""The torch custom ops ``torch.ops.refcore.<op>`` (refcore/library.py), walked over the registry:
opcheck on sampled inputs, results equal to `refcore.run`, fake tensors, torch.compile."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from registry_params import op_dtypes

import refcore
from refcore import library
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample
from refcore.schema import parse


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    library.register()


def _overload(name: str, kwargs: dict) -> torch._ops.OpOverload:
    """The overload a call with ``kwargs`` resolves to (opcheck takes one overload)."""
    spec = default_registry().op(name)
    packet = getattr(torch.ops.refcore, name)
    for arg in spec.signature.args:
        if arg.type == "int[2]|str" and isinstance(kwargs.get(arg.name), str):
            return getattr(packet, arg.name)
    return packet.default


def _sample(name: str, dtype: str) -> dict:
    """Sampled torch arguments whose output has no NaN: opcheck compares eager and traced
    outputs with ``torch.testing.assert_close``, for which NaN != NaN."""
    spec = default_registry().op(name)
    for seed in range(50):
        kwargs = draw_sample(spec, dtype, RandomDraw(seed)).torch_args()
        out = refcore.run(name, **kwargs, provider="reference")
        if not torch.isnan(out.float()).any():
            return kwargs
    raise AssertionError(f"{name}: no sample without NaN outputs in 50 draws")


def test_every_spec_op_is_a_torch_op() -> None:
    reg = default_registry()
    assert library.register() is library.register()  # once per process
    assert dict(library.register().declined) == {}  # every spec signature maps onto torch's
    for name, spec in reg.ops.items():
        packet = getattr(torch.ops.refcore, name)
        overloads = library.schemas(spec.signature)
        assert sorted(packet.overloads()) == sorted(o for o, _ in overloads), name
        for overload, schema in overloads:
            got = str(getattr(packet, overload)._schema)
            assert got == str(torch._C.parse_schema(f"refcore::{schema}")), (got, schema)


def test_registration_waits_for_first_use() -> None:
    code = (
        "import refcore, torch; refcore.optimize; "
        "assert not hasattr(torch.ops.refcore, 'relu'); "
        "refcore.library.register(); assert hasattr(torch.ops.refcore, 'relu')"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_union_types_become_overloads_as_in_aten() -> None:
    sig = parse("conv(Tensor input, int[2] stride=1, int[2]|str padding=0) -> Tensor")
    assert library.schemas(sig) == [
        ("default", "conv(Tensor input, int[2] stride=1, int[2] padding=0) -> Tensor"),
        ("padding", "conv.padding(Tensor input, int[2] stride=1, str padding='valid') -> Tensor"),
    ]
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    same = torch.ops.refcore.conv2d(x, w, padding="same")
    torch.testing.assert_close(same, torch.nn.functional.conv2d(x, w, padding="same"))
    torch.testing.assert_close(torch.ops.refcore.conv2d(x, w, None, 1, 1), same)


@pytest.mark.parametrize(("name", "dtype"), op_dtypes())
def test_opcheck(name: str, dtype: str) -> None:
    kwargs = _sample(name, dtype)
    tol = default_registry().op(name).tolerance_for(dtype)
    torch.library.opcheck(_overload(name, kwargs), (), kwargs, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("provider", ["reference", "auto"])
@pytest.mark.parametrize("name", sorted(default_registry().ops))
def test_results_equal_refcore_run(name: str, provider: str) -> None:
    kwargs = draw_sample(default_registry().op(name), "float32", RandomDraw(1)).torch_args()
    with library.using(provider):
        got = getattr(torch.ops.refcore, name)(**kwargs)
    expected = refcore.run(name, **kwargs, provider=provider)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


@pytest.mark.parametrize("name", sorted(default_registry().ops))
def test_fake_tensors_give_the_output_shape_and_dtype(name: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = default_registry().op(name)
    dtype = "bfloat16" if "bfloat16" in op.dtypes else op.dtypes[0]
    kwargs = draw_sample(op, dtype, RandomDraw(2)).torch_args()
    real = getattr(torch.ops.refcore, name)(**kwargs)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for k, v in kwargs.items()}  # fmt: skip
        out = getattr(torch.ops.refcore, name)(**fake)
    assert (out.shape, out.dtype) == (real.shape, real.dtype)


def test_an_unmappable_signature_is_declined_with_its_reason() -> None:
    from refcore.spec import Arg, Signature

    sig = Signature("odd", (Arg("input", "Tensor"), Arg("mode", "complex")))
    with pytest.raises(ValueError, match="'mode' has type 'complex', which has no torch schema"):
        library.schemas(sig)
    with pytest.raises(ValueError, match="unknown op 'odd'"):
        library.torch_op("odd")


def test_errors_are_the_specs() -> None:
    with pytest.raises(ValueError, match="'other' expected a shape broadcastable"):
        torch.ops.refcore.add_relu(torch.ones(2, 3), torch.ones(4))


def test_compile_sees_through_a_fused_op() -> None:
    def f(x, w, b):
        return torch.ops.refcore.linear_gelu(x, w, b, approximate="tanh") * 2

    x, w, b = torch.randn(5, 8), torch.randn(3, 8), torch.randn(3)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)  # a graph break raises
    expected = 2 * torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    torch.testing.assert_close(compiled(x, w, b), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled(x[:2], w, b), expected[:2], atol=1e-5, rtol=1e-5)
    explained = torch._dynamo.explain(f)(x, w, b)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    routed = torch.compile(f, backend="refcore", fullgraph=True)  # refcore's own backend too
    torch.testing.assert_close(routed(x, w, b), expected, atol=1e-5, rtol=1e-5)
