"""Native int8 kernels (csrc/int8_avx2.c, int8_avx512_bf16.c; every C-level test runs at each
level the CPU allows): what the generic suite's small samples do not reach.

The GEMM path's uint8 tiles (vpmaddubsw, taken when every activation code is <= 127, and the
zero point too where it pads a conv input) against the reference bit for bit, on the shapes and
geometries of the int16 tests (each C call reports the path it took and the tests require it),
through dispatch for the fused forms, and the int16 fallback when one code or the padding's
zero point is 128.

qlinear's and dynamic_qlinear's two paths (M <= 16 reads the weight in place, larger M packs it
into panels) on sizes that leave every tail (rows mod 4, columns mod 16, K odd and mod 16),
extreme codes up to the largest K the spec allows (int32 sums exact: a saturating scheme fails
these), one and two threads; dynamic_qlinear's codes bit for bit (half-way values, rows with
inf / NaN, bf16 rounding); qconv2d's geometries (odd runs, groups, dilation, strides, padding,
NCHW and NHWC input, every tail of output pixels and channels) and its largest K; quantize /
dequantize over several parallel chunks with every tail length and special values; the fused
ops' post-ops (qlinear_relu / qlinear_gelu on both qlinear paths, qconv2d_relu /
qconv2d_add_relu on every qconv2d geometry, ``other`` as NHWC and NCHW memory) against the
unfused kernel's output with the activation applied, weight scales of either sign, and the
wrappers' accept / decline rules. Each C call writes into the middle of a guard zone that must
stay untouched; inputs are exact-size NumPy arrays, so the sanitized run (``python -m refcore
sanitize``) catches over-reads.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
import refcore_native
from refcore_native import _build
from refcore_native import int8 as native

import refcore
from refcore import cpu
from refcore.call import bind
from refcore.ops import elementwise as eref
from refcore.ops import fused as fref
from refcore.ops import int8 as ref
from refcore.registry import default_registry
from refcore.tensors import BFLOAT16

GUARD = 64


#: the int8 family's ISA levels (a csrc/int8_<level>.c each), lowest first
LEVELS = native.LEVELS


class Lib(NamedTuple):
    """The native library and the ISA level whose int8 C functions a test calls."""

    ffi: object
    lib: object
    level: str

    def fn(self, name: str):
        """C function ``name`` at this level (``rc_qlinear_f32`` -> ``..._avx512_bf16``)."""
        return getattr(self.lib, f"{name}_{self.level}")

    def path(self, want: int | None) -> int | None:
        """The path a GEMM call must report: AVX2 as asked; VNNI sums are always the uint8
        (vpdpbusd) path, which is exact for any codes."""
        return want if want is None or self.level == "avx2" else 1


@pytest.fixture(scope="module", params=LEVELS)
def lib(request) -> Lib:
    level = request.param
    if not cpu.has(level):
        pytest.skip(f"this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level {level}")
    try:
        built = _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")
    return Lib(built.ffi, built.lib, level)


def _best() -> str:
    """The highest int8 level this CPU (and the cap) allows: the one dispatch chooses."""
    allowed = [lvl for lvl in LEVELS if cpu.has(lvl)]
    if not allowed:
        pytest.skip("no int8 level allowed on this CPU (or REFCORE_CPU_CAPABILITY)")
    return allowed[-1]


def _guarded(shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
    n = int(np.prod(shape))
    buf = np.empty(n + 2 * GUARD, dtype)
    buf.view(np.uint8)[:] = 0xA5
    return buf, buf[GUARD : GUARD + n].reshape(shape)


def _untouched(buf: np.ndarray, what: str) -> None:
    b = buf.view(np.uint8)
    g = GUARD * buf.itemsize
    assert (b[:g] == 0xA5).all() and (b[-g:] == 0xA5).all(), f"{what}: wrote outside its output"


def _qlinear(lib, x, zp, w, ws, b, nt: int, xs: float = 0.02, post: int = 0,
             path: int | None = None) -> np.ndarray:  # fmt: skip
    """The C call into a guarded output; ``path`` (1: the uint8 tiles, 0: int16), when given,
    is the one the call must report."""
    m, k = x.shape
    n = w.shape[0]
    buf, y = _guarded((m, n), np.float32)
    scratch = np.empty(lib.fn("rc_qlinear_scratch_f32")(m, n, k, nt), np.uint8)
    p = lib.ffi.from_buffer
    bp = lib.ffi.NULL if b is None else p(b)
    ran = lib.fn("rc_qlinear_f32")(p(x), p(w), p(ws), bp, p(y), p(scratch), m, n, k, xs, zp,
                                      post, nt)  # fmt: skip
    _untouched(buf, f"qlinear {m}x{k}x{n} nt={nt} post={post}")
    assert path is None or ran == lib.path(path), (
        f"qlinear {m}x{k}x{n} zp={zp}: path {ran}, not {path}"
    )
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


#: M, K, N across the GEMM's blocks: 32-row AMX blocks and their partial last one, row blocks
#: of 64 rows (K = 4096: ~256 KB of x a block), K not a multiple of 64 (AMX reads prepared rows)
SHAPES_GEMM = [(32, 64, 32), (33, 128, 40), (64, 100, 64), (95, 4096, 33), (130, 4096, 17)]


@pytest.mark.parametrize(("m", "k", "n"), SHAPES_GEMM, ids=[f"{m}x{k}x{n}" for m, k, n in
                                                            SHAPES_GEMM])  # fmt: skip
def test_qlinear_gemm_blocks_are_exact(lib, m: int, k: int, n: int) -> None:
    """Extreme codes and weights, scales 1: every int32 sum bit for bit on every block shape."""
    rng = np.random.default_rng(m + k + n)
    x = rng.choice(np.uint8([0, 255, 255, 1]), (m, k))
    w = rng.choice(np.int8([-128, 127, -1]), (n, k))
    ones = np.ones(n, np.float32)
    want = ref.qlinear(x, 1.0, 3, w, ones)
    for nt in (1, 2):
        np.testing.assert_array_equal(_qlinear(lib, x, 3, w, ones, None, nt, xs=1.0), want)


@pytest.mark.parametrize("m", [3, 20, 40])
def test_qlinear_empty_k_gives_the_bias(lib, m: int) -> None:
    """K = 0 (in_features 0, which the spec accepts): every sum is 0, y is the bias on every path
    (the AMX path's K chunks once stored nothing there: found by the generated suite)."""
    w, ws = np.zeros((5, 0), np.int8), np.ones(5, np.float32)
    b = np.arange(5, dtype=np.float32) - 2
    for nt in (1, 2):
        got = _qlinear(lib, np.zeros((m, 0), np.uint8), 3, w, ws, b, nt)
        np.testing.assert_array_equal(got, np.broadcast_to(b, (m, 5)))


def _dynamic(lib, x, w, ws, b, nt: int) -> np.ndarray:
    m, k = x.shape
    n = w.shape[0]
    buf, y = _guarded((m, n), x.dtype)
    scratch = np.empty(lib.fn("rc_qlinear_scratch_f32")(m, n, k, nt), np.uint8)
    p = lib.ffi.from_buffer
    bp = lib.ffi.NULL if b is None else p(b)
    fn = lib.fn("rc_dynamic_qlinear_bf16" if x.dtype == BFLOAT16 else "rc_dynamic_qlinear_f32")
    fn(p(x), p(w), p(ws), bp, p(y), p(scratch), m, n, k, nt)
    _untouched(buf, f"dynamic_qlinear {m}x{k}x{n} nt={nt}")
    return y


DTYPES = [np.dtype(np.float32), BFLOAT16]


@pytest.mark.parametrize("dt", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_dynamic_qlinear_tails_and_threads(lib, dt, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x = rng.normal(size=(m, k)) * rng.uniform(0.1, 10, (m, 1)) + rng.normal(size=(m, 1))
    x = x.astype(np.float32).astype(dt)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, n).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    for bias in (b, None):
        want = ref.dynamic_qlinear(x, w, ws, bias)
        for nt in (1, 2):
            got = _dynamic(lib, x, w, ws, bias, nt)
            if bias is None:  # y = float32(acc) * s, one rounding as the reference: bit for bit
                np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32),
                                              err_msg=f"nt={nt}")  # fmt: skip
            else:
                np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                           rtol=1e-6 if dt != BFLOAT16 else 7.9e-3, atol=1e-5,
                                           err_msg=f"nt={nt}")  # fmt: skip


