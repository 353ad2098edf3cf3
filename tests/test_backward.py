"""Every declared backward (an op spec's ``backward:``) against torch's autograd in float64, on
inputs drawn from the op's samples: the reference's gradients, computed in float64 from the
float32 inputs and rounded once, are torch's float64 gradients of the same values within the
float32 rounding of a gradient (relative to the largest one of its tensor)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import count_example
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from refcore import tensors
from refcore.registry import default_registry, resolve
from refcore.sampling import RandomDraw, draw_sample
from refcore.testing import HypothesisDraw, call_torch

REG = default_registry()
BACKWARD = sorted(n for n, op in REG.ops.items() if op.backward)


def test_the_training_ops_declare_a_backward() -> None:
    """The ops of issue #17's list that have a backward today (the list grows with it)."""
    assert {"linear", "matmul", "layer_norm", "rms_norm", "gelu", "silu", "softmax",
            "log_softmax", "embedding"} <= set(BACKWARD)  # fmt: skip


def _floats(sample) -> dict[str, np.ndarray]:
    return {k: v for k, v in sample.args.items()
            if isinstance(v, np.ndarray) and v.dtype.kind == "f"}  # fmt: skip


def _finite(sample) -> bool:
    """Gradients at inf or NaN inputs are NaN in different ways: no oracle there."""
    return all(tensors.all_finite(v) for v in _floats(sample).values())


def _torch_named(name: str, named: dict) -> dict:
    """The arguments torch's function is differentiated on: torch 2.13's group_norm backward
    fails ("tensor does not have a device") for a bias without a weight, so such a call gets
    the weight it means, ones (no gradient asked of it)."""
    if name == "group_norm" and named.get("weight") is None and named.get("bias") is not None:
        x = named["input"]
        named = {**named, "weight": torch.ones(x.shape[1], dtype=x.dtype)}
    return named


def _check(name: str, sample, seed: int) -> None:
    spec = REG.op(name)
    wrt = [w for w in spec.backward.wrt if sample.args.get(w) is not None]
    floats = _floats(sample)
    named = {}
    for k, v in sample.args.items():
        if k in floats:
            named[k] = torch.from_numpy(v.astype(np.float64)).requires_grad_(k in wrt)
        elif isinstance(v, np.ndarray):
            named[k] = torch.from_numpy(v.copy())
        else:
            named[k] = v
    if name == "rms_norm" and named.get("eps") is None:  # float32's epsilon is the meaning;
        named["eps"] = float(np.finfo(np.float32).eps)  # in float64 torch would take float64's
    out = call_torch(spec, resolve(spec.torch.function), _torch_named(name, named))
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(tuple(out.shape)).astype(np.float32)
    # grad_output in the output's memory layout, as autograd hands it on: torch 2.13's CPU
    # batch_norm backward misreads a contiguous one beside a channels-last input
    go = torch.empty_like(out).copy_(torch.from_numpy(g.astype(np.float64)))
    want = torch.autograd.grad(out, [named[w] for w in wrt], go, allow_unused=True)
    if name == "group_norm" and sample.args["input"].size == 0:
        # torch 2.13's group_norm backward forms dweight from each empty group's mean and rstd
        # (NaN: 0 / 0), giving NaN where no output depends on the weight: the sum over no values
        # is 0, as the reference (and torch for an empty batch, N = 0) gives
        want = tuple(None if t is None else torch.nan_to_num(t, nan=0.0) for t in want)
    got = resolve(spec.backward.reference)(g, **sample.args)
    # float64 noise where the exact gradient is 0 (layer_norm over one element: torch's x - mean
    # leaves ~1e-16): far below any float32 gradient of these magnitudes
    big = max([float(np.abs(v).max()) for v in floats.values() if v.size] + [1.0])
    floor = 1e-10 * big * max(float(np.abs(g).max()) if g.size else 0.0, 1.0)
    assert set(got) == set(wrt), (sorted(got), wrt)
    for w, t in zip(wrt, want):
        ref = np.zeros(sample.args[w].shape) if t is None else t.numpy()
        with np.errstate(over="ignore"):  # the float64 gradient as stored: +-inf past float32
            ref = ref.astype(sample.args[w].dtype).astype(np.float64)
        mine = np.asarray(got[w], np.float64)
        assert got[w].dtype == sample.args[w].dtype and mine.shape == ref.shape, w
        finite = np.abs(ref[np.isfinite(ref)])
        scale = float(finite.max()) if finite.size else 0.0  # an inf must not widen the tolerance
        np.testing.assert_allclose(mine, ref, rtol=2e-6, atol=1e-6 * scale + floor,
                                   err_msg=f"{name} d/d{w}")  # fmt: skip


