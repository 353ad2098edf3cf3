"""The optimizer rules of specs/optim.yaml, generated from the registry: each NumPy reference
against its torch oracle over several steps with drawn hyper-parameters, and the split-BF16
master against the float32 one, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refcore.ops import optim
from refcore.registry import default_registry, resolve

REG = default_registry()
OPTIMIZERS = sorted(REG.optimizers)
# float32 torch against a float64 reference, each rounding once: a few ulps of the update a
# step, compounding over the steps
RTOL, ATOL = 2e-5, 1e-6


def _draw_hp(draw, name: str) -> dict:
    hps = {}
    for hp, raw in REG.optimizers[name].hyperparameters.items():
        if "choice" in raw:
            hps[hp] = draw(st.sampled_from(raw["choice"]))
        else:
            lo, hi = raw["range"]
            hps[hp] = draw(st.floats(lo, hi))
    if "betas" in hps:
        hps["betas"] = tuple(hps["betas"])
    if hps.get("nesterov"):  # torch's rule (specs/optim.yaml): momentum > 0, no dampening
        hps["momentum"], hps["dampening"] = max(hps["momentum"], 0.1), 0.0
    return hps


@st.composite
def _case(draw, name: str) -> tuple[dict, list[tuple[int, ...]], int, int]:
    shapes = draw(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
                           min_size=1, max_size=3))  # fmt: skip
    return _draw_hp(draw, name), shapes, draw(st.integers(1, 5)), draw(st.integers(0, 2**31))


def _torch_optimizer(name: str, params: list[torch.Tensor], hps: dict) -> torch.optim.Optimizer:
    cls = resolve(REG.optimizers[name].torch)
    if cls.__module__.startswith("torch.optim"):
        return cls(params, foreach=False, **hps)
    return cls(params, **hps)


@pytest.mark.parametrize("name", OPTIMIZERS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_reference_is_torchs_optimizer(name: str, data) -> None:
    """Several steps of the reference on each of a few parameters give torch's parameters and
    state (same names) within a few float32 ulps."""
    hps, shapes, steps, seed = data.draw(_case(name))
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tparams = [torch.tensor(p, requires_grad=True) for p in params]
    opt = _torch_optimizer(name, tparams, hps)
    rule, states = resolve(REG.optimizers[name].reference), [{} for _ in params]
    for n in range(1, steps + 1):
        for i, (p, tp) in enumerate(zip(params, tparams)):
            g = rng.standard_normal(p.shape).astype(np.float32)
            tp.grad = torch.from_numpy(g.copy())
            params[i], states[i] = rule(p, g, states[i], step=n, **hps)
        opt.step()
    for p, tp, state in zip(params, tparams, states):
        np.testing.assert_allclose(p, tp.detach().numpy(), rtol=RTOL, atol=ATOL)
        theirs = {k: v for k, v in opt.state[tp].items() if k != "step"}
        theirs = {k: v for k, v in theirs.items() if v is not None}
        assert set(state) <= set(REG.optimizers[name].state)
        assert set(state) == set(theirs), (state.keys(), theirs.keys())
        for k, v in state.items():
            np.testing.assert_allclose(v, theirs[k].numpy(), rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS
                                  if "split_bf16" in REG.optimizers[n].masters])  # fmt: skip
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_split_bf16_master_is_the_float32_master(name: str, data) -> None:
    """Steps on a split-BF16 master (bf16 top half + trailing 16 bits) keep the float32 master
    bit for bit, and the top half is always the master's bf16 truncation."""
    hps, shapes, steps, seed = data.draw(_case(name))
    rng = np.random.default_rng(seed)
    rule = resolve(REG.optimizers[name].reference)
    master = rng.standard_normal(shapes[0]).astype(np.float32)
    top, bottom = optim.split_bf16(master)
    s32, s16 = {}, {}
    for n in range(1, steps + 1):
        g = rng.standard_normal(master.shape).astype(np.float32)
        master, s32 = rule(master, g, s32, step=n, **hps)
        top, bottom, s16 = optim.step_split_bf16(rule, top, bottom, g, s16, step=n, **hps)
        assert optim.join_bf16(top, bottom).tobytes() == master.tobytes()
        trunc = (master.view(np.uint32) >> 16).astype(np.uint16)
        assert top.tobytes() == trunc.tobytes()


def test_split_bf16_round_trips_every_bit_pattern_class() -> None:
    x = np.float32([0.0, -0.0, 1.0, -3.4e38, 1e-45, np.inf, -np.inf, np.nan, 1.0000001])
    top, bottom = optim.split_bf16(x)
    assert optim.join_bf16(top, bottom).tobytes() == x.tobytes()
    assert top.dtype == np.uint16 and bottom.dtype == np.uint16


def test_references_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="sgd: argument 'param' expected a float32 array"):
        optim.sgd(np.float64([1.0]), np.float64([1.0]), {}, step=1, lr=0.1)
    with pytest.raises(ValueError, match=r"adam: argument 'grad' expected shape \(2,\)"):
        optim.adam(np.float32([1.0, 2.0]), np.float32([1.0]), {}, step=1, lr=0.1)


def test_lamb_trust_ratio_is_one_at_zero_norms_and_clamps_the_weight_norm() -> None:
    """A zero weight takes the plain Adam-like step (ratio 1); a large one is clamped to
    clamp_max before the ratio."""
    g = np.float32([1.0, -1.0])
    p, _ = optim.lamb(np.zeros(2, np.float32), g, {}, step=1, lr=0.1, betas=(0.0, 0.0), eps=0)
    np.testing.assert_allclose(p, [-0.1, 0.1], rtol=1e-6)
    big = np.float32([300.0, 400.0])  # ||w|| = 500, clamped to 10
    p, _ = optim.lamb(big, g, {}, step=1, lr=0.1, betas=(0.0, 0.0), eps=0, clamp_max=10.0)
    u_norm = np.sqrt(2.0)
    want = 0.1 * 10 / u_norm * np.float32([1, -1])
    np.testing.assert_allclose(big - p, want, atol=4e-5)  # the float32 ulp of 300: 3e-5