@pytest.mark.parametrize("dt", DTYPES, ids=["float32", "bfloat16"])
@pytest.mark.parametrize("m", [3, 21])
def test_dynamic_qlinear_codes_bit_for_bit(lib, dt, m: int) -> None:
    """An identity weight with scales 1 outputs each code times the row's scale: every code,
    scale and zero point is compared bit for bit. Rows of range exactly 255 (scale 1) put x *
    inv and lo / scale half way between integers (rint: half to even, not away from zero);
    rows of tiny, huge, one-signed and constant ranges; rows with inf / NaN give NaN."""
    rng = np.random.default_rng(m)
    k = 37
    rows = []
    for i in range(m):
        kind = i % 7
        if kind == 0:  # scale 1, lo = -100.5: zp = rint(100.5) = 100; values at .5
            r = rng.integers(-100, 154, k) + 0.5
            r[:2] = (-100.5, 154.5)
        elif kind == 1:  # scale 1, zp 99 (lo = -99): codes at 2.5, -3.5, ...
            r = rng.choice([-99.0, 156.0, 2.5, -3.5, 0.5, -0.5, 1.5, 154.5], k)
            r[:2] = (-99.0, 156.0)
        elif kind == 2:
            r = rng.normal(size=k) * 1e-7  # below FLT_EPSILON * 255: scale eps
        elif kind == 3:
            r = rng.uniform(1.0, 3e3, k)  # positive: lo 0, zp 0
        elif kind == 4:
            r = -rng.uniform(1e-3, 2.0, k)  # negative: hi 0, zp 255
        elif kind == 5:
            r = rng.normal(size=k) * 1e30
        else:
            r = rng.normal(size=k)
            r[rng.integers(0, k)] = (np.inf, -np.inf, np.nan)[i % 3]
        rows.append(r)
    x = np.array(rows).astype(np.float32).astype(dt)
    eye = np.eye(k, dtype=np.int8)
    ones = np.ones(k, np.float32)
    want = ref.dynamic_qlinear(x, eye, ones)
    assert np.isnan(want[6::7].astype(np.float32)).all()
    for nt in (1, 2):
        got = _dynamic(lib, x, eye, ones, None, nt)  # as float32: NaN == NaN for bf16 too
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32),
                                      err_msg=f"nt={nt}")  # fmt: skip


def _qconv(lib, x, xs, zp, w, ws, b, stride, padding, dilation, groups, nt: int,
           nchw: bool = False, post: int = 0, other=None,
           path: int | None = None) -> np.ndarray:  # fmt: skip
    """The C call on exact-size NHWC (or NCHW) input and OHWI weight, into a guarded output;
    ``other`` (post 2): an exact-size NHWC or NCHW (other_nchw) residual, passed as given;
    ``path`` as _qlinear's."""
    geo = native._conv_geo("qconv2d", x, w, stride, padding, dilation, groups)
    g = np.array((*geo, int(nchw)), np.int64)
    n, o, ho, wo = x.shape[0], w.shape[0], geo[14], geo[15]
    xin = np.ascontiguousarray(x) if nchw else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    wt = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
    buf, y = _guarded((n, ho, wo, o), np.float32)
    p = lib.ffi.from_buffer
    scratch = np.empty(lib.fn("rc_qconv2d_scratch_f32")(p(g), nt), np.uint8)
    bp = lib.ffi.NULL if b is None else p(b)
    res, res_nchw = (lib.ffi.NULL, 0) if other is None else (p(other[0]), other[1])
    ran = lib.fn("rc_qconv2d_f32")(p(xin), p(wt), p(ws), bp, res, p(y), p(scratch), p(g), xs,
                                      zp, post, res_nchw, nt)  # fmt: skip
    _untouched(buf, f"qconv2d {x.shape} {w.shape} nt={nt} post={post}")
    assert path is None or ran == lib.path(path), f"qconv2d {x.shape} {w.shape} zp={zp}: path {ran}"
    return y.transpose(0, 3, 1, 2)


# (N, C, O, H, W, kH, kW, stride, padding, dilation, groups): odd and even runs (kW x C, or C /
# groups), output channels mod 16, output pixels mod 4, asymmetric 'same' padding
CONVS = [
    (1, 3, 5, 7, 8, 3, 3, 1, 1, 1, 1),
    (2, 3, 17, 11, 13, 7, 7, 2, 3, 1, 1),
    (1, 16, 33, 9, 9, 1, 1, 1, 0, 1, 1),
    (2, 20, 16, 6, 7, 1, 1, 2, 0, 1, 1),
    (1, 7, 31, 10, 9, 3, 2, (2, 1), (1, 0), 1, 1),
    (1, 6, 9, 9, 10, 3, 3, 1, "same", (2, 3), 1),
    (2, 5, 18, 8, 8, 2, 4, 1, "same", 1, 1),
    (1, 6, 12, 8, 9, 3, 3, (1, 2), 2, 1, 3),
    (2, 8, 8, 7, 7, 3, 3, 1, 1, 1, 8),
    (1, 40, 40, 5, 6, 3, 3, 2, 1, 2, 2),
    (1, 64, 20, 9, 9, 3, 3, 1, 1, 1, 1),
    (1, 2, 3, 1, 1, 1, 1, 1, 2, 1, 1),
]


