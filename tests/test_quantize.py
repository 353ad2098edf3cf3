"""refcore.quantize: the woq_int8 scheme's weight rule against torch's own per-channel quantizer,
and the quantized model's structure, routing, arguments and results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from conftest import count_example
from hypothesis import given
from hypothesis import strategies as st

import refcore
from refcore.ops.int8 import minmax_qparams, x86_int8_weight
from refcore.ops.quant import QMAX, QMAX4, pack_int4, unpack_int4, woq_int4_weight, woq_int8_weight
from refcore.registry import default_registry
from refcore.testing import assert_close


@given(rows=st.integers(1, 40), cols=st.integers(1, 300), exp=st.integers(-30, 30),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_woq_int8_weight_matches_torch_quantize_per_channel(rows, cols, exp, seed) -> None:
    """Symmetric per-channel int8 with round half to even: torch.quantize_per_channel (qint8,
    zero point 0) on the same fp32 scales gives the same integers; each value is within half a
    scale of the weight, and each nonzero row reaches +-127."""
    count_example()
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 2.0**exp).astype(np.float32)
    w[rng.random(rows) < 0.1] = 0.0  # all-zero rows: scale 1, q 0
    q, s = woq_int8_weight(w)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (rows,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's quantized tensors are deprecated
        tq = torch.quantize_per_channel(
            torch.from_numpy(w),
            torch.from_numpy(s).double(),
            torch.zeros(rows, dtype=torch.long),
            0,
            torch.qint8,
        )
    np.testing.assert_array_equal(q, tq.int_repr().numpy())
    err = np.abs(q.astype(np.float64) * s[:, None] - w)
    # half a scale, plus the float32 reciprocal's and product's roundings (2^-24 each, on a
    # quotient of at most 127.5)
    assert (err <= s[:, None].astype(np.float64) * (0.5 + 127.5 * 2.0**-23)).all()
    nonzero = np.abs(w).max(axis=1) > 0
    assert (np.abs(q).max(axis=1)[nonzero] == QMAX).all()
    assert (s[~nonzero] == 1.0).all()


@given(rows=st.integers(1, 12), groups=st.integers(1, 6), size=st.integers(1, 70),
       seed=st.integers(0, 2**31))  # fmt: skip
def test_woq_int8_groups_are_channels_of_the_regrouped_weight(rows, groups, size, seed) -> None:
    """A scale per group of ``size`` values along K is the per-channel rule on the weight viewed
    as (rows * groups, size)."""
    count_example()
    w = np.random.default_rng(seed).standard_normal((rows, groups * size)).astype(np.float32)
    q, s = woq_int8_weight(w, group_size=size)
    q1, s1 = woq_int8_weight(w.reshape(rows * groups, size))
    assert s.shape == (rows, groups)
    np.testing.assert_array_equal(q, q1.reshape(rows, groups * size))
    np.testing.assert_array_equal(s, s1.reshape(rows, groups))


def test_woq_int8_weight_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="woq_int8: argument 'weight' expected finite values"):
        woq_int8_weight(np.float32([[1.0, np.inf]]))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 32, bias=False)
    ).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_mlp_computes_woq_linear(dtype) -> None:
    """Each nn.Linear becomes a WoqLinear whose output is woq_linear's reference on the layer's
    own int8 weight and scales, within the spec's tolerance, on every provider's route; the
    caller's model is unchanged."""
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = refcore.quantize(model).to(dtype)
    assert [type(c).__name__ for c in q] == ["WoqLinear", "GELU", "WoqLinear"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert q.refcore_notes == ["woq_int8: 2 nn.Linear layer(s) quantized (int8 weight, fp32 "
                               "scale per channel; op woq_linear)"]  # fmt: skip
    spec = refcore.spec("woq_linear")
    tol = spec.tolerance_for(str(dtype).removeprefix("torch."))
    for m in (1, 5, 40):  # the decode kernel's M, and the torch composition's
        x = torch.randn(m, 96, dtype=dtype)
        with torch.no_grad():
            h = q[0](x)
            want = refcore.run("woq_linear", x, q[0].weight, q[0].scales, q[0].bias,
                               provider="reference")  # fmt: skip
            assert_close(h, want, tol)
            y = q(x)
        assert y.dtype == dtype and y.shape == (m, 32)
        # int8 per-channel weights: the float model's function to within ~1% here
        ref = model(x.float())
        assert ((y.float() - ref).norm() / ref.norm()).item() < 0.02


def test_quantized_layers_route_like_torch_calls() -> None:
    """A decode-sized call runs a kernel where one accepts it (here: the reference provider, by
    name); explain shows woq_linear's route for each layer."""
    q = refcore.quantize(_mlp(), provider="reference")
    rep = refcore.explain(q, torch.randn(2, 96))
    rows = [(n, o) for f, n, o in rep.rows() if f == "woq_linear"]
    assert sum(n for n, _ in rows) == 2, str(rep)
    assert all(o.startswith("reference/") for _, o in rows), str(rep)


def test_quantize_arguments() -> None:
    with pytest.raises(TypeError, match="quantize: expected a torch.nn.Module, got int"):
        refcore.quantize(3)
    with pytest.raises(
        ValueError, match=r"scheme='int3'; expected one of \('woq_int8', .*'x86_static_int8', .*\)"
    ):
        refcore.quantize(_mlp(), scheme="int3")
    with pytest.raises(ValueError, match=r"quantize: skip names no module of the model: \['9'\]"):
        refcore.quantize(_mlp(), skip=["9"])
    q = refcore.quantize(_mlp(), skip=["2"])
    assert [type(c).__name__ for c in q] == ["WoqLinear", "GELU", "Linear"]
    assert q.refcore_notes[1] == "woq_int8: kept in float (skip): 2"
    with pytest.raises(ValueError, match="quantize: group_size=0; expected a positive int"):
        refcore.quantize(_mlp(), group_size=0)
    with pytest.raises(ValueError, match="woq_int8: argument 'group_size' expected a divisor"):
        woq_int8_weight(np.ones((2, 6), np.float32), group_size=4)


def test_group_size_where_it_divides_in_features() -> None:
    q = refcore.quantize(_mlp(), group_size=48)  # divides 96, not 160
    assert q[0].scales.shape == (160, 2) and q[2].scales.shape == (32,)
    assert q.refcore_notes == [
        "woq_int8: 2 nn.Linear layer(s) quantized (int8 weight, fp32 scale per group of 48; "
        "op woq_linear)",
        "woq_int8: 1 layer(s) with in_features not a multiple of 48: a scale per channel",
    ]
    x = torch.randn(3, 96)
    with torch.no_grad():
        want = refcore.run("woq_linear", x, q[0].weight, q[0].scales, q[0].bias,
                           provider="reference")  # fmt: skip
        assert_close(q[0](x), want, refcore.spec("woq_linear").tolerance_for("float32"))


@given(rows=st.integers(1, 20), groups=st.integers(1, 6), half=st.integers(1, 40),
       exp=st.integers(-20, 20), seed=st.integers(0, 2**31 - 1))  # fmt: skip
def test_woq_int4_weight_codes_and_error_bound(rows, groups, half, exp, seed) -> None:
    """The woq_int4 rule: codes in 0..15 packed low nibble first (`unpack_int4` inverts
    `pack_int4`), each group's min its smallest value, every weight within half a step of its
    dequantized value (q * scale + min, float64), and a group's extremes hit exactly."""
    count_example()
    rng = np.random.default_rng(seed)
    size = 2 * half
    w = (rng.standard_normal((rows, groups * size)) * 2.0**exp).astype(np.float32)
    packed, scales, mins = woq_int4_weight(w, size)
    assert packed.dtype == np.uint8 and packed.shape == (rows, groups * half)
    assert scales.dtype == mins.dtype == np.float32 and scales.shape == (rows, groups)
    q = unpack_int4(packed)
    np.testing.assert_array_equal(pack_int4(q), packed)
    assert q.max() <= QMAX4
    g = w.astype(np.float64).reshape(rows, groups, size)
    np.testing.assert_array_equal(mins, g.min(axis=2).astype(np.float32))
    deq = q.reshape(rows, groups, size) * scales[..., None].astype(np.float64) + mins[..., None]
    step = scales[..., None].astype(np.float64)
    assert (np.abs(deq - g) <= 0.5 * step * (1 + 1e-6) + np.abs(g) * 2e-7).all()
    lo = np.argmin(g, axis=2)
    assert (np.take_along_axis(q.reshape(rows, groups, size), lo[..., None], 2) == 0).all()


def test_woq_int4_weight_keeps_q4_1_blocks() -> None:
    """Weights that are already GGUF Q4_1 values (q * d + m per block of 32, codes 0 and 15
    used) come back as the same codes, scales and mins: no requantization error."""
    rng = np.random.default_rng(3)
    d = rng.uniform(0.001, 0.05, (7, 4)).astype(np.float16).astype(np.float32)
    m = -rng.uniform(0.0, 0.4, (7, 4)).astype(np.float16).astype(np.float32)
    q = rng.integers(0, 16, (7, 4, 32))
    q[..., 0], q[..., 1] = 0, 15
    w = (q * d[..., None].astype(np.float64) + m[..., None]).astype(np.float32).reshape(7, 128)
    packed, scales, mins = woq_int4_weight(w, 32)
    np.testing.assert_array_equal(unpack_int4(packed), q.reshape(7, 128))
    np.testing.assert_array_equal(mins, m)
    np.testing.assert_allclose(scales, d, rtol=2e-7)


def test_woq_int4_weight_arguments() -> None:
    with pytest.raises(ValueError, match="woq_int4: argument 'group_size' expected an even"):
        woq_int4_weight(np.zeros((2, 12), np.float32), 3)
    with pytest.raises(ValueError, match="woq_int4: argument 'weight' expected finite values"):
        woq_int4_weight(np.float32([[1.0, np.nan]]), 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantized_mlp_computes_woq_int4_linear(dtype) -> None:
    """woq_int4: each nn.Linear becomes a WoqLinear computing woq_int4_linear's reference on its
    own codes, scales and mins (group 32 where it divides in_features, else one group per
    channel), close to the float model's function."""
    model = _mlp()
    q = refcore.quantize(model, scheme="woq_int4").to(dtype)
    assert q.refcore_notes == ["woq_int4: 2 nn.Linear layer(s) quantized (4-bit weight, fp32 "
                               "scale and min per group of 32; op woq_int4_linear)"]  # fmt: skip
    layer = q[0]
    assert layer.weight.dtype == torch.uint8 and layer.weight.shape == (160, 48)
    assert layer.scales.dtype == layer.mins.dtype == torch.float32  # kept through .to(dtype)
    assert layer.scales.shape == layer.mins.shape == (160, 3)
    spec = refcore.spec("woq_int4_linear")
    tol = spec.tolerance_for(str(dtype).removeprefix("torch."))
    for m in (1, 5, 40):
        x = torch.randn(m, 96, dtype=dtype)
        with torch.no_grad():
            want = refcore.run("woq_int4_linear", x, layer.weight, layer.scales, layer.mins,
                               layer.bias, provider="reference")  # fmt: skip
            assert_close(layer(x), want, tol)
            y = q(x)
        assert y.dtype == dtype and y.shape == (m, 32)
        ref = model(x.float())  # 4 bits per weight, groups of 32: within ~10% here
        assert ((y.float() - ref).norm() / ref.norm()).item() < 0.12
    odd = refcore.quantize(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)),
                           scheme="woq_int4")  # fmt: skip
    assert odd.refcore_notes == [
        "woq_int4: 1 nn.Linear layer(s) quantized (4-bit weight, fp32 scale and min per group "
        "of 32; op woq_int4_linear)",
        "woq_int4: 1 layer(s) with in_features not a multiple of 32: one group per channel",
        "woq_int4: kept in float (odd in_features): 0",
    ]
    assert odd[1].scales.shape == (2, 1)


