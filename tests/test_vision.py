"""roi_align (specs/vision.yaml) beyond the generated suites: against a line-by-line port of
torchvision's CPU kernel (the spec's oracle is ONNX's RoiAlign reference), torchvision's list of
per-image boxes, and the torch custom op."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import refcore
from refcore.ops.vision import boxes_of
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, draw_sample
from refcore.testing import assert_close

F32 = np.float32


def _torchvision_roi_align(x: np.ndarray, rois: np.ndarray, oh: int, ow: int, scale: float,
                           ratio: int, aligned: bool) -> np.ndarray:  # fmt: skip
    """torchvision/csrc/ops/cpu/roi_align_kernel.cpp (roi_align_forward_kernel_impl and
    pre_calc_for_bilinear_interpolate) for float32, one sample at a time, in float32."""
    n_rois, (_, c, h, w) = rois.shape[0], x.shape
    out = np.zeros((n_rois, c, oh, ow), F32)
    for n in range(n_rois):
        r = rois[n].astype(F32)
        batch, offset = int(r[0]), F32(0.5 if aligned else 0.0)
        start_w, start_h = F32(r[1] * F32(scale) - offset), F32(r[2] * F32(scale) - offset)
        end_w, end_h = F32(r[3] * F32(scale) - offset), F32(r[4] * F32(scale) - offset)
        roi_w, roi_h = F32(end_w - start_w), F32(end_h - start_h)
        if not aligned:
            roi_w, roi_h = max(roi_w, F32(1.0)), max(roi_h, F32(1.0))
        bin_h, bin_w = F32(roi_h / F32(oh)), F32(roi_w / F32(ow))
        grid_h = ratio if ratio > 0 else math.ceil(F32(roi_h / F32(oh)))
        grid_w = ratio if ratio > 0 else math.ceil(F32(roi_w / F32(ow)))
        count = F32(max(grid_h * grid_w, 1))
        for ph in range(oh):
            for pw in range(ow):
                acc = np.zeros(c, F32)
                for iy in range(grid_h):
                    y = F32(F32(start_h + F32(F32(ph) * bin_h))
                            + F32(F32(F32(iy + 0.5) * bin_h) / F32(grid_h)))  # fmt: skip
                    for ix in range(grid_w):
                        xx = F32(F32(start_w + F32(F32(pw) * bin_w))
                                 + F32(F32(F32(ix + 0.5) * bin_w) / F32(grid_w)))  # fmt: skip
                        acc += _bilinear(x[batch], h, w, y, xx)
                out[n, :, ph, pw] = acc / count
    return out


def _bilinear(img: np.ndarray, h: int, w: int, y: np.float32, x: np.float32) -> np.ndarray:
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return np.zeros(img.shape[0], F32)
    y, x = max(y, F32(0)), max(x, F32(0))
    y_low, x_low = int(y), int(x)
    if y_low >= h - 1:
        y_high = y_low = h - 1
        y = F32(y_low)
    else:
        y_high = y_low + 1
    if x_low >= w - 1:
        x_high = x_low = w - 1
        x = F32(x_low)
    else:
        x_high = x_low + 1
    ly, lx = F32(y - F32(y_low)), F32(x - F32(x_low))
    hy, hx = F32(1) - ly, F32(1) - lx
    return (hy * hx * img[:, y_low, x_low] + hy * lx * img[:, y_low, x_high]
            + ly * hx * img[:, y_high, x_low] + ly * lx * img[:, y_high, x_high])  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_roi_align_matches_torchvisions_kernel(seed: int) -> None:
    spec = default_registry().op("roi_align")
    s = draw_sample(spec, "float32", RandomDraw(seed), tier="small")
    a = s.args
    oh, ow = (a["output_size"],) * 2 if isinstance(a["output_size"], int) else a["output_size"]
    geometry = (oh, ow, a["spatial_scale"], a["sampling_ratio"], a["aligned"])
    want = _torchvision_roi_align(np.asarray(a["input"]), np.asarray(a["boxes"]), *geometry)
    got = refcore.run("roi_align", provider="reference", **a)
    assert_close(got, want, spec.tolerance_for("float32"), f"torchvision's, case {s.case}")


def test_boxes_of_is_torchvisions_roi_format() -> None:
    """torchvision takes a list of per-image (L, 4) boxes too: the same call on (K, 5) rows."""
    per_image = [torch.tensor([[0.0, 1.0, 3.0, 4.0]]), torch.zeros(0, 4),
                 torch.tensor([[1.0, 1.0, 2.0, 2.0], [0.5, 0.5, 5.0, 5.0]])]  # fmt: skip
    rois = boxes_of(per_image)
    assert rois.tolist() == [[0, 0, 1, 3, 4], [2, 1, 1, 2, 2], [2, 0.5, 0.5, 5, 5]]
    x = torch.randn(3, 4, 6, 6)
    got = refcore.run("roi_align", x, rois, [2, 2], provider="reference")
    one = refcore.run("roi_align", x[2:], torch.tensor([[0.0, 1.0, 1.0, 2.0, 2.0]]), [2, 2],
                      provider="reference")  # fmt: skip
    torch.testing.assert_close(got[1:2], one)
    assert boxes_of(torch.ones(2, 5)).shape == (2, 5)  # (K, 5) rows pass through
    with pytest.raises(ValueError, match="roi_align: argument 'boxes' expected"):
        boxes_of([torch.ones(2, 5)])


def test_roi_align_as_a_torch_custom_op() -> None:
    from refcore import library

    library.register()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    rois = torch.tensor([[0.0, 1.0, 1.0, 6.0, 5.0], [1.0, 0.0, 2.0, 3.0, 7.5]])
    got = torch.ops.refcore.roi_align(x, rois, [3, 2], 0.5, 2, True)
    want = refcore.run("roi_align", x, rois, [3, 2], 0.5, 2, True, provider="reference")
    torch.testing.assert_close(got, want)
    compiled = torch.compile(lambda a, b: torch.ops.refcore.roi_align(a, b, [3, 2], 0.5, 2, True))
    torch.testing.assert_close(compiled(x, rois), want)


class FrozenBatchNorm2d(torch.nn.Module):
    """torchvision.ops.misc.FrozenBatchNorm2d (its forward as torchvision writes it; torchvision
    does not import beside this CPU torch): statistics and affine are buffers."""

    def __init__(self, num_features: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.rand(num_features) + 0.5)
        self.register_buffer("bias", torch.randn(num_features))
        self.register_buffer("running_mean", torch.randn(num_features))
        self.register_buffer("running_var", torch.rand(num_features) + 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.reshape(1, -1, 1, 1)
        b = self.bias.reshape(1, -1, 1, 1)
        rv = self.running_var.reshape(1, -1, 1, 1)
        rm = self.running_mean.reshape(1, -1, 1, 1)
        scale = w * (rv + self.eps).rsqrt()
        bias = b - rm * scale
        return x * scale + bias


class ToyDetector(torch.nn.Module):
    """A detection-style toy: a conv backbone with FrozenBatchNorm2d, roi_align over boxes, a
    box head; the second FrozenBatchNorm2d follows a ReLU, not a conv, so it stays unfolded."""

    def __init__(self) -> None:
        super().__init__()
        from refcore import library

        library.register()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = FrozenBatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = FrozenBatchNorm2d(32)
        self.bn3 = FrozenBatchNorm2d(32)
        self.head = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, images: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.bn1(self.conv1(images)))
        f = self.bn3(torch.relu(self.bn2(self.conv2(f))))
        pooled = torch.ops.refcore.roi_align(f, rois, [4, 4], 0.5, 2, True)
        return self.head(pooled.flatten(1))


@pytest.mark.parametrize("provider", ["auto", "native"])  # numba has no roi_align kernel
def test_frozen_batch_norm_detector_under_optimize_agrees_with_eager(provider: str) -> None:
    if provider != "auto" and not refcore.providers()[provider].available:
        pytest.skip(f"{provider}: {refcore.providers()[provider].reason}")
    torch.manual_seed(0)
    model = ToyDetector().eval()
    images = torch.randn(2, 3, 32, 32)
    rois = torch.tensor(
        [[0, 1.0, 2.0, 12.0, 14.0], [1, 4.0, 0.0, 30.0, 9.5], [1, 0.0, 0.0, 31.0, 31.0]]
    )
    with torch.no_grad():
        want = model(images, rois)
        fast = refcore.optimize(model, provider=provider, example_inputs=(images, rois))
        got = fast(images, rois)
    notes = "\n".join(fast.notes)
    assert "fold_affine: 2 per-channel scale/shift(s) folded into conv2d" in notes, notes
    assert "channel_affine: fused 1 chain(s) into channel_affine" in notes, notes
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _Affine(torch.nn.Module):
    def __init__(self, scale: torch.Tensor, shift: torch.Tensor, pool: bool) -> None:
        super().__init__()
        self.pool = pool
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool:
            x = torch.nn.functional.max_pool2d(x, 2)
        return self.shift + self.scale * x if self.pool else x * self.scale + self.shift


@settings(max_examples=min(20, settings.default.max_examples), deadline=None)
@given(
    c=st.integers(1, 6), pool=st.booleans(),
    scale_shape=st.sampled_from(["1c11", "c11", "1111", "1chw"]),
    shift_shape=st.sampled_from(["1c11", "c11"]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_unfolded_channel_affine_fuses(
    c: int, pool: bool, scale_shape: str, shift_shape: str, seed: int
) -> None:
    """A per-channel affine of constants with no conv to fold into (an unfolded
    FrozenBatchNorm2d) fuses into channel_affine, in either operand order; scalar and per-pixel
    scales are left as they are."""
    from refcore import pipeline

    g = torch.Generator().manual_seed(seed)
    hw = 3 if pool else 6
    shapes = {"1c11": (1, c, 1, 1), "c11": (c, 1, 1), "1111": (1, 1, 1, 1),
              "1chw": (1, c, hw, hw)}  # fmt: skip
    model = _Affine(torch.randn(shapes[scale_shape], generator=g),
                    torch.randn(shapes[shift_shape], generator=g), pool).eval()  # fmt: skip
    x = torch.randn(2, c, 6, 6, generator=g)
    with torch.no_grad():
        want = model(x)
        gm = torch.fx.symbolic_trace(model)
        from torch.fx.passes.shape_prop import ShapeProp

        ShapeProp(gm).propagate(x)
        passes = ["functionalize", "fold_constants", "fold_affine", "fuse"]
        results = pipeline.run(gm, "fx", "reference", passes)
        got = gm(x)
    fused = next(r for r in results if r.name == "fuse").changed
    per_channel = scale_shape in ("1c11", "c11") or (scale_shape == "1111" and c == 1)
    ops = [n.target.op for n in gm.graph.nodes if type(n.target).__name__ == "FusedOp"]
    assert fused == ops.count("channel_affine") == int(per_channel), (scale_shape, c, gm.code)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fold_channel_affine_math_matches_the_unfolded_conv() -> None:
    from refcore.passes.fold_bn import fold_channel_affine

    torch.manual_seed(1)
    x = torch.randn(2, 4, 9, 9, dtype=torch.float64)
    w, b = torch.randn(6, 4, 3, 3, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    s, t = torch.randn(1, 6, 1, 1, dtype=torch.float64), torch.randn(6, 1, 1, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, w, b) * s + t
    for bias in (b, None):
        want = torch.nn.functional.conv2d(x, w, bias) * s + t
        nw, nb = fold_channel_affine(w, bias, s, t)
        torch.testing.assert_close(torch.nn.functional.conv2d(x, nw, nb), want)


class _ConvAffine(torch.nn.Module):
    def __init__(self, conv: torch.nn.Conv2d, scale: torch.Tensor, shift: torch.Tensor) -> None:
        super().__init__()
        self.conv = conv
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * self.scale + self.shift


@settings(max_examples=min(20, settings.default.max_examples), deadline=None)
@given(
    cin=st.integers(1, 4), cout=st.integers(1, 6), bias=st.booleans(),
    scale_shape=st.sampled_from(["1c11", "c11", "1111", "1chw"]),
    shift_shape=st.sampled_from(["1c11", "c11"]), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_fold_affine_folds_exactly_the_per_channel_affines(
    cin: int, cout: int, bias: bool, scale_shape: str, shift_shape: str, seed: int
) -> None:
    """A conv2d's output times a constant and plus a constant: folded when both have one value
    per output channel, left as it is otherwise (a scalar or per-pixel scale); same values."""
    from refcore import pipeline

    g = torch.Generator().manual_seed(seed)
    shapes = {"1c11": (1, cout, 1, 1), "c11": (cout, 1, 1), "1111": (1, 1, 1, 1),
              "1chw": (1, cout, 6, 6)}  # fmt: skip
    conv = torch.nn.Conv2d(cin, cout, 3, padding=1, bias=bias)
    model = _ConvAffine(conv, torch.randn(shapes[scale_shape], generator=g),
                        torch.randn(shapes[shift_shape], generator=g)).eval()  # fmt: skip
    x = torch.randn(2, cin, 6, 6, generator=g)
    with torch.no_grad():
        want = model(x)
        gm = torch.fx.symbolic_trace(model)
        passes = ["functionalize", "fold_constants", "fold_affine"]
        results = pipeline.run(gm, "fx", "reference", passes)
        got = gm(x)
    folded = next(r for r in results if r.name == "fold_affine").changed
    per_channel = scale_shape in ("1c11", "c11") or (scale_shape == "1111" and cout == 1)
    assert folded == int(per_channel), (scale_shape, cout, gm.code)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