@pytest.mark.parametrize("case", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_qconv2d_geometries_tails_and_threads(lib, case) -> None:
    n, c, o, h, w, kh, kw, stride, padding, dilation, groups = case
    rng = np.random.default_rng(len(str(case)))
    x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    wq = rng.integers(-128, 128, (o, c // groups, kh, kw)).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, o).astype(np.float32)
    b = rng.normal(size=o).astype(np.float32)
    attrs = (stride, padding, dilation, groups)
    for bias in (b, None):
        want = ref.qconv2d(x, 0.02, 91, wq, ws, bias, *attrs)
        for nt, nchw in ((1, False), (2, False), (2, True)):
            got = _qconv(lib, x, 0.02, 91, wq, ws, bias, *attrs, nt, nchw)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5,
                                       err_msg=f"nt={nt} nchw={nchw}")  # fmt: skip


@pytest.mark.parametrize("zp", [0, 255])
def test_qconv2d_sums_are_exact_with_extreme_codes(lib, zp: int) -> None:
    """Scales of 1 and no bias: every int32 sum bit for bit (padding where x - zp is 0)."""
    rng = np.random.default_rng(zp)
    x = rng.choice(np.uint8([0, 255]), (2, 37, 6, 7))
    w = rng.choice(np.int8([-128, 127]), (19, 37, 3, 3))
    ones = np.ones(19, np.float32)
    for stride in (1, 2):
        want = ref.qconv2d(x, 1.0, zp, w, ones, None, stride, 1)
        for nt in (1, 2):
            np.testing.assert_array_equal(_qconv(lib, x, 1.0, zp, w, ones, None, stride, 1, 1,
                                                 1, nt), want)  # fmt: skip


def test_qconv2d_largest_k_stays_exact(lib) -> None:
    """C * kH * kW = 65536 (the spec's limit) of (0 - 255) * -128: each sum 2139095040."""
    c, k, o = 1024, 8, 3
    x = np.zeros((1, c, k, k), np.uint8)
    w = np.full((o, c, k, k), -128, np.int8)
    w[1] = 127
    got = _qconv(lib, x, 1.0, 255, w, np.ones(o, np.float32), None, 1, 0, 1, 1, 2)
    want = np.float32([255 * 128, -255 * 127, 255 * 128]) * (c * k * k)
    np.testing.assert_array_equal(got.reshape(o), want)


def test_qconv2d_wrapper_reads_every_layout(lib) -> None:
    """NCHW, channels_last and other strides (copied), OIHW and OHWI weights, strided scales:
    the same values; the output is channels_last (NHWC memory)."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (2, 6, 9, 8)).astype(np.uint8)
    w = rng.integers(-128, 128, (10, 6, 3, 3)).astype(np.int8)
    ws = rng.uniform(0.001, 0.02, 20).astype(np.float32)[::2]
    want = ref.qconv2d(x, 0.03, 5, w, ws, None, 2, 1)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    wcl = np.ascontiguousarray(w.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    fn = _kernel("qconv2d", lib.level)
    for xin in (x, cl, x[:, :, ::-1, :][:, :, ::-1, :], np.asfortranarray(x)):
        for win in (w, wcl):
            got = fn(xin, 0.03, 5, win, ws, stride=2, padding=1)
            assert got.transpose(0, 2, 3, 1).flags.c_contiguous
            np.testing.assert_array_equal(got, want)


POST = native.POST


def _signed_scales(rng, n: int) -> np.ndarray:
    """Scales of either sign (a folded batch-norm with a negative gamma), both signs present."""
    s = rng.uniform(0.001, 0.02, n) * np.where(np.arange(n) % 2, -1.0, 1.0)
    return rng.permutation(s).astype(np.float32)


def _native_gelu(lib, y: np.ndarray, approximate: str) -> np.ndarray:
    """The native fp32 gelu kernel of the level's vector width (csrc/elementwise_avx2.c, or
    elementwise_avx512.c for avx512_bf16: the same vector gelu as the int8 epilogue) on y."""
    out = np.empty_like(y)
    lvl = "avx2" if lib.level == "avx2" else "avx512"
    name = "rc_gelu_tanh_f32" if approximate == "tanh" else "rc_gelu_f32"
    fn = getattr(lib.lib, f"{name}_{lvl}")
    fn(lib.ffi.from_buffer(np.ascontiguousarray(y)), lib.ffi.from_buffer(out), y.size, 1)
    return out


@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_qlinear_post_ops_are_the_unfused_kernel_then_the_activation(lib, m, k, n) -> None:
    """relu and gelu (erf, tanh) in the epilogue of both qlinear paths (M <= 16 and above) give
    the unfused kernel's output with the activation applied: relu bit for bit, gelu as the
    native gelu kernel (the same vector formula) and within gelu's tolerance of the reference
    gelu; with weight scales of either sign."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n + 1)
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    ws = _signed_scales(rng, n)
    b = rng.normal(size=n).astype(np.float32)
    for bias in (b, None):
        for nt in (1, 2):
            plain = _qlinear(lib, x, 77, w, ws, bias, nt)
            relu = _qlinear(lib, x, 77, w, ws, bias, nt, post=POST["relu"])
            np.testing.assert_array_equal(relu, np.maximum(plain, 0), err_msg=f"nt={nt}")
            for post, approx in (("gelu", "none"), ("gelu_tanh", "tanh")):
                got = _qlinear(lib, x, 77, w, ws, bias, nt, post=POST[post])
                msg = f"{post} nt={nt}"
                np.testing.assert_array_equal(got, _native_gelu(lib, plain, approx), err_msg=msg)
                np.testing.assert_allclose(got, eref.gelu(plain, approximate=approx), rtol=1e-5,
                                           atol=1e-6, err_msg=msg)  # fmt: skip
                want = fref.qlinear_gelu(x, 0.02, 77, w, ws, bias, approximate=approx)
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5, err_msg=msg)


def test_qlinear_post_ops_see_negative_outputs(lib) -> None:
    """The post-op tests above are not vacuous: with scales of either sign the unfused outputs
    hold negatives (relu zeroes them, gelu maps them into (-0.17, 0], below 0 down to -5)."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (21, 301)).astype(np.uint8)
    w = rng.integers(-128, 128, (33, 301)).astype(np.int8)
    ws = _signed_scales(rng, 33)
    for m in (3, 21):  # both paths
        plain = _qlinear(lib, x[:m], 77, w, ws, None, 1)
        assert (plain < -1).mean() > 0.2
        relu = _qlinear(lib, x[:m], 77, w, ws, None, 1, post=POST["relu"])
        assert relu.min() == 0 and (relu == 0).sum() == (plain <= 0).sum()
        gelu = _qlinear(lib, x[:m], 77, w, ws, None, 1, post=POST["gelu"])
        assert gelu.min() > -0.17 and (gelu[plain < 0] <= 0).all()
        assert (gelu[(plain < -1) & (plain > -5)] < 0).all()


def _conv_case(case: tuple, seed: int) -> tuple:
    """(rng, x, weight, weight scales of either sign, bias, (stride, padding, dilation,
    groups)) for a CONVS geometry."""
    n, c, o, h, w, kh, kw, stride, padding, dilation, groups = case
    rng = np.random.default_rng(len(str(case)) + seed)
    x = rng.integers(0, 256, (n, c, h, w)).astype(np.uint8)
    wq = rng.integers(-128, 128, (o, c // groups, kh, kw)).astype(np.int8)
    ws = _signed_scales(rng, o)
    b = rng.normal(size=o).astype(np.float32)
    return rng, x, wq, ws, b, (stride, padding, dilation, groups)


@pytest.mark.parametrize("case", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_qconv2d_post_ops_are_the_unfused_kernel_then_the_activation(lib, case) -> None:
    """relu and relu(y + other) in qconv2d's epilogue, on every geometry of the qconv2d test,
    NHWC and NCHW input, other read as NHWC memory (channels_last) and as NCHW (contiguous),
    one and two threads, weight scales of either sign: bit for bit the unfused kernel's output
    with the add and relu applied in fp32 as NumPy does."""
    rng, x, wq, ws, b, attrs = _conv_case(case, 1)
    n, o, stride, padding, dilation = case[0], case[2], *case[7:10]
    _, _, ho, wo = native._conv_out(dict(input=x, weight=wq, stride=stride, padding=padding,
                                         dilation=dilation))  # fmt: skip
    other = rng.normal(size=(n, o, ho, wo)).astype(np.float32)
    both = {0: np.ascontiguousarray(other.transpose(0, 2, 3, 1)), 1: other.copy()}
    for bias in (b, None):
        for nt, nchw in ((1, False), (2, False), (2, True)):
            plain = _qconv(lib, x, 0.02, 91, wq, ws, bias, *attrs, nt, nchw)
            assert plain.shape == other.shape
            msg = f"nt={nt} nchw={nchw}"
            relu = _qconv(lib, x, 0.02, 91, wq, ws, bias, *attrs, nt, nchw, POST["relu"])
            np.testing.assert_array_equal(relu, np.maximum(plain, 0), err_msg=msg)
            for res_nchw, res in both.items():
                got = _qconv(lib, x, 0.02, 91, wq, ws, bias, *attrs, nt, nchw, POST["add_relu"],
                             (res, res_nchw))  # fmt: skip
                np.testing.assert_array_equal(got, np.maximum(plain + other, 0),
                                              err_msg=f"{msg} other_nchw={res_nchw}")  # fmt: skip


def _fused_kernel(name: str):
    kernels = {k.name: k for k in refcore_native.make_provider().kernels}
    if name not in kernels:
        pytest.skip(f"{name} is not registered under this CPU level")
    return kernels[name]


def _qconv_args(rng, other_layout: str) -> dict:
    x = rng.integers(0, 256, (2, 6, 9, 8)).astype(np.uint8)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels_last
    w = rng.integers(-128, 128, (10, 6, 3, 3)).astype(np.int8)
    other = rng.normal(size=(2, 10, 5, 4)).astype(np.float32)  # stride 2, padding 1
    if other_layout == "channels_last":
        other = np.ascontiguousarray(other.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return dict(input=x, input_scale=0.03, input_zero_point=5, weight=w,
                weight_scales=_signed_scales(rng, 10), bias=rng.normal(size=10).astype(F32),
                other=other, stride=2, padding=1)  # fmt: skip


@pytest.mark.parametrize("layout", ["channels_last", "contiguous"])
def test_qconv2d_add_relu_kernel_runs_on_either_residual_layout(layout: str) -> None:
    k = _fused_kernel(f"qconv2d_add_relu_{_best()}")
    rng = np.random.default_rng(11)
    args = _qconv_args(rng, layout)
    call = bind(default_registry().op("qconv2d_add_relu"), (), args)
    assert call.layout("other") == layout
    assert k.supports(call), k.supports(call).reason
    got = k(call)
    assert got.transpose(0, 2, 3, 1).flags.c_contiguous  # channels_last, as qconv2d's
    plain_args = {a: v for a, v in args.items() if a != "other"}
    plain = _kernel("qconv2d", _best())(**plain_args)
    np.testing.assert_array_equal(got, np.maximum(plain + args["other"], 0))
    want = fref.qconv2d_add_relu(**args)
    assert (want == 0).mean() > 0.2 and (want > 0).mean() > 0.2
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    why = str(refcore.explain("qconv2d_add_relu", **args, provider="native"))
    assert f"qconv2d_add_relu_{_best()}" in why and "chosen" in why, why


def test_qconv2d_add_relu_declines_residuals_it_does_not_read() -> None:
    """A broadcast residual (O, 1, 1) and other strides are declined with the reason; the run
    still gives the reference's result."""
    k = _fused_kernel(f"qconv2d_add_relu_{_best()}")
    rng = np.random.default_rng(12)
    args = _qconv_args(rng, "contiguous")
    full = args["other"]
    cases = {
        "no broadcasting": full[0, :, :1, :1].copy(),  # (O, 1, 1)
        "other is strided": full[:, :, ::-1, :],
        "reads a channels_last or contiguous": np.asfortranarray(full),
    }
    op = default_registry().op("qconv2d_add_relu")
    for reason, other in cases.items():
        call = bind(op, (), {**args, "other": other})
        verdict = k.supports(call)
        assert not verdict and reason in verdict.reason, (reason, verdict)
        got = refcore.run("qconv2d_add_relu", **{**args, "other": other})
        np.testing.assert_allclose(got, fref.qconv2d_add_relu(**{**args, "other": other}),
                                   rtol=1e-6, atol=1e-5)  # fmt: skip