def _calibration(n: int = 8, rows: int = 4) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 96, generator=g) * 1.5,) for _ in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_int8_mlp_computes_quantize_then_qlinear(dtype) -> None:
    """x86_static_int8: each nn.Linear becomes a QLinear whose input scale and zero point are
    the min-max observer's for the range calibration gave that layer's input, and whose output
    is quantize_per_tensor then qlinear's references on its own int8 weight and scales."""
    model = _mlp()
    calib = _calibration()
    q = refcore.quantize(model, "x86_static_int8", calibration=calib).to(dtype)
    assert [type(c).__name__ for c in q] == ["QLinear", "GELU", "QLinear"]
    assert q.refcore_notes[0].startswith("x86_static_int8: 2 nn.Linear quantized")
    assert "minmax observer over 8 calibration input(s)" in q.refcore_notes[0]
    # the first layer's input range is the calibration inputs' own
    x_all = torch.cat([c[0] for c in calib])
    want = minmax_qparams(float(x_all.min()), float(x_all.max()), 0, 255, False)
    assert (q[0].input_scale, q[0].input_zero_point) == want
    assert q[0].weight.dtype == torch.int8 and q[0].weight_scales.dtype == torch.float32
    tol = refcore.spec("qlinear").tolerance_for("float32")
    x = torch.randn(5, 96).to(dtype)
    with torch.no_grad():
        l0 = q[0]
        xq = refcore.run("quantize_per_tensor", x, l0.input_scale, l0.input_zero_point, 0, 255,
                         "uint8", provider="reference")  # fmt: skip
        want = refcore.run("qlinear", xq, l0.input_scale, l0.input_zero_point, l0.weight,
                           l0.weight_scales, l0.bias, provider="reference")  # fmt: skip
        got = l0(x)
        assert got.dtype == dtype
        assert_close(got.float(), want.to(dtype).float(), tol)
        y = q(x)
    ref = model(x.float())
    assert y.shape == (5, 32) and ((y.float() - ref).norm() / ref.norm()).item() < 0.05


