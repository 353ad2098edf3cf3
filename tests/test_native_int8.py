"""Native int8 kernels (csrc/int8_avx2.c): what the generic suite's small samples do not reach.

qlinear's two paths (M <= 16 reads the weight in place, larger M packs it into panels) on sizes
that leave every tail (rows mod 4, columns mod 16, K odd and mod 16), extreme codes up to the
largest K the spec allows (int32 sums exact: a saturating scheme fails these), one and two
threads; quantize / dequantize over several parallel chunks with every tail length and special
values. Each C call writes into the middle of a guard zone that must stay untouched; inputs are
exact-size NumPy arrays, so the sanitized run (``python -m refcore sanitize``) catches over-reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import refcore_native
from refcore_native import _build

from refcore import cpu
from refcore.ops import int8 as ref
from refcore.tensors import BFLOAT16

GUARD = 64


@pytest.fixture(scope="module")
def lib() -> _build.Library:
    if not cpu.has("avx2"):
        pytest.skip("this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level avx2")
    try:
        return _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")


def _guarded(shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
    n = int(np.prod(shape))
    buf = np.empty(n + 2 * GUARD, dtype)
    buf.view(np.uint8)[:] = 0xA5
    return buf, buf[GUARD : GUARD + n].reshape(shape)


def _untouched(buf: np.ndarray, what: str) -> None:
    b = buf.view(np.uint8)
    g = GUARD * buf.itemsize
    assert (b[:g] == 0xA5).all() and (b[-g:] == 0xA5).all(), f"{what}: wrote outside its output"


def _qlinear(lib, x, zp, w, ws, b, nt: int, xs: float = 0.02) -> np.ndarray:
    m, k = x.shape
    n = w.shape[0]
    buf, y = _guarded((m, n), np.float32)
    scratch = np.empty(lib.lib.rc_qlinear_scratch_f32_avx2(m, n, k, nt), np.uint8)
    p = lib.ffi.from_buffer
    bp = lib.ffi.NULL if b is None else p(b)
    lib.lib.rc_qlinear_f32_avx2(p(x), p(w), p(ws), bp, p(y), p(scratch), m, n, k, xs, zp, nt)
    _untouched(buf, f"qlinear {m}x{k}x{n} nt={nt}")
    return y


SHAPES = [(m, k, n) for m in (1, 3, 16, 17, 18, 19, 21, 40) for k, n in ((1, 1), (17, 5), (33, 31),
          (64, 16), (301, 33))]  # fmt: skip


@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_qlinear_tails_and_threads(lib, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, n).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    for bias in (b, None):
        want = ref.qlinear(x, 0.02, 77, w, ws, bias)
        for nt in (1, 2):
            got = _qlinear(lib, x, 77, w, ws, bias, nt)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5, err_msg=f"nt={nt}")


@pytest.mark.parametrize("m", [1, 5, 17, 23])
@pytest.mark.parametrize("zp", [0, 255])
def test_qlinear_sums_are_exact_with_extreme_codes(lib, m: int, zp: int) -> None:
    """Scales of 1 and no bias: y is float32(acc), exact below 2^24, so every int32 sum is
    compared bit for bit (vpmaddubsw's int16 saturation fails this)."""
    rng = np.random.default_rng(m + zp)
    k, n = 257, 19
    x = rng.choice(np.uint8([0, 255]), (m, k))
    w = rng.choice(np.int8([-128, 127]), (n, k))
    ones = np.ones(n, np.float32)
    want = ref.qlinear(x, 1.0, zp, w, ones)
    for nt in (1, 2):
        np.testing.assert_array_equal(_qlinear(lib, x, zp, w, ones, None, nt, xs=1.0), want)


@pytest.mark.parametrize("m", [1, 17])
def test_qlinear_largest_k_stays_exact(lib, m: int) -> None:
    """K = 65536 (the spec's limit) of (0 - 255) * -128: each sum is 2139095040 < 2^31."""
    k, n = ref.MAX_K, 3
    x = np.zeros((m, k), np.uint8)
    w = np.full((n, k), -128, np.int8)
    w[1] = 127
    got = _qlinear(lib, x, 255, w, np.ones(n, np.float32), None, 2, xs=1.0)
    want = np.float32([255 * 128 * k, -255 * 127 * k, 255 * 128 * k])
    np.testing.assert_array_equal(got, np.broadcast_to(want, (m, n)))


def _quantize(lib, x, scale, zp, qmin, qmax, dtype, nt) -> np.ndarray:
    buf, q = _guarded(x.shape, np.dtype(dtype))
    tag = "bf16" if x.dtype == BFLOAT16 else "f32"
    fn = getattr(lib.lib, f"rc_quantize_per_tensor_{tag}_avx2")
    p = lib.ffi.from_buffer
    inv = float(np.float32(1.0 / scale))
    fn(p(x), p(q), x.size, inv, zp, qmin, qmax, int(dtype == "int8"), nt)
    _untouched(buf, f"quantize {x.size} nt={nt}")
    return q


@pytest.mark.parametrize("dt", [np.dtype(np.float32), BFLOAT16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_quantize_every_tail_and_chunks(lib, dt, dtype: str) -> None:
    rng = np.random.default_rng(0)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    specials = np.float32([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, -0.0, 0.25, -0.75, 1.25])
    for n in [*range(0, 70), 3 * 16384 + 37]:
        x = (rng.normal(size=n) * 3).astype(np.float32)
        x[: min(n, 10)] = specials[: min(n, 10)]
        x = x.astype(dt)
        want = ref.quantize_per_tensor(x, 0.5, (lo + hi) // 2, lo + 3, hi - 2, dtype)
        for nt in (1, 2):
            got = _quantize(lib, x, 0.5, (lo + hi) // 2, lo + 3, hi - 2, dtype, nt)
            np.testing.assert_array_equal(got, want, err_msg=f"n={n} nt={nt}")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_dequantize_every_tail_and_chunks(lib, dtype: str) -> None:
    rng = np.random.default_rng(1)
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    p = lib.ffi.from_buffer
    for n in [*range(0, 40), 3 * 16384 + 5]:
        q = rng.integers(lo, hi + 1, n).astype(dtype)
        want = ref.dequantize_per_tensor(q, 0.037, lo + 9, lo, hi, dtype)
        for nt in (1, 2):
            buf, y = _guarded((n,), np.float32)
            lib.lib.rc_dequantize_per_tensor_f32_avx2(p(q), p(y), n, float(np.float32(0.037)),
                                                      lo + 9, int(dtype == "int8"), nt)  # fmt: skip
            _untouched(buf, f"dequantize {n} nt={nt}")
            np.testing.assert_array_equal(y, want, err_msg=f"n={n} nt={nt}")


def _kernel(op: str):
    return next(k for k in refcore_native.make_provider().kernels if k.op == op).fn


U8, I8, F32 = np.uint8, np.int8, np.float32
BAD = [
    ("qlinear", dict(input=np.zeros((2, 4), F32), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 4), I8), weight_scales=np.ones(3, F32)),
     TypeError, "'input' expected dtype uint8"),
    ("qlinear", dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 5), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'weight' expected shape (N, 4)"),
    ("qlinear", dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 4), I8), weight_scales=np.ones(2, F32)),
     ValueError, "'weight_scales' expected shape (3,)"),
    ("qlinear", dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=256,
                     weight=np.zeros((3, 4), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'zero_point' expected in [quant_min, quant_max] = [0, 255]"),
    ("qlinear", dict(input=np.zeros((2, 8), U8)[:, ::2], input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 4), I8), weight_scales=np.ones(3, F32)),
     ValueError, "C-contiguous"),
    ("quantize_per_tensor", dict(input=np.zeros(4, F32), scale=0.0, zero_point=0, quant_min=0,
                                 quant_max=255, dtype="uint8"),
     ValueError, "'scale' expected a finite float > 0"),
    ("quantize_per_tensor", dict(input=np.zeros(4, np.float64), scale=0.1, zero_point=0,
                                 quant_min=0, quant_max=255, dtype="uint8"),
     TypeError, "'input' expected dtype"),
    ("quantize_per_tensor", dict(input=np.zeros(4, F32), scale=0.1, zero_point=0,
                                 quant_min=-128, quant_max=255, dtype="uint8"),
     ValueError, "'quant_min, quant_max' expected 0 <= quant_min <= quant_max <= 255"),
    ("dequantize_per_tensor", dict(input=np.zeros(4, U8), scale=0.1, zero_point=0, quant_min=-128,
                                   quant_max=127, dtype="int8"),
     TypeError, "'input' expected dtype int8"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "args", "exc", "match"), BAD, ids=[f"{b[0]}-{i}" for i, b in
                                                                  enumerate(BAD)])  # fmt: skip
def test_bad_input_rejected_before_the_c_call(monkeypatch, op, args, exc, match) -> None:
    if not cpu.has("avx2"):
        pytest.skip("no avx2 kernels registered under this cap")
    from refcore_native import _runtime

    def no_c(name: str):
        raise AssertionError(f"C function {name} reached with bad input")

    monkeypatch.setattr(_runtime, "c_function", no_c)
    import re

    with pytest.raises(exc, match=f"^{op} \\(native\\): argument .*" + re.escape(match)):
        _kernel(op)(**args)
