"""The onednn provider's conv kernels where the generic suite cannot reach: a weight packed for
one conv and called for another, NaN through the fused ReLU, the prepack pass and `optimize`.

Every test skips where the provider is not installed or torch has no oneDNN; dtypes come from the
kernels' declarations (bf16 only where torch's oneDNN has a bf16 path), never from the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import refcore
from refcore.call import bind
from refcore.ops.layouts import onednn_conv_key
from refcore.packed import PackedWeight, pack, unpack
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.tensors import BFLOAT16 as BF16
from refcore.testing import assert_close

REG = default_registry()
PROV = installed().get("onednn")
pytestmark = pytest.mark.skipif(
    PROV is None or not PROV.availability().available,
    reason=f"onednn provider: {PROV.availability().reason if PROV else 'not installed'}",
)


def _kernel(op: str):
    return next(k for k in PROV.kernels if k.op == op)


def _run(op: str, **args):
    """The onednn kernel on ``args`` (its verdict must be yes) and the reference's result."""
    kernel = _kernel(op)
    call = bind(REG.op(op), (), args)
    verdict = kernel.supports(call)
    assert verdict, verdict.reason
    plain = {k: unpack(v) for k, v in args.items()}
    return kernel(call), resolve(REG.op(op).reference)(**plain)


def _cl(*shape: int, seed: int = 0) -> np.ndarray:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return (x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x).numpy()


def test_a_weight_packed_for_one_conv_runs_any_other() -> None:
    """The blocked form depends on the conv (input size, stride, ...), the result must not: a
    call the pack did not foresee gets its own blocked form, once, kept beside the others."""
    w = _cl(16, 8, 3, 3, seed=1) * 0.1
    pw = pack("conv2d_relu", w, "onednn_conv", input_size=(4, 8, 20, 20), padding=1)
    first = onednn_conv_key(w.shape, (4, 8, 20, 20), 1, 1, 1, 1)
    assert set(pw.held) == {first}  # the pack reordered for the conv it was told
    for shape, stride in [((4, 8, 20, 20), 1), ((1, 8, 9, 13), 1), ((2, 8, 20, 20), 2)]:
        got, want = _run("conv2d_relu", input=_cl(*shape), weight=pw, stride=stride, padding=1)
        assert_close(got, want, REG.op("conv2d_relu").tolerance_for("float32"), str(shape))
    assert len([k for k in pw.held if isinstance(k, tuple)]) == 3  # one per conv met
    for n in range(2, 8):  # more convs than HELD: the oldest forms go, results stay right
        got, want = _run("conv2d", input=_cl(n, 8, 6, 6), weight=pw, padding=1)
        assert_close(got, want, REG.op("conv2d").tolerance_for("float32"))
    from refcore_onednn.conv import HELD

    assert len([k for k in pw.held if isinstance(k, tuple)]) == HELD


def test_pack_params_and_unpack() -> None:
    w = _cl(6, 4, 1, 1)
    pw = pack("conv2d", w, "onednn_conv", input_size=(2, 4, 5, 5), stride=2, groups=1)
    assert isinstance(pw, PackedWeight) and pw.shape == w.shape
    assert dict(pw.params) == {"input_size": (2, 4, 5, 5), "stride": 2, "groups": 1}
    assert unpack(pw).tobytes() == np.ascontiguousarray(w).tobytes()
    with pytest.raises(ValueError, match="takes params"):
        pack("conv2d", w, "onednn_conv", kernel_size=3)
    assert pack("conv2d", w, "onednn_conv").held == {}  # no input size: the kernel reorders


def test_nan_and_huge_values_match_the_reference() -> None:
    """oneDNN's ReLU post-op maps NaN to 0 and fp32 sums of huge products may overflow in
    another order: such calls are redone by the reference (relu keeps NaN, as torch's)."""
    x = _cl(1, 4, 5, 5)
    x[0, 1, 2, 2] = np.nan
    x[0, 2, 0, 0] = 3e38
    w = _cl(3, 4, 3, 3, seed=2)
    for weight in (w, pack("conv2d_relu", w, "onednn_conv")):
        got, want = _run("conv2d_relu", input=x, weight=weight, padding=1)
        assert np.isnan(want).any()
        assert_close(got, want, REG.op("conv2d_relu").tolerance_for("float32"))


def test_declines_say_why() -> None:
    k = _kernel("conv2d")
    even = dict(input=_cl(1, 2, 6, 6), weight=_cl(3, 2, 2, 2), padding="same")
    verdict = k.supports(bind(REG.op("conv2d"), (), even))
    assert not verdict and "one padding per dim" in verdict.reason
    k = _kernel("conv2d_add_relu")
    bcast = dict(input=_cl(1, 2, 6, 6), weight=_cl(3, 2, 1, 1), bias=None, other=_cl(3, 1, 1))
    verdict = k.supports(bind(REG.op("conv2d_add_relu"), (), bcast))
    assert not verdict and "does not broadcast" in verdict.reason


