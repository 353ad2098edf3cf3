"""Bad input raises a clear error naming the op, the argument, expected and given.

Spec-declared error cases run for every op; the generic classes (unknown op/provider/argument,
missing argument, unsupported or mismatched dtype, non-tensor, bad attribute type or choice, non-CPU
tensor) are derived from each op's signature, so a new spec gets them without a new test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from registry_params import error_cases

import refcore
from refcore.registry import EXCEPTIONS, default_registry
from refcore.sampling import RandomDraw, draw_sample, error_args
from refcore.tensors import to_torch

REG = default_registry()
OPS = sorted(REG.ops)


def _valid(op: str, seed: int = 0) -> dict:
    spec = REG.op(op)
    return dict(draw_sample(spec, spec.dtypes[0], RandomDraw(seed)).args)


@pytest.mark.parametrize(("op", "index"), error_cases())
@pytest.mark.parametrize("provider", ["auto", "reference"])
def test_declared_error_case(op: str, index: int, provider: str) -> None:
    case = REG.op(op).errors[index]
    with pytest.raises(EXCEPTIONS[case.raises], match=re.escape(case.match)) as info:
        refcore.run(op, provider=provider, **error_args(case))
    assert op in str(info.value), f"message does not name the op: {info.value}"


@pytest.mark.parametrize("op", OPS)
def test_every_op_declares_error_cases(op: str) -> None:
    spec = REG.op(op)
    attrs_or_relations = len(spec.signature.args) > 1
    assert spec.errors or not attrs_or_relations, f"{op} declares no bad-input cases"


def test_unknown_op() -> None:
    with pytest.raises(ValueError, match="unknown op 'no_such_op'; known ops: .*relu"):
        refcore.run("no_such_op", np.zeros(1, np.float32))


@pytest.mark.parametrize("op", OPS)
def test_unknown_provider(op: str) -> None:
    with pytest.raises(ValueError, match=f"{op}: unknown provider 'nope'; known: auto"):
        refcore.run(op, provider="nope", **_valid(op))


@pytest.mark.parametrize("op", OPS)
def test_unexpected_and_missing_arguments(op: str) -> None:
    args = _valid(op)
    with pytest.raises(TypeError, match=f"{op}\\(\\) got an unexpected argument 'bogus'"):
        refcore.run(op, bogus=1, **args)
    required = next(a.name for a in REG.op(op).signature.args if not a.has_default)
    del args[required]
    with pytest.raises(TypeError, match=f"{op}\\(\\) missing required argument '{required}'"):
        refcore.run(op, **args)


@pytest.mark.parametrize("op", OPS)
def test_too_many_positional(op: str) -> None:
    n = len([a for a in REG.op(op).signature.args if not a.kwarg_only])
    with pytest.raises(TypeError, match=f"{op}\\(\\) takes at most {n} positional"):
        refcore.run(op, *([None] * (n + 1)))


def _first_t_tensor(op: str, args: dict) -> str:
    """The first tensor of the compute dtype drawn, else (an op whose only float tensor is an
    optional one, as qlinear's bias) the first tensor."""
    tensors = REG.op(op).signature.tensor_args
    present = [a for a in tensors if isinstance(args.get(a.name), np.ndarray)]
    return next((a.name for a in present if "T" in a.dtypes), present[0].name)


@pytest.mark.parametrize("op", OPS)
def test_unsupported_dtype(op: str) -> None:
    args = _valid(op)
    name = _first_t_tensor(op, args)
    with np.errstate(over="ignore"):
        args[name] = args[name].astype(np.float16)
    with pytest.raises(
        TypeError, match=f"{op}: argument '{name}' expected dtype .* got dtype float16"
    ):
        refcore.run(op, **args)


@pytest.mark.parametrize("op", [o for o in OPS if len([
    a for a in REG.op(o).signature.tensor_args if a.dtypes == ("T",)]) >= 2])  # fmt: skip
def test_mismatched_dtypes(op: str) -> None:
    spec = REG.op(op)
    for seed in range(
        20
    ):  # find a draw where a second T tensor is present (optional ones may be None)
        args = _valid(op, seed)
        present = [a.name for a in spec.signature.tensor_args
                   if a.dtypes == ("T",) and isinstance(args.get(a.name), np.ndarray)]  # fmt: skip
        if len(present) >= 2:
            break
    other = next(d for d in ("bfloat16", "float32") if d != spec.dtypes[0])
    args[present[1]] = refcore.tensors.round_to(args[present[1]].astype(np.float64), other)
    with pytest.raises(
        TypeError, match=f"{op}: argument '{present[1]}' expected dtype {spec.dtypes[0]}"
    ):
        refcore.run(op, **args)


@pytest.mark.parametrize("op", OPS)
def test_non_tensor_argument(op: str) -> None:
    args = _valid(op)
    name = _first_t_tensor(op, args)
    args[name] = args[name].tolist()
    with pytest.raises(
        TypeError, match=f"{op}: argument '{name}' expected a NumPy array or torch tensor"
    ):
        refcore.run(op, **args)


@pytest.mark.parametrize("op", OPS)
def test_non_cpu_tensor(op: str) -> None:
    valid = _valid(op)
    args = {k: to_torch(v) if isinstance(v, np.ndarray) else v for k, v in valid.items()}
    name = _first_t_tensor(op, valid)
    args[name] = torch.empty(args[name].shape, device="meta")
    with pytest.raises(
        ValueError, match=f"{op}: argument '{name}' expected a CPU tensor; got device meta"
    ):
        refcore.run(op, **args)


ATTRS = [
    pytest.param(op, a.name, id=f"{op}-{a.name}")
    for op in OPS for a in REG.op(op).signature.args if not a.is_tensor
]  # fmt: skip


@pytest.mark.parametrize(("op", "attr"), ATTRS)
def test_bad_attribute_type(op: str, attr: str) -> None:
    args = _valid(op)
    args[attr] = object()
    with pytest.raises(TypeError, match=f"{op}: argument '{attr}' expected"):
        refcore.run(op, **args)


@pytest.mark.parametrize(("op", "attr"), [p for p in ATTRS
    if REG.op(p.values[0]).signature.arg(p.values[1]).choices is not None])  # fmt: skip
def test_attribute_outside_choices(op: str, attr: str) -> None:
    a = REG.op(op).signature.arg(attr)
    bad = {"str": "not_a_choice", "bool": True, "float": 12345.0, "int": 12345}[a.type]
    if bad in a.choices:
        bad = not bad if a.type == "bool" else bad
    args = _valid(op)
    args[attr] = bad
    with pytest.raises(ValueError, match=f"{op}: argument '{attr}' expected one of"):
        refcore.run(op, **args)