@pytest.mark.parametrize("observer", ["histogram", "moving_average"])
def test_static_int8_observer_choice(observer: str) -> None:
    """``observer=`` replaces the scheme's min-max rule: each layer's input scale and zero point
    are that observer's over the values calibration gave that layer (the first layer's: the
    calibration inputs themselves, in order)."""
    from refcore.ops.observers import OBSERVERS

    calib = _calibration()
    q = refcore.quantize(_mlp(), "x86_static_int8", calibration=calib, observer=observer)
    assert f"{observer} observer over 8 calibration input(s)" in q.refcore_notes[0]
    obs, state = OBSERVERS[observer], None
    for (x,) in calib:
        state = obs.observe(state, x.numpy())
    want = obs.qparams(state, 0, 255, False, 2.0**-12)
    assert (q[0].input_scale, q[0].input_zero_point) == want
    mm = refcore.quantize(_mlp(), "x86_static_int8", calibration=calib)
    assert (mm[0].input_scale, mm[0].input_zero_point) != want  # it is not min-max's


def test_static_int8_arguments_and_unreached_layers() -> None:
    with pytest.raises(ValueError, match="quantizes activations: give calibration="):
        refcore.quantize(_mlp(), "x86_static_int8")
    with pytest.raises(ValueError, match="calibration is for static schemes"):
        refcore.quantize(_mlp(), "woq_int8", calibration=_calibration())
    with pytest.raises(ValueError, match="expected None"):
        refcore.quantize(_mlp(), "x86_static_int8", calibration=_calibration(), group_size=32)
    with pytest.raises(ValueError, match="calibration gave no inputs"):
        refcore.quantize(_mlp(), "x86_static_int8", calibration=[])
    with pytest.raises(TypeError, match="calibration inputs expected tuples"):
        refcore.quantize(_mlp(), "x86_static_int8", calibration=[torch.randn(2, 96)])
    with pytest.raises(ValueError, match="observer='l1'; expected one of"):
        refcore.quantize(_mlp(), "x86_static_int8", calibration=_calibration(), observer="l1")
    with pytest.raises(ValueError, match="observer is for static schemes"):
        refcore.quantize(_mlp(), "dynamic_int8", observer="histogram")
    q = refcore.quantize(_Branches(), "x86_static_int8", calibration=[(torch.randn(3, 8),)],
                         skip=["skipped"])  # fmt: skip
    assert type(q.used).__name__ == "QLinear"
    assert type(q.unused) is torch.nn.Linear and type(q.skipped) is torch.nn.Linear
    assert q.refcore_notes[1:] == [
        "x86_static_int8: kept in float (no calibration input reached): unused",
        "x86_static_int8: kept in float (skip): skipped",
    ]
    with pytest.raises(ValueError, match=r"only names no module of the model: \['nope'\]"):
        refcore.quantize(_mlp(), only=["nope"])
    nested = torch.nn.Sequential(_mlp(), _mlp())  # "0.0", "0.2", "1.0", "1.2"
    q = refcore.quantize(nested, "woq_int8", only=["1"], skip=["1.2"])
    assert [type(m).__name__ for m in (q[0][0], q[0][2], q[1][0], q[1][2])] == [
        "Linear", "Linear", "WoqLinear", "Linear"]  # fmt: skip
    assert q.refcore_notes[1:] == ["woq_int8: kept in float (not in only): 0.0, 0.2",
                                   "woq_int8: kept in float (skip): 1.2"]  # fmt: skip