def test_fused_kernels_share_the_unfused_rules() -> None:
    """qlinear_relu / qlinear_gelu decline what qlinear declines at their level (the AVX2
    kernels: M > 16 on a VNNI CPU), qconv2d_relu accepts what qconv2d accepts; they are chosen
    by dispatch on this CPU (the highest level it allows)."""
    for lvl in LEVELS:
        rule = _fused_kernel(f"qlinear_{lvl}").rule
        for op in ("qlinear_relu", "qlinear_gelu"):
            assert _fused_kernel(f"{op}_{lvl}").rule is rule
            assert _fused_kernel(f"{op}_{lvl}").layouts == _fused_kernel(f"qlinear_{lvl}").layouts
        conv = _fused_kernel(f"qconv2d_{lvl}")
        assert _fused_kernel(f"qconv2d_relu_{lvl}").rule is conv.rule
        assert _fused_kernel(f"qconv2d_relu_{lvl}").layouts == conv.layouts
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (4, 40)).astype(np.uint8)
    w = rng.integers(-128, 128, (24, 40)).astype(np.int8)
    ws = _signed_scales(rng, 24)
    for op, extra in (("qlinear_relu", {}), ("qlinear_gelu", {"approximate": "tanh"})):
        why = str(refcore.explain(op, x, 0.02, 9, w, ws, **extra))
        assert f"{op}_{_best()}" in why and "chosen" in why, why
        got = refcore.run(op, x, 0.02, 9, w, ws, **extra, provider="native")
        want = getattr(fref, op)(x, 0.02, 9, w, ws, **extra)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


#: output codes of the requantizing ops: (dtype, zero point, quant_min, quant_max)
CODES = [("uint8", 40, 0, 255), ("int8", -5, -128, 127), ("int8", 3, -20, 90)]


def _q8_args(scale: float, code) -> tuple:
    """The C call's output-code arguments (inv, zp, qmin, qmax, sgn) of scale and CODES entry."""
    dtype, zp, qmin, qmax = code
    return float(np.float32(1.0 / scale)), zp, qmin, qmax, int(dtype == "int8")


def _qlinear_q8(lib, x, zp, w, ws, b, nt: int, post: str, scale: float, code,
                xs: float = 0.02) -> np.ndarray:  # fmt: skip
    """rc_qlinear_q8 into a guarded output of 1-byte codes."""
    m, k = x.shape
    n = w.shape[0]
    buf, y = _guarded((m, n), np.dtype(code[0]))
    scratch = np.empty(lib.fn("rc_qlinear_scratch_f32")(m, n, k, nt), np.uint8)
    p = lib.ffi.from_buffer
    bp = lib.ffi.NULL if b is None else p(b)
    lib.fn("rc_qlinear_q8")(p(x), p(w), p(ws), bp, p(y), p(scratch), m, n, k, xs, zp,
                               POST[post], *_q8_args(scale, code), nt)  # fmt: skip
    _untouched(buf, f"qlinear_q8 {m}x{k}x{n} nt={nt} post={post}")
    return y


def _qconv_q8(lib, x, xs, zp, w, ws, b, attrs, nt: int, nchw: bool, scale: float,
              code) -> np.ndarray:  # fmt: skip
    """rc_qconv2d_q8 (relu) on exact-size NHWC (or NCHW) input into guarded NHWC codes."""
    geo = native._conv_geo("qconv2d", x, w, *attrs)
    g = np.array((*geo, int(nchw)), np.int64)
    n, o, ho, wo = x.shape[0], w.shape[0], geo[14], geo[15]
    xin = np.ascontiguousarray(x) if nchw else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    wt = np.ascontiguousarray(w.transpose(0, 2, 3, 1))
    buf, y = _guarded((n, ho, wo, o), np.dtype(code[0]))
    p = lib.ffi.from_buffer
    scratch = np.empty(lib.fn("rc_qconv2d_scratch_f32")(p(g), nt), np.uint8)
    bp = lib.ffi.NULL if b is None else p(b)
    lib.fn("rc_qconv2d_q8")(p(xin), p(wt), p(ws), bp, p(y), p(scratch), p(g), xs, zp,
                               POST["relu_q"], *_q8_args(scale, code), nt)  # fmt: skip
    _untouched(buf, f"qconv2d_q8 {x.shape} {w.shape} nt={nt}")
    return y.transpose(0, 3, 1, 2)


def _requant(lib, y: np.ndarray, scale: float, code) -> np.ndarray:
    """The native quantize kernel on fp32 y (the unfused op's last step)."""
    dtype, zp, qmin, qmax = code
    return _quantize(lib, np.ascontiguousarray(y), scale, zp, qmin, qmax, dtype, 1)


