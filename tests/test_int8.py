"""The int8 family's observers and weight rule against torch's own (the ops themselves are in the
generated suites: tests/test_reference_vs_torch.py, test_kernels.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.ao.quantization.observer import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    PerChannelMinMaxObserver,
)

from refcore.ops import int8, observers

RANGES = [(0, 255, torch.quint8), (-128, 127, torch.qint8), (0, 127, torch.quint8)]


@pytest.mark.parametrize(("qmin", "qmax", "dtype"), RANGES)
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_minmax_qparams_are_torchs_observer(qmin, qmax, dtype, symmetric, seed) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(500) * rng.uniform(0.01, 10) + rng.uniform(-3, 3)).astype(np.float32)
    if seed == 5:
        x = np.abs(x)  # all positive: the range still covers 0
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    obs = MinMaxObserver(dtype=dtype, qscheme=scheme, quant_min=qmin, quant_max=qmax)
    obs(torch.from_numpy(x))
    scale, zp = obs.calculate_qparams()
    got = int8.minmax_qparams(float(x.min()), float(x.max()), qmin, qmax, symmetric)
    assert got == (scale.item(), zp.item())


def test_minmax_qparams_of_an_all_zero_range_is_eps() -> None:
    scale, zp = int8.minmax_qparams(0.0, 0.0, 0, 255, False)
    assert scale == float(np.finfo(np.float32).eps) and zp == 0
    x = torch.tensor([-0.01, 0.02])
    obs = MinMaxObserver(dtype=torch.quint8, quant_min=0, quant_max=255, eps=2**-12)
    obs(x)
    want = tuple(v.item() for v in obs.calculate_qparams())
    assert int8.minmax_qparams(-0.01, 0.02, 0, 255, False, 2**-12) == want


@pytest.mark.parametrize(
    ("rule", "qmin", "qmax"),
    [(int8.x86_int8_weight, -128, 127), (int8.x86_int8_weight_w7, -64, 63)],
)
@pytest.mark.parametrize("seed", range(4))
def test_x86_weight_is_torchs_per_channel_quantization(rule, qmin, qmax, seed) -> None:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((24, 40)) * rng.uniform(0.01, 1, (24, 1))).astype(np.float32)
    w[3] = 0.0  # an all-zero channel: scale eps, codes 0
    w[5] *= 1e-3  # a channel below the recipe's smallest scale (2^-12 * 127.5)
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, quant_min=qmin, quant_max=qmax,
                                   qscheme=torch.per_channel_symmetric, eps=2**-12)  # fmt: skip
    t = torch.from_numpy(w)
    obs(t)
    scales, zps = obs.calculate_qparams()
    q = torch.ops.quantized_decomposed.quantize_per_channel(t, scales, zps, 0, qmin, qmax,
                                                            torch.int8)  # fmt: skip
    got_q, got_s = rule(w)
    np.testing.assert_array_equal(got_s, scales.numpy())
    np.testing.assert_array_equal(got_q, q.numpy())


def test_x86_weight_rejects_groups_and_non_finite_values() -> None:
    with pytest.raises(ValueError, match="'group_size' expected None"):
        int8.x86_int8_weight(np.ones((2, 4), np.float32), 2)
    with pytest.raises(ValueError, match="'weight' expected finite values"):
        int8.x86_int8_weight(np.float32([[1.0, np.nan]]))


def test_qlinear_sums_past_int16_exactly() -> None:
    """The pairs a u8 x s8 dot-product instruction sums in int16 (vpmaddubsw) saturate at
    255 * -128 * 2; the declared sum is exact."""
    x = np.full((1, 64), 255, np.uint8)
    w = np.full((1, 64), -128, np.int8)
    y = int8.qlinear(x, 1.0, 0, w, np.float32([1.0]))
    assert y.tolist() == [[float(255 * -128 * 64)]]


_TORCH_OBSERVERS = {
    "minmax": MinMaxObserver,
    "moving_average": MovingAverageMinMaxObserver,
    "histogram": HistogramObserver,
}


@pytest.mark.parametrize("name", sorted(_TORCH_OBSERVERS))
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4),
    outliers=st.booleans(),
    qrange=st.sampled_from(RANGES),
    symmetric=st.booleans(),
)
def test_observer_is_torchs(name, seed, sizes, outliers, qrange, symmetric) -> None:
    """Each observer, fed the same calibration tensors one after the other (ranges that grow,
    shrink, outliers), gives torch's observer's scale and zero point exactly."""
    qmin, qmax, dtype = qrange
    rng = np.random.default_rng(seed)
    xs = [(rng.standard_normal(n) * rng.uniform(0.01, 5) + rng.uniform(-2, 2)).astype(np.float32)
          for n in sizes]  # fmt: skip
    if outliers:
        xs[-1][0] = np.float32(rng.choice([-1, 1]) * rng.uniform(10, 100))
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    obs = _TORCH_OBSERVERS[name](dtype=dtype, qscheme=scheme, quant_min=qmin, quant_max=qmax,
                                 eps=int8.X86_EPS)  # fmt: skip
    ours, state = observers.OBSERVERS[name], None
    for x in xs:
        obs(torch.from_numpy(x))
        state = ours.observe(state, x)
    want = tuple(v.item() for v in obs.calculate_qparams())
    assert ours.qparams(state, qmin, qmax, symmetric, int8.X86_EPS) == want


def test_histogram_observer_narrows_a_heavy_tailed_range() -> None:
    """What the histogram observer is for: on heavy tails (Student's t, 3 degrees of freedom)
    min-max spends the 256 levels on a few far values; the L2 search (greedy: it stops at the
    first step that does not lower the error) narrows the range, never widens it (torch's own
    gives the same, test_observer_is_torchs)."""
    hist, mm = observers.HISTOGRAM, observers.MINMAX
    ratios = []
    for seed in range(8):
        x = np.random.default_rng(seed).standard_t(3, 100_000).astype(np.float32)
        h = hist.qparams(hist.observe(None, x), 0, 255, False, 2**-12)[0]
        ratios.append(h / mm.qparams(mm.observe(None, x), 0, 255, False, 2**-12)[0])
    assert max(ratios) <= 1.0 and np.mean(ratios) < 0.95, ratios


def test_onednn_bench_anchors_compute_the_ops_on_7bit_weights() -> None:
    """The benchmarks' torch anchors (torch's own int8 path: oneDNN qlinear / qconv2d with the
    weight prepacked) compute qlinear and qconv2d where oneDNN is exact on any x86 CPU: with
    weights in [-64, 64] no u8 x s8 pair leaves int16, VNNI or not (float tail: the oracle
    tolerance)."""
    from refcore import oracles

    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (33, 70)).astype(np.uint8)
    w = rng.integers(-64, 65, (24, 70)).astype(np.int8)
    ws, b = rng.uniform(0.001, 0.02, 24).astype(np.float32), rng.normal(size=24).astype(np.float32)
    got = oracles.onednn_qlinear(*map(_t, (x,)), 0.02, 100, *map(_t, (w, ws, b)))
    np.testing.assert_allclose(got.numpy(), int8.qlinear(x, 0.02, 100, w, ws, b), rtol=1e-5,
                               atol=1e-4)  # fmt: skip
    xc = rng.integers(0, 256, (2, 9, 7, 6)).astype(np.uint8).transpose(0, 3, 1, 2)
    wc = rng.integers(-64, 65, (24, 6, 3, 3)).astype(np.int8)
    xt = torch.from_numpy(np.ascontiguousarray(xc.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
    got = oracles.onednn_qconv2d(xt, 0.02, 100, *map(_t, (wc, ws, b)), 2, 1)
    want = int8.qconv2d(xc, 0.02, 100, wc, ws, b, 2, 1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-4)


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _float64_qlinear(x, zp, w, ws, b, xs=0.02):
    acc = torch.matmul(x.double() - zp, w.double().T).float()
    return acc * (torch.tensor(xs, dtype=torch.float32) * ws) + b


def test_qlinear_oracle_is_torchs_int8_path_exactly_where_that_is_exact() -> None:
    """qlinear's torch function runs torch's own int8 linear (oneDNN) where its sums are exact
    on this CPU (VNNI, or 7-bit weights: no u8 x s8 pair leaves int16), else the float64 sums;
    so measured choice weighs a kernel against oneDNN wherever oneDNN means the op."""
    from refcore import cpu, oracles

    rng = np.random.default_rng(7)
    x = _t(rng.integers(0, 256, (40, 96)).astype(np.uint8))
    ws = _t(rng.uniform(0.001, 0.02, 32).astype(np.float32))
    b = _t(rng.normal(size=32).astype(np.float32))
    w7 = _t(rng.integers(-64, 65, (32, 96)).astype(np.int8))
    full = _t(np.where(rng.random((32, 96)) < 0.5, -128, 127).astype(np.int8))
    assert oracles.sums_pairs_in_int16(w7) and not oracles.sums_pairs_in_int16(full)
    assert torch.equal(oracles.qlinear(x, 0.02, 100, w7, ws, b),
                       oracles.onednn_qlinear(x, 0.02, 100, w7, ws, b))  # fmt: skip
    got = oracles.qlinear(x, 0.02, 100, full, ws, b)
    if "avx512_vnni" in cpu.detected():
        assert torch.equal(got, oracles.onednn_qlinear(x, 0.02, 100, full, ws, b))
    else:
        assert torch.equal(got, _float64_qlinear(x, 100, full, ws, b))


def test_the_oracles_per_weight_state_follows_writes_to_the_weight() -> None:
    """What the oneDNN adapters keep per weight (its range verdict, its packed form) is dropped
    when the weight is written in place, and two weights in turn each keep their own: a call's
    result never depends on the calls before it."""
    from refcore import oracles

    rng = np.random.default_rng(8)
    x = _t(rng.integers(0, 256, (24, 64)).astype(np.uint8))
    ws, b = _t(rng.uniform(0.001, 0.02, 16).astype(np.float32)), _t(np.zeros(16, np.float32))
    w = _t(rng.integers(-64, 65, (16, 64)).astype(np.int8))
    other = _t(rng.integers(-64, 65, (16, 64)).astype(np.int8))
    for weight in (w, other, w):
        want = torch.from_numpy(int8.qlinear(x.numpy(), 0.02, 100, weight.numpy(), ws.numpy(),
                                             b.numpy()))  # fmt: skip
        torch.testing.assert_close(oracles.qlinear(x, 0.02, 100, weight, ws, b), want,
                                   rtol=1e-5, atol=1e-4)  # fmt: skip
    w.copy_(torch.where(w > 0, 127, -128).to(torch.int8))  # now full range, same tensor
    want = torch.from_numpy(int8.qlinear(x.numpy(), 0.02, 100, w.numpy(), ws.numpy(), b.numpy()))
    torch.testing.assert_close(oracles.qlinear(x, 0.02, 100, w, ws, b), want, rtol=1e-5, atol=1e-4)
    assert not oracles.sums_pairs_in_int16(w)