class _Branches(torch.nn.Module):
    """Three layers, one of which the forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused, self.skipped = (torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skipped(self.used(x))


# real sentences besides the demo's four: paraphrase pairs, and one sentence with no partner
MORE_SENTENCES = (
    "A man is playing a guitar.",
    "Someone plays an instrument on stage.",
    "The weather is cold and rainy today.",
    "It is freezing and wet outside.",
    "He drove his car to the city.",
    "Programming in Python is fun.",
)


@pytest.mark.parametrize("scheme", ["x86_static_int8", "x86_static_int8_w7", "dynamic_int8"])
def test_int8_minilm_keeps_its_embeddings(scheme: str) -> None:
    """all-MiniLM-L6-v2 (real weights) under x86_static_int8 and its 7-bit-weight form
    (calibrated on three small batches of real sentences) and dynamic_int8: mean cosine to
    the fp32 embeddings >= 0.99, every sentence's nearest neighbour unchanged, and no two
    pairs whose fp32 similarities are 0.05 apart swap order."""
    from refcore.demo import SENTENCES, embed
    from refcore.models import zoo
    from refcore.models.minilm import MiniLM

    tok = MiniLM.load().tokenizer

    def batch(sentences) -> dict[str, torch.Tensor]:
        enc = tok.encode_batch(list(sentences))
        n = max(len(e.ids) for e in enc)
        pad = [n - len(e.ids) for e in enc]
        return {"input_ids": torch.tensor([e.ids + [0] * p for e, p in zip(enc, pad)]),
                "attention_mask": torch.tensor([e.attention_mask + [0] * p
                                                for e, p in zip(enc, pad)])}  # fmt: skip

    eager = zoo.minilm()
    calib = [batch(MORE_SENTENCES[:3]), batch(MORE_SENTENCES[3:]), batch(SENTENCES[:2])]
    static = scheme.startswith("x86_static_int8")
    q = refcore.quantize(eager, scheme, calibration=calib if static else None)
    assert q.refcore_notes[0].startswith(f"{scheme}: 37 nn.Linear")
    everything = batch(SENTENCES + MORE_SENTENCES)
    ref, got = embed(eager, everything), embed(q, everything)
    cos = (ref * got).sum(1)
    assert cos.mean() >= 0.99 and cos.min() >= 0.98, cos
    sim_ref, sim_got = ref @ ref.T, got @ got.T
    n = len(ref)
    paired = list(range(n - 1))  # the last sentence has no paraphrase among the others
    eye = 2 * torch.eye(n)
    assert torch.equal((sim_ref - eye).argmax(1)[paired], (sim_got - eye).argmax(1)[paired])
    iu = torch.triu_indices(n, n, 1)
    a, b = sim_ref[iu[0], iu[1]], sim_got[iu[0], iu[1]]
    apart = (a[:, None] - a[None, :]) > 0.05
    assert not (apart & (b[:, None] <= b[None, :])).any()


class _DigitsNet(torch.nn.Module):
    """A small CNN for 8 x 8 digits: conv + BN + ReLU, a residual block, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))  # fmt: skip
        self.down = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU())
        self.head = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(h + self.block(h))
        return self.head(self.down(h).flatten(1))