@pytest.mark.parametrize("name", BACKWARD)
@settings(deadline=None)
@given(data=st.data())
def test_backward_matches_torch_autograd(name: str, data) -> None:
    sample = draw_sample(REG.op(name), "float32", HypothesisDraw(data), oracle=True)
    assume(_finite(sample))
    count_example()
    _check(name, sample, data.draw(st.integers(0, 2**31)))


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("seed", [0, 1])
def test_backward_on_the_large_samples(name: str, seed: int) -> None:
    spec = REG.op(name)
    if not any(c.tier == "large" for c in spec.samples):
        pytest.skip(f"{name} has no large sample")
    sample = draw_sample(spec, "float32", RandomDraw(seed), tier="large", oracle=True)
    if not _finite(sample):
        pytest.skip("a large sample with inf or NaN: no oracle")
    _check(name, sample, seed)


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_custom_op_autograd_gives_torchs_gradients(name: str, seed: int) -> None:
    """torch.ops.refcore.<op> is differentiable through its declared backward: on a float32
    sample its gradients are torch's float32 autograd ones within the op's float32 tolerance."""
    from refcore import library

    spec = REG.op(name)
    why = library.register().without_autograd.get(name)
    if why is not None:  # a schema torch cannot differentiate: recorded, and the reason is real
        assert any(a.kwarg_only for a in spec.signature.tensor_args), why
        pytest.skip(f"{name}: no custom-op autograd ({why})")
    for draw in range(seed * 1000, seed * 1000 + 100):  # a finite sample (special-value
        sample = draw_sample(spec, "float32", RandomDraw(draw), oracle=True)  # cases have none)
        if _finite(sample):
            break
    else:
        pytest.fail(f"{name}: no finite sample in 100 draws")
    wrt = [w for w in spec.backward.wrt if sample.args.get(w) is not None]
    grads = []
    for fn in (library.torch_op(name), resolve(spec.torch.function)):
        named = {k: torch.from_numpy(v.copy()).requires_grad_(k in wrt)
                 if isinstance(v, np.ndarray) else v for k, v in sample.args.items()}  # fmt: skip
        out = call_torch(
            spec, fn, named if fn is library.torch_op(name) else _torch_named(name, named)
        )
        g = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(out.shape)))
        go = torch.empty_like(out).copy_(g)  # in the output's layout (see _check)
        grads.append(torch.autograd.grad(out, [named[w] for w in wrt], go, allow_unused=True))
    tol = spec.tolerance_for("float32", oracle=True)
    for w, mine, theirs in zip(wrt, *grads):
        theirs = torch.zeros_like(mine) if theirs is None else theirs
        finite = theirs[torch.isfinite(theirs)].abs()
        scale = float(finite.max()) if finite.numel() else 0.0
        # float32 overflow inside the forward (huge finite inputs) is NaN in both
        torch.testing.assert_close(mine, theirs, rtol=max(tol.rtol, 1e-5), equal_nan=True,
                                   atol=max(tol.atol, 1e-5) * max(scale, 1.0), msg=w)  # fmt: skip