@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_qlinear_requantizing_post_ops_are_the_quantize_kernel_on_the_unfused_op(
    lib, m, k, n
) -> None:
    """qlinear_relu_quantize's codes on both qlinear paths are bit for bit the native quantize
    kernel on the reference qlinear_relu (float32(acc) * s + b, not an fma); the gelu forms are
    the native quantize of the native gelu kernel on the reference qlinear (the same vector
    gelu), so within a code of the reference; uint8 and int8 codes, narrow ranges that clamp."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n + 7)
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    ws = _signed_scales(rng, n)
    b = rng.normal(size=n).astype(np.float32)
    for bias in (b, None):
        plain = ref.qlinear(x, 0.02, 77, w, ws, bias)
        for code in CODES:
            scale = float(rng.uniform(0.005, 0.1))
            want = _requant(lib, eref.relu(plain), scale, code)
            for nt in (1, 2):
                msg = f"{code} nt={nt} bias={bias is not None}"
                got = _qlinear_q8(lib, x, 77, w, ws, bias, nt, "relu_q", scale, code)
                np.testing.assert_array_equal(got, want, err_msg=msg)
                for post, approx in (("gelu_q", "none"), ("gelu_tanh_q", "tanh")):
                    got = _qlinear_q8(lib, x, 77, w, ws, bias, nt, post, scale, code)
                    gelu = _native_gelu(lib, plain, approx)
                    np.testing.assert_array_equal(got, _requant(lib, gelu, scale, code),
                                                  err_msg=f"{msg} {post}")  # fmt: skip
                    ref_codes = fref.qlinear_gelu_quantize(x, 0.02, 77, w, ws, bias, scale,
                                                           *code[1:], code[0],
                                                           approximate=approx)  # fmt: skip
                    assert np.abs(got.astype(int) - ref_codes).max(initial=0) <= 1, msg


@pytest.mark.parametrize("case", CONVS, ids=[str(i) for i in range(len(CONVS))])
def test_qconv2d_relu_quantize_is_the_quantize_kernel_on_the_unfused_op(lib, case) -> None:
    """qconv2d_relu_quantize on every qconv2d geometry, NHWC and NCHW input, one and two
    threads: bit for bit the native quantize kernel on the reference qconv2d_relu."""
    rng, x, wq, ws, b, attrs = _conv_case(case, 2)
    for bias in (b, None):
        relu = fref.qconv2d_relu(x, 0.02, 91, wq, ws, bias, *attrs)
        for code in CODES:
            scale = float(rng.uniform(0.005, 0.1))
            want = _requant(lib, relu, scale, code)
            assert (want == code[1]).mean() > 0.1  # relu's zeros: the zero point
            for nt, nchw in ((1, False), (2, False), (2, True)):
                got = _qconv_q8(lib, x, 0.02, 91, wq, ws, bias, attrs, nt, nchw, scale, code)
                np.testing.assert_array_equal(got, want, err_msg=f"{code} nt={nt} nchw={nchw}")


def _fma_breaks_a_tie() -> tuple[int, np.float32]:
    """(acc, s): float32(acc * s) == 2.5 exactly while the exact acc * s is below it by more
    than half an ulp of 1.5, so float32(acc) * s - 1 is 1.5 (code 2 at scale 1) but fma(acc,
    s, -1) is just below 1.5 (code 1)."""
    for acc in range(3, 400):
        s0 = np.float32(2.5 / acc)
        for d in range(-4, 5):
            s = np.nextafter(s0, np.float32(np.inf * np.sign(d))) if d else s0
            for _ in range(abs(d) - 1):
                s = np.nextafter(s, np.float32(np.inf * np.sign(d)))
            exact = acc * float(s)
            if np.float32(acc) * s == 2.5 and 2.5 - exact > 0.6e-7:
                return acc, s
    raise AssertionError("no such (acc, s)")


def test_requantizing_relu_multiplies_then_adds(lib) -> None:
    """The relu forms round float32(acc) * s before adding the bias (the reference's steps):
    a value an fma would move across a rounding tie gives the reference's code on both qlinear
    paths and in qconv2d."""
    acc, s = _fma_breaks_a_tie()
    code = ("uint8", 0, 0, 255)
    bias = np.full(20, -1.0, np.float32)
    ws = np.full(20, s, np.float32)
    for m in (3, 20):  # both qlinear paths
        x = np.full((m, 1), acc, np.uint8)
        w = np.ones((20, 1), np.int8)
        want = fref.qlinear_relu_quantize(x, 1.0, 0, w, ws, bias, 1.0, 0, 0, 255, "uint8")
        assert (want == 2).all()
        got = _qlinear_q8(lib, x, 0, w, ws, bias, 1, "relu_q", 1.0, code, xs=1.0)
        np.testing.assert_array_equal(got, want)
    x = np.full((1, 1, 3, 5), acc, np.uint8)
    got = _qconv_q8(lib, x, 1.0, 0, np.ones((20, 1, 1, 1), np.int8), ws, bias, (1, 0, 1, 1), 1,
                    False, 1.0, code)  # fmt: skip
    assert (got == 2).all()


def test_requantizing_relu_maps_nan_to_quant_min(lib) -> None:
    """relu keeps NaN (torch) and quantize maps it to quant_min: a NaN or infinite weight scale
    gives the reference's codes (NaN -> quant_min, +-inf -> the range's ends or the zero point)."""
    x = np.array([[0, 1, 200], [5, 0, 3]], np.uint8).repeat(8, axis=0)  # both paths: 16, 17 rows
    w = np.array([[1, 1, 1], [-1, 1, 0], [2, 0, 1], [1, 0, 0], [0, 0, 0]], np.int8)
    ws = np.array([np.nan, np.inf, -np.inf, 0.01, np.inf], np.float32)
    for m in (16, 17):
        xm = np.resize(x, (m, 3))
        for code in CODES:
            with np.errstate(invalid="ignore"):  # inf * 0 in the reference
                want = fref.qlinear_relu_quantize(xm, 0.5, 0, w, ws, None, 0.1, *code[1:],
                                                  code[0])  # fmt: skip
            assert (want[:, 0] == code[2]).all()
            got = _qlinear_q8(lib, xm, 0, w, ws, None, 1, "relu_q", 0.1, code, xs=0.5)
            np.testing.assert_array_equal(got, want, err_msg=f"m={m} {code}")


def test_requantizing_kernels_are_registered_with_the_unfused_rules(monkeypatch) -> None:
    """The requantizing ops run through dispatch with qlinear's / qconv2d's layouts and rules:
    the AVX2 kernels of qlinear's forms decline M > 16 on a VNNI CPU (with the reason), as
    qlinear's do; the VNNI ones take every M."""
    for lvl in LEVELS:
        rule = _fused_kernel(f"qlinear_{lvl}").rule
        for op in ("qlinear_relu_quantize", "qlinear_gelu_quantize"):
            k = _fused_kernel(f"{op}_{lvl}")
            assert k.rule is rule and k.layouts == _fused_kernel(f"qlinear_{lvl}").layouts
        k = _fused_kernel(f"qconv2d_relu_quantize_{lvl}")
        conv = _fused_kernel(f"qconv2d_{lvl}")
        assert k.rule is conv.rule and k.layouts == conv.layouts
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (24, 40)).astype(np.int8)
    ws = _signed_scales(rng, 24)
    qargs = (0.05, 3, 0, 255, "uint8")
    op = default_registry().op("qlinear_relu_quantize")
    # the AVX2 kernel leaves M > 16 to torch on a VNNI CPU (checked below, on a CPU said to
    # have VNNI)
    for m in (4,) if _avx2_declines() else (4, 17, 40):
        x = rng.integers(0, 256, (m, 40)).astype(np.uint8)
        why = str(refcore.explain("qlinear_relu_quantize", x, 0.02, 9, w, ws, None, *qargs))
        assert f"qlinear_relu_quantize_{_best()}" in why and "chosen" in why, why
        got = refcore.run("qlinear_relu_quantize", x, 0.02, 9, w, ws, None, *qargs,
                          provider="native")  # fmt: skip
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, fref.qlinear_relu_quantize(x, 0.02, 9, w, ws, None,
                                                                      *qargs))  # fmt: skip
    vnni = cpu.detected() | {"avx512_vnni"}
    monkeypatch.setattr(cpu, "detected", lambda: vnni)
    kq = _fused_kernel("qlinear_relu_quantize_avx2")
    for m, ok in ((16, True), (17, False)):
        x = rng.integers(0, 256, (m, 40)).astype(np.uint8)
        call = bind(op, (x, 0.02, 9, w, ws, None, *qargs), {})
        verdict = kq.supports(call)
        assert bool(verdict) == ok, verdict
        if not ok:
            assert "VNNI" in verdict.reason, verdict.reason
    if "avx512_bf16" in LEVELS and cpu.has("avx512_bf16"):  # the VNNI kernel takes every M
        kv = _fused_kernel("qlinear_relu_quantize_avx512_bf16")
        for m in (16, 17, 300):
            x = rng.integers(0, 256, (m, 40)).astype(np.uint8)
            assert kv.supports(bind(op, (x, 0.02, 9, w, ws, None, *qargs), {}))
    x = rng.integers(0, 256, (2, 6, 9, 8)).astype(np.uint8)
    x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    wc = rng.integers(-128, 128, (10, 6, 3, 3)).astype(np.int8)
    args = (x, 0.03, 5, wc, _signed_scales(rng, 10), None, *qargs)
    got = refcore.run("qconv2d_relu_quantize", *args, stride=2, padding=1, provider="native")
    assert got.transpose(0, 2, 3, 1).flags.c_contiguous  # channels_last, as qconv2d's
    want = fref.qconv2d_relu_quantize(*args, stride=2, padding=1)
    np.testing.assert_array_equal(got, want)