@pytest.mark.model_scale
def test_static_int8_digits_cnn_keeps_its_accuracy() -> None:
    """A CNN trained here on scikit-learn's bundled handwritten digits (real data, shipped in the
    package), quantized by x86_static_int8 calibrated on 128 training images, loses at most 0.5
    points of held-out top-1 accuracy."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    train, test = order[:1300], order[1300:]
    torch.manual_seed(0)
    model = _DigitsNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(12):
        for idx in train[torch.randperm(len(train), generator=g)].split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    model.eval()

    def accuracy(m: torch.nn.Module) -> float:
        with torch.no_grad():
            return (m(x[test]).argmax(1) == y[test]).float().mean().item() * 100

    base = accuracy(model)
    assert base > 90, f"the float model should learn digits ({base:.1f}%)"
    calib = [(x[idx],) for idx in train[:128].split(32)]
    for scheme in ("x86_static_int8", "x86_static_int8_w7"):
        q = refcore.quantize(model, scheme, calibration=calib)
        assert q.refcore_notes[0].startswith(f"{scheme}: 4 nn.Conv2d, 1 nn.Linear quantized")
        assert type(q.stem[0]).__name__ == "QConv2d"
        assert base - accuracy(q) <= 0.5, (scheme, base, accuracy(q))
        # optimize folds the three batch-norms into the int8 convs' weight scales and bias
        # (fold_batch_norm_int8), and keeps the accuracy
        fast = refcore.optimize(q)
        assert base - accuracy(fast) <= 0.5, (scheme, base, accuracy(fast), fast.notes)
        assert "fold_bn: 3 batch-norm(s) folded into conv/linear" in fast.notes, fast.notes
        torch._dynamo.reset()


class _Block(torch.nn.Module):
    """conv-BN-ReLU twice, then conv-BN + the input and a ReLU (a ResNet basic block)."""

    def __init__(self) -> None:
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.c = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c(self.b(self.a(x))) + x)


def test_optimize_fuses_a_quantized_blocks_epilogues() -> None:
    """optimize(quantize(block)): the three batch-norms fold into the int8 convs, and each
    conv's tail fuses into the int8 op this CPU has a kernel for (refcore.pipeline.implemented:
    the requantizing form where the next conv's quantize is the ReLU's only user, the
    residual add + ReLU at the end); the result is the eager quantized block's, up to a code
    of the last conv's input moved by the folding's rounding."""
    from refcore.pipeline import implemented

    torch.manual_seed(0)
    block = _Block().eval()
    for m in block.modules():  # batch-norms that do something
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(-1.5, 1.5)
    x = torch.rand(2, 8, 10, 10).contiguous(memory_format=torch.channels_last)
    q = refcore.quantize(block, "x86_static_int8", calibration=[(x,)])
    fast = refcore.optimize(q)
    with torch.no_grad():
        want, got = q(x), fast(x)
    notes = "\n".join(fast.notes)
    assert "fold_bn: 3 batch-norm(s) folded into conv/linear" in notes, notes
    have = implemented("auto")
    if "qconv2d_relu_quantize" in have:
        assert "qconv2d_relu_quantize: fused 2 chain(s)" in notes, notes
    elif "qconv2d_relu" in have:
        assert "qconv2d_relu: fused 2 chain(s)" in notes, notes
    else:
        assert "qconv2d_relu: left unfused (no provider" in notes, notes
    if "qconv2d_add_relu" in have:
        assert "qconv2d_add_relu: fused 1 chain(s)" in notes, notes
    # folding moves each float output by a rounding, which may move a code of the next conv's
    # input by one step: at most a couple of those per output of the last (1x1) conv
    code = q.c[0].input_scale * 128 * float(q.c[0].weight_scales.abs().max())
    assert (got - want).abs().max().item() <= 2 * code + 1e-5, ((got - want).abs().max(), code)
    assert (got - block(x)).abs().max().item() < 0.05  # and int8 is close to the float block
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_int8_mlp_computes_dynamic_qlinear(dtype) -> None:
    """dynamic_int8 needs no calibration: each layer keeps the x86 int8 weight and computes
    dynamic_qlinear (the input quantized per token on each call); its bias stays float32."""
    model = _mlp()
    q = refcore.quantize(model, "dynamic_int8").to(dtype)
    assert q.refcore_notes == ["dynamic_int8: 2 nn.Linear layer(s) quantized (int8 weight, fp32 "
                               "scale per channel; op dynamic_qlinear)"]  # fmt: skip
    layer = q[0]
    assert layer.weight.dtype == torch.int8 and layer.bias.dtype == torch.float32
    want_w, want_s = x86_int8_weight(model[0].weight.detach().numpy())
    np.testing.assert_array_equal(layer.weight.numpy(), want_w)
    np.testing.assert_array_equal(layer.weight_scales.numpy(), want_s)
    x = torch.randn(7, 96).to(dtype)
    with torch.no_grad():
        got = layer(x)
        want = refcore.run("dynamic_qlinear", x, layer.weight, layer.weight_scales, layer.bias,
                           provider="reference")  # fmt: skip
        assert_close(got, want, refcore.spec("dynamic_qlinear").tolerance_for(str(dtype)[6:]))
        y = q(x)
    ref = model(x.float())
    assert y.dtype == dtype and ((y.float() - ref).norm() / ref.norm()).item() < 0.05


def test_static_layers_capture_as_one_graph_of_custom_ops() -> None:
    """Under dynamo (refcore.optimize, torch.compile) a static layer is two opaque
    torch.ops.refcore nodes, not a trace into refcore's routing: the whole model captures as
    one graph and computes what the eager layers do."""
    q = refcore.quantize(_mlp(), "x86_static_int8", calibration=_calibration())
    seen = []

    def backend(gm, example_inputs):
        seen.append(sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"}))
        return gm

    compiled = torch.compile(q, fullgraph=True, backend=backend)
    x = torch.randn(5, 96)
    with torch.no_grad():
        got, want = compiled(x), q(x)
    assert len(seen) == 1 and "refcore.qlinear.default" in seen[0], seen
    assert "refcore.quantize_per_tensor.default" in seen[0], seen
    assert_close(got, want, refcore.spec("qlinear").tolerance_for("float32"))
    torch._dynamo.reset()


@pytest.mark.parametrize("scheme", ["woq_int8", "woq_int4", "dynamic_int8"])
def test_weight_quantized_layers_capture_as_custom_ops(scheme: str) -> None:
    """Likewise a WoqLinear: one torch.ops.refcore node of its scheme's op per layer."""
    q = refcore.quantize(_mlp(), scheme)
    op = default_registry().quant_schemes[scheme].op
    seen = []

    def backend(gm, example_inputs):
        seen.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return gm

    compiled = torch.compile(q, fullgraph=True, backend=backend)
    x = torch.randn(3, 96)
    with torch.no_grad():
        got, want = compiled(x), q(x)
    assert len(seen) == 1 and seen[0].count(f"refcore.{op}.default") == 2, seen
    assert_close(got, want, refcore.spec(op).tolerance_for("float32"))
    torch._dynamo.reset()


