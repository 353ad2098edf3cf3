"""Native conv2d (and fused conv2d_relu / conv2d_add_relu): what the generic suites cannot reach.

The kernel suite (tests/test_kernels.py) checks every variant against the reference on the
spec's samples. Here: the AMX variant in a fresh process (no torch, so no oneDNN has asked for
tile permission: only refcore.cpu's request makes it legal), C writes confined to the output at
every level and in every path of the AMX kernel (1x1 read in place, flat padded, im2col) and of
the AVX2 kernel (fp32 in place or padded, bf16 widened, panel groups), one thread against two,
the reasons a kernel declines, and bad input rejected before C.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import refcore_native
from refcore_native import _build, conv

import refcore
from refcore import cpu
from refcore.call import bind
from refcore.ops.conv import conv2d as reference
from refcore.registry import default_registry
from refcore.tensors import BFLOAT16, round_to
from refcore.testing import assert_close

LEVELS = [
    ("portable", "f32"),
    ("portable", "bf16"),
    ("avx2", "f32"),
    ("avx2", "bf16"),
    ("avx512", "f32"),
    ("amx", "bf16"),
]
# (n, c, o, h, w, k, stride, pad): each AMX path with sizes that fill no tile, block or vector
GEOMETRIES = [
    (2, 64, 40, 5, 7, 1, 1, 0),  # 1x1 read in place, a partial last 32-row block
    (2, 33, 17, 6, 9, 3, 1, 1),  # flat padded copy, channels padded to 64
    (1, 40, 70, 9, 11, 3, 2, 1),  # im2col, three panels
    (2, 3, 20, 13, 12, 7, 2, 3),  # a stem
    (1, 64, 33, 3, 3, 3, 1, 0),  # flat without padding
    (1, 512, 40, 3, 4, 3, 1, 1),  # avx2: one 16-column panel per group (K x 64 B > 192 KB)
]
GEO_IDS = [f"{n}x{c}x{h}x{w}-o{o}-k{k}s{s}p{p}" for n, c, o, h, w, k, s, p in GEOMETRIES]


def _library() -> _build.Library:
    try:
        return _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")


def _inputs(geo: tuple, dt: np.dtype, seed: int = 0) -> tuple:
    n, c, o, h, w, k, s, p = geo
    rng = np.random.default_rng(seed)
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    x = round_to(rng.normal(size=(n, h, w, c)), dt)  # NHWC memory
    wt = round_to(rng.normal(size=(o, k, k, c)) / np.sqrt(c * k * k), dt)  # OHWI memory
    b = round_to(rng.normal(size=o), dt)
    res = round_to(rng.normal(size=(n, ho, wo, o)), dt)
    return x, wt, b, res, (ho, wo)


def _run_c(lib, level: str, tag: str, geo: tuple, x, wt, b, res, y, act: int, nt: int) -> int:
    n, c, o, h, w, k, s, p = geo
    fn = getattr(lib.lib, f"rc_conv2d_{tag}_{level}")
    ptr = lib.ffi.from_buffer
    ho, wo = y.shape[1:3]
    return fn(ptr(x), ptr(wt), ptr(b), ptr(res), ptr(y), n, h, w, c, o, k, k, s, s, p, p, ho, wo,
              act, nt)  # fmt: skip


def _want(x, wt, b, res, geo):
    """relu(conv2d + b + res) in NHWC, from the reference (NCHW views of the same arrays)."""
    s, p = geo[6], geo[7]
    y = reference(x.transpose(0, 3, 1, 2), wt.transpose(0, 3, 1, 2), b, s, p).astype(np.float64)
    return np.maximum(y + res.transpose(0, 3, 1, 2).astype(np.float64), 0).transpose(0, 2, 3, 1)


@pytest.mark.parametrize("geo", GEOMETRIES, ids=GEO_IDS)
@pytest.mark.parametrize(("level", "tag"), LEVELS, ids=[f"{a}-{b}" for a, b in LEVELS])
def test_c_writes_only_inside_its_output(level: str, tag: str, geo: tuple) -> None:
    if not cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    lib = _library()
    dt = np.dtype(np.float32) if tag == "f32" else BFLOAT16
    x, wt, b, res, (ho, wo) = _inputs(geo, dt)
    guard, size = 64, geo[0] * ho * wo * geo[2]
    buf = np.empty(size + 2 * guard, dt)
    buf.view(np.uint8)[:] = 0xA5
    before = buf.copy()
    y = buf[guard:-guard].reshape(geo[0], ho, wo, geo[2])
    assert _run_c(lib, level, tag, geo, x, wt, b, res, y, act=1, nt=2) == 0
    assert (buf[:guard].view(np.uint8) == before[:guard].view(np.uint8)).all()
    assert (buf[-guard:].view(np.uint8) == before[-guard:].view(np.uint8)).all()
    tol = (
        default_registry()
        .op("conv2d_add_relu")
        .tolerance_for("float32" if tag == "f32" else "bfloat16")
    )
    assert_close(y, _want(x, wt, b, res, geo), tol, f"{level} {tag} {geo}")


@pytest.mark.parametrize("geo", GEOMETRIES, ids=GEO_IDS)
@pytest.mark.parametrize(("level", "tag"), LEVELS, ids=[f"{a}-{b}" for a, b in LEVELS])
def test_one_thread_and_two_agree_exactly(level: str, tag: str, geo: tuple) -> None:
    """Each output element is summed in the same order whichever thread computes it."""
    if not cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    lib = _library()
    dt = np.dtype(np.float32) if tag == "f32" else BFLOAT16
    x, wt, b, res, (ho, wo) = _inputs(geo, dt, seed=1)
    ys = [np.empty((geo[0], ho, wo, geo[2]), dt) for _ in range(2)]
    for y, nt in zip(ys, (1, 2)):
        assert _run_c(lib, level, tag, geo, x, wt, b, res, y, act=0, nt=nt) == 0
    assert ys[0].tobytes() == ys[1].tobytes()


def test_amx_kernel_in_a_fresh_process_without_torch() -> None:
    if not cpu.has("amx"):
        pytest.skip("CPU (or REFCORE_CPU_CAPABILITY) does not allow amx")
    _library()
    code = """
        import sys, numpy as np, refcore
        import contextlib, refcore_native
        from refcore.provider import using_providers
        # only native: discovering every provider would load onednn's, which imports torch
        scope = contextlib.ExitStack()  # kept: a dropped scope would end at once
        scope.enter_context(using_providers(refcore_native.make_provider()))
        from refcore.ops.conv import conv2d as ref
        from refcore.tensors import round_to
        assert "torch" not in sys.modules
        rng = np.random.default_rng(0)
        for c, k, s, p in [(64, 1, 1, 0), (32, 3, 1, 1), (16, 3, 2, 1)]:
            x = round_to(rng.normal(size=(2, 9, 9, c)), "bfloat16").transpose(0, 3, 1, 2)
            w = round_to(rng.normal(size=(24, c, k, k)) / (c * k * k) ** 0.5, "bfloat16")
            got = refcore.run("conv2d", x, w, None, s, p, provider="native")
            want = ref(x, w, None, s, p).astype(np.float64)
            err = np.abs(got.astype(np.float64) - want)
            assert (err <= 3e-2 + 1.6e-2 * np.abs(want)).all(), err.max()
        assert "torch" not in sys.modules
        print(refcore.explain("conv2d", x, w, None, s, p))
    """
    env = {k: v for k, v in os.environ.items() if k != cpu.ENV_CAP}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "conv2d_amx" in res.stdout


def _kernels(op: str) -> list:
    return [k for k in refcore_native.make_provider().kernels if k.op == op]


def _nhwc(shape: tuple[int, ...], dt=np.float32) -> np.ndarray:
    n, c, h, w = shape
    return np.ones((n, h, w, c), dt).transpose(0, 3, 1, 2)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ({"input": np.ones((1, 4, 5, 5), np.float32)}, "input not channels_last"),
        ({"groups": 2, "weight": np.ones((4, 2, 3, 3), np.float32)}, "groups=2"),
        ({"dilation": 2}, "dilation=(2, 2)"),
    ],
    ids=["nchw-input", "groups", "dilation"],
)
def test_declines_with_a_reason(args: dict, reason: str) -> None:
    call_args = {"input": _nhwc((1, 4, 5, 5)), "weight": np.ones((4, 4, 3, 3), np.float32)}
    call = bind(default_registry().op("conv2d"), (), {**call_args, **args})
    for k in _kernels("conv2d"):
        verdict = k.supports(call)
        if "dtype" in verdict.reason:
            continue
        assert not verdict and reason in verdict.reason, (k.name, verdict)


def test_avx2_fp32_declines_the_channel_counts_torch_runs_faster() -> None:
    lo, hi = conv.AVX2_F32_SLOW_C
    kernels = {k.name: k for k in _kernels("conv2d")}
    if "conv2d_avx2" not in kernels:
        pytest.skip("this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level avx2")
    cases = [(lo, np.float32, False), (hi - 1, np.float32, False), (hi, np.float32, True),
             (lo - 1, np.float32, True), (lo, BFLOAT16, True)]  # fmt: skip
    for c, dt, ok in cases:
        args = {"input": _nhwc((1, c, 5, 5), dt), "weight": np.ones((4, c, 3, 3), dt)}
        verdict = kernels["conv2d_avx2"].supports(bind(default_registry().op("conv2d"), (), args))
        assert bool(verdict) == ok, (c, dt, verdict)
        assert ok or "oneDNN measured faster" in verdict.reason


def test_add_relu_declines_a_broadcast_residual() -> None:
    args = {"input": _nhwc((1, 4, 5, 5)), "weight": np.ones((3, 4, 1, 1), np.float32),
            "bias": None, "other": np.ones((3, 1, 1), np.float32)}  # fmt: skip
    call = bind(default_registry().op("conv2d_add_relu"), (), args)
    for k in _kernels("conv2d_add_relu"):
        if "float32" in k.dtypes:
            verdict = k.supports(call)
            assert not verdict and "other" in verdict.reason, (k.name, verdict)


def _direct_fn():
    k = next(k for k in _kernels("conv2d") if "float32" in k.dtypes)
    _library()
    return k.fn


def test_direct_call_rejects_bad_input_before_c() -> None:
    fn = _direct_fn()
    x, w = _nhwc((1, 4, 5, 5)), np.ones((3, 4, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"conv2d \(native\): argument 'input' expected a 4-D "):
        fn(input=np.ones((1, 4, 5, 5), np.float32), weight=w)
    with pytest.raises(ValueError, match="argument 'weight' expected shape"):
        fn(input=x, weight=np.ones((3, 2, 3, 3), np.float32))
    with pytest.raises(TypeError, match="argument 'bias' expected dtype float32"):
        fn(input=x, weight=w, bias=np.ones(3, np.float64))
    with pytest.raises(ValueError, match="argument 'groups' expected groups=1"):
        fn(input=x, weight=w, groups=2)
    with pytest.raises(ValueError, match="every size < 2\\*\\*31"):
        fn(input=x, weight=w, stride=2**31)


def test_output_is_channels_last_torch() -> None:
    torch = pytest.importorskip("torch")
    _library()
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=torch.channels_last)
    w = torch.randn(5, 8, 3, 3)
    got = refcore.run("conv2d", x, w, None, 1, 1, provider="native")
    assert got.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(got, torch.nn.functional.conv2d(x, w, None, 1, 1), atol=1e-4,
                               rtol=1e-4)  # fmt: skip