def _quantize(lib, x, scale, zp, qmin, qmax, dtype, nt) -> np.ndarray:
    buf, q = _guarded(x.shape, np.dtype(dtype))
    tag = "bf16" if x.dtype == BFLOAT16 else "f32"
    fn = lib.fn(f"rc_quantize_per_tensor_{tag}")
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
            lib.fn("rc_dequantize_per_tensor_f32")(p(q), p(y), n, float(np.float32(0.037)),
                                                      lo + 9, int(dtype == "int8"), nt)  # fmt: skip
            _untouched(buf, f"dequantize {n} nt={nt}")
            np.testing.assert_array_equal(y, want, err_msg=f"n={n} nt={nt}")


def _kernel(op: str, level: str | None = None):
    """The kernel function of ``op`` at ``level`` (default: the first one registered)."""
    kernels = refcore_native.make_provider().kernels
    return next(k for k in kernels if k.op == op and level in (None, k.isa)).fn


U8, I8, F32 = np.uint8, np.int8, np.float32
# a valid qlinear_*_quantize call the bad cases below change one argument of
_QLQ = dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=0,
            weight=np.zeros((3, 4), I8), weight_scales=np.ones(3, F32), bias=None,
            output_scale=0.1, output_zero_point=0, quant_min=0, quant_max=255,
            dtype="uint8")  # fmt: skip
_QCQ = dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
            weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32), bias=None,
            output_scale=0.1, output_zero_point=0, quant_min=-128, quant_max=127,
            dtype="int8")  # fmt: skip

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
    ("dynamic_qlinear", dict(input=np.zeros((2, 4), F32), weight=np.zeros((3, 4), F32),
                             weight_scales=np.ones(3, F32)),
     TypeError, "'weight' expected dtype int8"),
    ("dynamic_qlinear", dict(input=np.zeros((2, 4), F32), weight=np.zeros((3, 5), I8),
                             weight_scales=np.ones(3, F32)),
     ValueError, "'weight' expected shape (N, 4)"),
    ("dynamic_qlinear", dict(input=np.zeros((2, 4), np.float64), weight=np.zeros((3, 4), I8),
                             weight_scales=np.ones(3, F32)),
     TypeError, "'input' expected dtype"),
    ("dynamic_qlinear", dict(input=np.zeros((2, 8), F32)[:, ::2], weight=np.zeros((3, 4), I8),
                             weight_scales=np.ones(3, F32)),
     ValueError, "C-contiguous"),
    ("dynamic_qlinear", dict(input=np.zeros((2, 4), F32), weight=np.zeros((3, 4), I8),
                             weight_scales=np.ones(3, F32), bias=np.ones(2, F32)),
     ValueError, "'bias' expected shape (3,)"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), F32), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32)),
     TypeError, "'input' expected a 4-D uint8 array"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), F32), weight_scales=np.ones(3, F32)),
     TypeError, "'weight' expected a 4-D int8 array"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 5, 3, 3), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'weight' expected shape (O, 2, kH, kW)"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(2, F32)),
     ValueError, "'weight_scales' expected shape (3,)"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=300,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'zero_point' expected in [quant_min, quant_max] = [0, 255]"),
    ("qconv2d", dict(input=np.zeros((1, 4, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32),
                     groups=2),
     ValueError, "'groups' expected a positive divisor of C = 4 and O = 3"),
    ("qconv2d", dict(input=np.zeros((1, 2, 2, 2), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'input' expected an output of at least 1 x 1"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32),
                     stride=2, padding="same"),
     ValueError, "'padding' expected 'valid', 'same' (stride 1)"),
    ("qconv2d", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((3, 2, 3, 3), I8), weight_scales=np.ones(3, F32),
                     dilation=0),
     ValueError, "'stride, dilation' expected positive values"),
    ("qconv2d", dict(input=np.zeros((1, 1025, 8, 8), U8), input_scale=0.1, input_zero_point=0,
                     weight=np.zeros((1, 1025, 8, 8), I8), weight_scales=np.ones(1, F32)),
     ValueError, "C / groups * kH * kW <= 65536"),
    ("qlinear_gelu", dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=0,
                          weight=np.zeros((3, 4), I8), weight_scales=np.ones(3, F32),
                          approximate="sigmoid"),
     ValueError, "'approximate' expected 'none' or 'tanh'"),
    ("qlinear_relu", dict(input=np.zeros((2, 4), U8), input_scale=0.1, input_zero_point=0,
                          weight=np.zeros((3, 5), I8), weight_scales=np.ones(3, F32)),
     ValueError, "'weight' expected shape (N, 4)"),
    ("qconv2d_relu", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1, input_zero_point=0,
                          weight=np.zeros((3, 2, 3, 3), F32), weight_scales=np.ones(3, F32)),
     TypeError, "'weight' expected a 4-D int8 array"),
    ("qconv2d_add_relu", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1,
                              input_zero_point=0, weight=np.zeros((3, 2, 3, 3), I8),
                              weight_scales=np.ones(3, F32), other=np.zeros((3, 1, 1), F32)),
     ValueError, "'other' expected an array of the output's shape (1, 3, 2, 2)"),
    ("qconv2d_add_relu", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1,
                              input_zero_point=0, weight=np.zeros((3, 2, 3, 3), I8),
                              weight_scales=np.ones(3, F32),
                              other=np.zeros((1, 3, 2, 4), F32)[..., ::2]),
     ValueError, "'other' expected a C-contiguous, aligned array"),
    ("qconv2d_add_relu", dict(input=np.zeros((1, 2, 4, 4), U8), input_scale=0.1,
                              input_zero_point=0, weight=np.zeros((3, 2, 3, 3), I8),
                              weight_scales=np.ones(3, F32), other=np.zeros((1, 3, 2, 2))),
     TypeError, "'other' expected dtype float32"),
    ("qlinear_relu_quantize", dict(_QLQ, output_zero_point=300),
     ValueError, "'zero_point' expected in [quant_min, quant_max] = [0, 255]"),
    ("qlinear_gelu_quantize", dict(_QLQ, dtype="int16"),
     ValueError, "'dtype' expected 'uint8' or 'int8'"),
    ("qlinear_gelu_quantize", dict(_QLQ, output_scale=0.0),
     ValueError, "'scale' expected a finite float > 0"),
    ("qconv2d_relu_quantize", dict(_QCQ, weight=np.zeros((3, 2, 3, 3), F32)),
     TypeError, "'weight' expected a 4-D int8 array"),
    ("qconv2d_relu_quantize", dict(_QCQ, quant_max=200),
     ValueError, "'quant_min, quant_max' expected -128 <= quant_min <= quant_max <= 127"),
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