def test_optimize_runs_a_quantized_models_ops_with_its_provider() -> None:
    """optimize(q, provider=P) runs the layers' torch.ops.refcore nodes with P's kernels (the
    library's provider while the optimized model runs)."""
    from refcore import library

    q = refcore.quantize(_mlp(), "x86_static_int8", calibration=_calibration())
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(library._provider.get())
            return x

    q.append(Spy())  # in the captured model: dynamo graph-breaks around its Python side effect
    fast = refcore.optimize(q, provider="reference", capture="dynamo")
    with torch.no_grad():
        fast(torch.randn(4, 96))
    assert seen and set(seen) == {"reference"}, seen
    torch._dynamo.reset()


def test_torchao_pt2e_int8_graph_runs_refcores_int8_ops() -> None:
    """A model quantized by torch's own int8 flow (torch.export, torchao's prepare_pt2e /
    convert_pt2e with X86InductorQuantizer) through refcore.optimize: each linear's q/dq chain
    becomes refcore's quantize_per_tensor + qlinear (the declared pt2e_qlinear pattern), and
    the result is the pt2e graph's own (its float dequantize path) within qlinear's tolerance."""
    import torchao.quantization.pt2e.quantize_pt2e as pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    model = _mlp()
    x = torch.randn(4, 96)
    graph = torch.export.export(model, (x,)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = pt2e.prepare_pt2e(graph, quantizer)
    for c in _calibration(rows=4):
        prepared(*c)
    converted = pt2e.convert_pt2e(prepared)
    fast = refcore.optimize(converted)
    assert "int8: pt2e int8 q/dq chains -> 2 qlinear" in fast.notes, fast.notes
    targets = {str(n.target) for n in fast.inner.graph.nodes}
    assert {"refcore.qlinear.default", "refcore.quantize_per_tensor.default"} <= targets
    assert not any("dequantize" in t for t in targets), targets
    with torch.no_grad():
        got, want = fast(x), converted(x)
    assert_close(got, want, refcore.spec("qlinear").tolerance_for("float32"))


def test_torchao_pt2e_int8_conv_graph_runs_qconv2d() -> None:
    """Likewise a CNN's convs: pt2e_qconv2d, with the conv's stride, padding and groups."""
    import torchao.quantization.pt2e.quantize_pt2e as pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    torch.manual_seed(0)
    conv = torch.nn.Conv2d
    model = torch.nn.Sequential(conv(3, 8, 3, padding=1), torch.nn.ReLU(),
                                conv(8, 8, 3, stride=2, padding=1, groups=2)).eval()  # fmt: skip
    x = torch.randn(2, 3, 10, 10)
    graph = torch.export.export(model, (x,)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = pt2e.prepare_pt2e(graph, quantizer)
    prepared(x)
    converted = pt2e.convert_pt2e(prepared)
    fast = refcore.optimize(converted)
    assert "int8: pt2e int8 q/dq chains -> 2 qconv2d" in fast.notes, fast.notes
    with torch.no_grad():
        got, want = fast(x), converted(x)
    assert_close(got, want, refcore.spec("qconv2d").tolerance_for("float32"))