@pytest.mark.skipif(
    PROV is None or "bfloat16" not in _kernel("conv2d").dtypes,
    reason="the onednn kernels declare no bf16 here (torch's oneDNN has no bf16 path)",
)
def test_bf16_declines_where_torchs_onednn_is_wrong() -> None:
    """torch 2.13's oneDNN bf16 conv reads outside its buffers for one output column at a W
    stride > 1 (found on an Intel Xeon with AMX: wrong values, a crash), crashes where an output
    row or column reads padding only, and its unfused add+relu fallback has no bf16 kernel:
    such calls are declined, naming why."""
    one_col = dict(input=_cl(2, 16, 20, 2).astype(BF16), weight=_cl(16, 16, 3, 3).astype(BF16),
                   stride=(1, 2), padding=1)  # fmt: skip
    verdict = _kernel("conv2d").supports(bind(REG.op("conv2d"), (), one_col))
    assert not verdict and "one output column" in verdict.reason
    two_cols = {**one_col, "input": _cl(2, 16, 20, 3).astype(BF16)}
    assert _kernel("conv2d").supports(bind(REG.op("conv2d"), (), two_cols))
    # a column of taps on padding only (width 1 padded to 3, taps 2 apart): F.conv2d crashed
    # (the generic suite's packed-weight case, CI stop 30 on AMX capped to avx512)
    pad_only = dict(input=_cl(2, 8, 2, 1).astype(BF16), weight=_cl(8, 2, 3, 1).astype(BF16),
                    stride=(1, 2), padding=(2, 1), dilation=(2, 2), groups=4)  # fmt: skip
    verdict = _kernel("conv2d").supports(bind(REG.op("conv2d"), (), pad_only))
    assert not verdict and "every tap is padding" in verdict.reason
    rows = {**pad_only, "input": _cl(1, 8, 1, 8).astype(BF16),
            "weight": _cl(8, 2, 2, 2).astype(BF16), "padding": (1, 2)}  # fmt: skip
    verdict = _kernel("conv2d").supports(bind(REG.op("conv2d"), (), rows))
    assert not verdict and "every tap is padding" in verdict.reason, "rows as columns"
    inside = {**pad_only, "padding": (2, 0), "stride": (1, 1)}  # every column reads the input
    assert _kernel("conv2d").supports(bind(REG.op("conv2d"), (), inside))
    x = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(BF16)  # NCHW
    w = np.random.default_rng(1).standard_normal((4, 2, 1, 1)).astype(BF16)
    other = np.zeros((1, 4, 5, 5), BF16)
    grouped = dict(input=x, weight=w, bias=None, other=other, groups=2)
    verdict = _kernel("conv2d_add_relu").supports(bind(REG.op("conv2d_add_relu"), (), grouped))
    assert not verdict and "add_relu, has no bf16 kernel" in verdict.reason
    fused = dict(input=_cl(1, 4, 5, 5).astype(BF16), weight=_cl(4, 4, 1, 1).astype(BF16),
                 bias=None, other=other)  # fmt: skip
    _run("conv2d_add_relu", **fused)


def test_add_relu_reads_other_without_writing_it() -> None:
    x, w, other = _cl(2, 8, 7, 7), _cl(16, 8, 3, 3), _cl(2, 16, 7, 7, seed=3)
    before = other.copy()
    got, want = _run("conv2d_add_relu", input=x, weight=w, bias=None, other=other, padding=1)
    assert_close(got, want, REG.op("conv2d_add_relu").tolerance_for("float32"))
    assert other.tobytes() == before.tobytes()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.c = nn.Conv2d(8, 8, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.a(x))
        y = F.relu(self.b(y) + y)
        return self.c(y)


def test_optimize_with_the_onednn_provider_packs_and_runs_its_kernels() -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        want = model(x)
        opt = refcore.optimize(model, provider="onednn")
        got = opt(x)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert "prepack: 3 conv2d weight(s) packed once" in opt.notes, opt.notes
        ran = str(refcore.explain(opt, x))
        for op in ("conv2d_relu", "conv2d_add_relu", "conv2d"):
            assert f"onednn/{op}_onednn" in ran, ran
        x2 = torch.randn(3, 3, 9, 9)
        torch.testing.assert_close(opt(x2), model(x2), atol=1e-4, rtol=1e-4)
        model.b.weight.mul_(-1.0)  # the parameter changed: the pass packs it again
        opt2 = refcore.optimize(model, provider="onednn")
        torch.testing.assert_close(opt2(x), model(x), atol=1e-4, rtol=1e-4)


def test_prepack_supplies_the_conv_and_the_input_size_when_shapes_are_known() -> None:
    """With shapes recorded (ShapeProp, as optimize does with example inputs), the pack reorders
    for the graph's conv at optimise time; without them the kernel does on its first call."""
    from torch.fx.passes.shape_prop import ShapeProp

    from refcore.passes.functional import functionalize
    from refcore.passes.fuse import fuse
    from refcore.passes.prepack import PrepackedOp, prepack

    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 3, 12, 12)
    for shapes in (True, False):
        gm = functionalize(torch.fx.symbolic_trace(model))
        if shapes:
            ShapeProp(gm).propagate(x)
        fuse(gm, "onednn", {f.op for f in REG.fusions.values() if f.op}, [])
        prepack(gm, "onednn", [])
        targets = [n.target for n in gm.graph.nodes if isinstance(n.target, PrepackedOp)]
        assert [t.layout for t in targets] == ["onednn_conv"] * 3
        first = targets[0].packed
        key = onednn_conv_key(first.shape, tuple(x.shape), 1, 1, 1, 1)
        assert (key in first.held) == shapes, (first.params, list(first.held))
        with torch.no_grad(), refcore.enabled("onednn"):
            torch.testing.assert_close(gm(x), model(x), atol=1e-4, rtol=1e-4)
        assert key in first.held  # made on the first call when the pack could not