# ---------------------------------------------------------------------------------------------
# The uint8 tiles (codes <= 127: vpmaddubsw is exact): each call reports its path (1 uint8, 0
# int16); scales 1 and no bias make y = float32(acc) exact, every int32 sum compared bit for bit.

#: M > SMALL_M (the GEMM path): K % 4 of 0-3 (x copied to whole quads; in place when 0), N and M
#: tails of the 6 x 16 tile, K = 384 (a BERT width)
SHAPES_7BIT = [(17, 1, 1), (23, 5, 17), (40, 33, 31), (130, 302, 33), (61, 384, 48)]


def _codes7(rng, shape: tuple[int, ...]) -> np.ndarray:
    """7-bit codes with both ends present: 0 and 127 (the largest vpmaddubsw pair, 127 * -128
    * 2 = -32512, within int16)."""
    x = rng.choice(np.uint8([0, 127, 127, 1, 64, 126]), shape)
    return x


@pytest.mark.parametrize(("m", "k", "n"), SHAPES_7BIT, ids=[f"{m}x{k}x{n}" for m, k, n in
                                                            SHAPES_7BIT])  # fmt: skip
def test_qlinear_7bit_codes_take_the_uint8_path(lib, m: int, k: int, n: int) -> None:
    """Codes <= 127 with any zero point (it never reaches vpmaddubsw in qlinear): the uint8
    tiles, the reference's sums bit for bit; weights of both extremes; one code of 128: the
    int16 tiles, the same values."""
    rng = np.random.default_rng(m + k + n)
    x = _codes7(rng, (m, k))
    w = rng.choice(np.int8([-128, 127, -5, 3]), (n, k))
    ones = np.ones(n, np.float32)
    for zp in (0, 127, 128, 255):
        want = ref.qlinear(x, 1.0, zp, w, ones)
        for nt in (1, 2):
            got = _qlinear(lib, x, zp, w, ones, None, nt, xs=1.0, path=1)
            np.testing.assert_array_equal(got, want, err_msg=f"zp={zp} nt={nt}")
    wide = x.copy()
    wide[m // 2, k // 2] = 128
    want = ref.qlinear(wide, 1.0, 100, w, ones)
    got = _qlinear(lib, wide, 100, w, ones, None, 2, xs=1.0, path=0)
    np.testing.assert_array_equal(got, want)


def _weights7(rng, shape: tuple[int, ...]) -> np.ndarray:
    """7-bit weights (x86_static_int8_w7's [-64, 63], and 64) with both ends present: with
    codes up to 255 a vpmaddubsw pair reaches 255 * -64 * 2 = -32640, within int16."""
    return rng.choice(np.int8([-64, 64, 63, -1, 5]), shape)


@pytest.mark.parametrize(("m", "k", "n"), SHAPES_7BIT, ids=[f"{m}x{k}x{n}" for m, k, n in
                                                            SHAPES_7BIT])  # fmt: skip
def test_qlinear_7bit_weights_take_the_uint8_path_for_any_code(lib, m: int, k: int,
                                                                n: int) -> None:  # fmt: skip
    """Weights in [-64, 64] with codes up to 255 and any zero point: the uint8 tiles, the
    reference's sums bit for bit; one weight of -65: the int16 tiles, the same values."""
    rng = np.random.default_rng(m * k + n)
    x = rng.choice(np.uint8([0, 255, 255, 128, 7]), (m, k))
    w = _weights7(rng, (n, k))
    ones = np.ones(n, np.float32)
    for zp in (0, 200, 255):
        want = ref.qlinear(x, 1.0, zp, w, ones)
        for nt in (1, 2):
            got = _qlinear(lib, x, zp, w, ones, None, nt, xs=1.0, path=1)
            np.testing.assert_array_equal(got, want, err_msg=f"zp={zp} nt={nt}")
    w[n // 2, k // 2] = -65
    want = ref.qlinear(x, 1.0, 9, w, ones)
    np.testing.assert_array_equal(_qlinear(lib, x, 9, w, ones, None, 2, xs=1.0, path=0), want)


def test_qlinear_uint8_path_post_ops(lib) -> None:
    """relu, gelu and gelu (tanh) on the uint8 tiles: the unfused kernel then the activation,
    as on the int16 tiles."""
    rng = np.random.default_rng(9)
    x = _codes7(rng, (40, 301))
    w = rng.integers(-128, 128, (33, 301)).astype(np.int8)
    ws, b = _signed_scales(rng, 33), rng.normal(size=33).astype(np.float32)
    plain = _qlinear(lib, x, 60, w, ws, b, 2, path=1)
    np.testing.assert_allclose(plain, ref.qlinear(x, 0.02, 60, w, ws, b), rtol=1e-6, atol=1e-5)
    relu = _qlinear(lib, x, 60, w, ws, b, 2, post=POST["relu"], path=1)
    np.testing.assert_array_equal(relu, np.maximum(plain, 0))
    for post, approx in (("gelu", "none"), ("gelu_tanh", "tanh")):
        got = _qlinear(lib, x, 60, w, ws, b, 2, post=POST[post], path=1)
        np.testing.assert_array_equal(got, _native_gelu(lib, plain, approx), err_msg=post)


#: CONVS plus the ResNet stem (3 channels, 7 x 7, stride 2, padding 3) and a 1 x 1 conv
CONVS_7BIT = [*CONVS, (1, 3, 16, 23, 22, 7, 7, 2, 3, 1, 1), (2, 12, 20, 5, 6, 1, 1, 1, 0, 1, 1)]


@pytest.mark.parametrize("case", CONVS_7BIT, ids=[str(i) for i in range(len(CONVS_7BIT))])
def test_qconv2d_7bit_codes_take_the_uint8_path(lib, case) -> None:
    """Every CONVS geometry (odd runs: C not a multiple of 4, padding, strides, dilation,
    groups, NHWC and NCHW) with codes <= 127: the uint8 tiles where the padding's zero point is
    <= 127 too (or there is no padding), bit for bit the reference's sums; zero point 128 with
    padding, or one code of 128: the int16 tiles, the same values."""
    n, c, o, h, wd, kh, kw, stride, padding, dilation, groups = case
    rng = np.random.default_rng(len(str(case)) + 7)
    x = _codes7(rng, (n, c, h, wd))
    w = rng.choice(np.int8([-128, 127, -7, 2]), (o, c // groups, kh, kw))
    ones = np.ones(o, np.float32)
    attrs = (stride, padding, dilation, groups)
    geo = native._conv_geo("qconv2d", x, w, *attrs)
    padded = (geo[16], geo[17]) != (h, wd)
    for zp in (0, 127, 128):
        want = ref.qconv2d(x, 1.0, zp, w, ones, None, *attrs)
        for nt, nchw in ((1, False), (2, False), (2, True)):
            got = _qconv(lib, x, 1.0, zp, w, ones, None, *attrs, nt, nchw,
                         path=int(zp <= 127 or not padded))  # fmt: skip
            np.testing.assert_array_equal(got, want, err_msg=f"zp={zp} nt={nt} nchw={nchw}")
    wide = x.copy()
    wide.reshape(-1)[x.size // 2] = 128
    want = ref.qconv2d(wide, 1.0, 3, w, ones, None, *attrs)
    np.testing.assert_array_equal(_qconv(lib, wide, 1.0, 3, w, ones, None, *attrs, 2, path=0),
                                  want)  # fmt: skip


@pytest.mark.parametrize("case", CONVS_7BIT, ids=[str(i) for i in range(len(CONVS_7BIT))])
def test_qconv2d_7bit_weights_take_the_uint8_path_for_any_code(lib, case) -> None:
    """Weights in [-64, 64]: the uint8 tiles for codes up to 255 and a padding zero point of
    200, bit for bit the reference's sums; one weight of 65: the int16 tiles, the same values."""
    n, c, o, h, wd, kh, kw, stride, padding, dilation, groups = case
    rng = np.random.default_rng(len(str(case)) + 11)
    x = rng.choice(np.uint8([0, 255, 255, 128, 7]), (n, c, h, wd))
    w = _weights7(rng, (o, c // groups, kh, kw))
    ones = np.ones(o, np.float32)
    attrs = (stride, padding, dilation, groups)
    for zp in (0, 200):
        want = ref.qconv2d(x, 1.0, zp, w, ones, None, *attrs)
        for nt, nchw in ((1, False), (2, True)):
            got = _qconv(lib, x, 1.0, zp, w, ones, None, *attrs, nt, nchw, path=1)
            np.testing.assert_array_equal(got, want, err_msg=f"zp={zp} nt={nt} nchw={nchw}")
    w.reshape(-1)[w.size // 2] = 65
    want = ref.qconv2d(x, 1.0, 200, w, ones, None, *attrs)
    np.testing.assert_array_equal(_qconv(lib, x, 1.0, 200, w, ones, None, *attrs, 2, path=0),
                                  want)  # fmt: skip


def test_qconv2d_uint8_path_post_ops(lib) -> None:
    """relu and relu(y + other) (other NHWC and NCHW) on the uint8 tiles: the unfused kernel's
    output with the add and relu applied in fp32, bit for bit."""
    rng = np.random.default_rng(13)
    x = _codes7(rng, (2, 7, 9, 8))
    w = rng.integers(-128, 128, (19, 7, 3, 3)).astype(np.int8)
    ws, b = _signed_scales(rng, 19), rng.normal(size=19).astype(np.float32)
    attrs = (2, 1, 1, 1)
    plain = _qconv(lib, x, 0.02, 40, w, ws, b, *attrs, 2, path=1)
    np.testing.assert_allclose(plain, ref.qconv2d(x, 0.02, 40, w, ws, b, *attrs), rtol=1e-6,
                               atol=1e-5)  # fmt: skip
    relu = _qconv(lib, x, 0.02, 40, w, ws, b, *attrs, 2, post=POST["relu"], path=1)
    np.testing.assert_array_equal(relu, np.maximum(plain, 0))
    other = rng.normal(size=plain.shape).astype(np.float32)
    for res_nchw, res in ((0, np.ascontiguousarray(other.transpose(0, 2, 3, 1))), (1, other)):
        got = _qconv(lib, x, 0.02, 40, w, ws, b, *attrs, 2, post=POST["add_relu"],
                     other=(res, res_nchw), path=1)  # fmt: skip
        np.testing.assert_array_equal(got, np.maximum(plain + other, 0))


@pytest.fixture
def paths(lib, monkeypatch) -> list[int]:
    """The paths the qlinear / qconv2d C calls made through the kernels report, in order."""
    from refcore_native import _runtime

    seen: list[int] = []
    real = _runtime.c_function

    def spy(name: str):
        c = real(name)
        if not name.startswith(("rc_qlinear_f32", "rc_qlinear_q8", "rc_qconv2d_f32",
                                "rc_qconv2d_q8")):  # fmt: skip
            return c

        def fn(*args):
            seen.append(c.fn(*args))
            return seen[-1]

        return c._replace(fn=fn)

    monkeypatch.setattr(_runtime, "c_function", spy)
    return seen


def _avx2_declines() -> bool:
    """Dispatch's best int8 level is avx2 on a VNNI CPU (capped): qlinear's M > 16 declined."""
    return _best() == "avx2" and "avx512_vnni" in cpu.detected()


def _native_vs_reference(op: str, *args, exact: bool = True, **kwargs) -> None:
    why = str(refcore.explain(op, *args, **kwargs, provider="native"))
    assert f"{op}_{_best()}" in why and "chosen" in why, why
    got = refcore.run(op, *args, **kwargs, provider="native")
    want = refcore.run(op, *args, **kwargs, provider="reference")
    assert got.dtype == want.dtype and got.shape == want.shape, op
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=op)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5, err_msg=op)


def _qlinear_declined_on_vnni(op: str, *args) -> None:
    """On a CPU with VNNI the AVX2 qlinear kernels leave M > 16 to torch (their rule): say so."""
    why = str(refcore.explain(op, *args, provider="native"))
    assert "declined" in why and "VNNI" in why, why


def test_uint8_path_through_dispatch_matches_the_reference(paths) -> None:
    """The ops (qlinear, qconv2d and fused forms) chosen by dispatch on 7-bit codes, or on any
    codes with 7-bit weights, run the uint8 tiles (the C calls report it) and give the reference
    provider's values: bit for bit without a bias (and for the requantizing relu forms), within
    tolerance with gelu. On a VNNI CPU capped to avx2 the qlinear forms at M > 16 are declined
    instead. The VNNI kernels report the uint8 path for every call (one exact path)."""
    vnni = _avx2_declines()
    rng = np.random.default_rng(21)
    qargs = (0.05, 3, 0, 255, "uint8")
    w = rng.integers(-128, 128, (40, 37)).astype(np.int8)
    ws = _signed_scales(rng, 40)
    x7 = _codes7(rng, (3, 13, 37))  # M = 39 rows > SMALL_M
    x8 = rng.integers(0, 256, (3, 13, 37)).astype(np.uint8)
    w7 = _weights7(rng, (40, 37))
    calls = [("qlinear", (x7, 0.02, 90, w, ws)), ("qlinear_relu", (x7, 0.02, 90, w, ws)),
             ("qlinear_gelu", (x7, 0.02, 90, w, ws)),
             ("qlinear_relu_quantize", (x7, 0.02, 90, w, ws, None, *qargs)),
             ("qlinear", (x8, 0.02, 200, w7, ws))]  # fmt: skip
    for op, args in calls:
        if vnni:
            _qlinear_declined_on_vnni(op, *args)
        else:
            _native_vs_reference(op, *args, exact=op != "qlinear_gelu")
    xc = _codes7(rng, (2, 6, 11, 10))
    xc = np.ascontiguousarray(xc.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels_last
    wc = rng.integers(-128, 128, (20, 6, 3, 3)).astype(np.int8)
    wsc = _signed_scales(rng, 20)
    conv = dict(stride=2, padding=1)
    _native_vs_reference("qconv2d", xc, 0.03, 11, wc, wsc, **conv)
    _native_vs_reference("qconv2d_relu", xc, 0.03, 11, wc, wsc, **conv)
    other = rng.normal(size=(2, 20, 6, 5)).astype(np.float32)
    _native_vs_reference("qconv2d_add_relu", xc, 0.03, 11, wc, wsc, None, other, **conv)
    _native_vs_reference("qconv2d_relu_quantize", xc, 0.03, 11, wc, wsc, None, *qargs, **conv)
    # any codes and a padding zero point of 200 with 7-bit weights
    xc8 = np.ascontiguousarray(rng.integers(0, 256, (2, 11, 10, 6)).astype(np.uint8))
    _native_vs_reference("qconv2d", xc8.transpose(0, 3, 1, 2), 0.03, 200,
                         _weights7(rng, (20, 6, 3, 3)), wsc, **conv)  # fmt: skip
    assert paths == [1] * (5 if vnni else 10), paths
    paths.clear()
    _native_vs_reference("qconv2d", xc, 0.03, 128, wc, wsc, **conv)  # the padding: 128
    assert paths == [0 if _best() == "avx2" else 1], paths
