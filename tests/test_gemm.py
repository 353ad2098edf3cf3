"""Native GEMM family (refcore_native.gemm): what the generic kernel suite does not see.

The suite (tests/test_kernels.py) checks every GEMM kernel against the reference on plain and on
packed weights; here: the C packers against the NumPy layout references, which kernel takes which
M, and AMX in a process that never ran a torch bf16 matmul (oneDNN requests the tile permission
itself, which would hide a missing request of ours).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refcore
from refcore.registry import default_registry, resolve
from refcore.tensors import BFLOAT16

native = pytest.importorskip("refcore_native")
REG = default_registry()
PACKERS = {
    "amx_bf16_vnni2": ("amx", BFLOAT16, "rc_gemm_pack_bf16_amx"),
    "avx512_f32_panel32": ("avx512", np.dtype(np.float32), "rc_gemm_pack_f32_avx512"),
}
#: further C packers of a layout (another level writing the same layout)
MORE_PACKERS = {"avx512_f32_panel32": ("avx2", np.dtype(np.float32), "rc_gemm_pack_f32_avx2")}


def _gemm_kernels() -> list:
    prov = refcore.providers().get("native")
    if prov is None or not prov.available:
        return []
    return [k for k in native.make_provider().kernels if "_gemm_" in k.name]


needs_gemm = pytest.mark.skipif(not _gemm_kernels(), reason="no native GEMM kernel on this CPU")


@pytest.mark.parametrize("packer", [*sorted(PACKERS.items()), *sorted(MORE_PACKERS.items())])
@given(n=st.integers(1, 80), k=st.integers(1, 130), seed=st.integers(0, 2**31))
def test_c_packer_matches_the_layout_reference(packer: tuple, n: int, k: int, seed: int) -> None:
    layout, (level, dt, fn) = packer
    if not refcore.cpu.has(level):
        pytest.skip(f"needs ISA level {level}")
    from refcore_native import _runtime as rt

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(dt)
    want = resolve(REG.layouts[layout].pack)(w)
    got = np.full(want.shape, np.nan, dt)  # every element must be written, padding included
    c = rt.c_function(fn)
    c.fn(c.ptr(w), c.ptr(got), n, k, 2)
    assert got.tobytes() == want.tobytes()


@needs_gemm
def test_small_m_stays_on_the_decode_kernel_unless_packed() -> None:
    from refcore.passes.prepack import choose_layout

    for dt in (BFLOAT16, np.dtype(np.float32)):
        w = np.ones((24, 40), dt)
        small, big = np.ones((16, 40), dt), np.ones((17, 40), dt)
        assert "_gemm_" not in refcore.explain("linear", small, w, provider="native").chosen[1]
        assert "_gemm_" in refcore.explain("linear", big, w, provider="native").chosen[1]
        lay = choose_layout("linear", refcore.tensors.dtype_name(dt), "native")
        if lay is not None:  # the packed weight goes to a GEMM kernel whatever M is
            pw = refcore.pack("linear", w, lay)
            chosen = refcore.explain("linear", small[:1], pw, provider="native").chosen
            assert "_gemm_" in chosen[1]


@pytest.mark.skipif(not refcore.cpu.has("amx"), reason="no AMX here")
def test_amx_in_a_process_without_torch() -> None:
    code = """
import sys, numpy as np, refcore
import contextlib, refcore_native
from refcore.provider import using_providers
# only native: discovering every provider would load onednn's, which imports torch
scope = contextlib.ExitStack()  # kept: a dropped scope would end at once
scope.enter_context(using_providers(refcore_native.make_provider()))
from refcore.tensors import BFLOAT16
x = np.random.default_rng(0).standard_normal((70, 100)).astype(BFLOAT16)
w = np.random.default_rng(1).standard_normal((45, 100)).astype(BFLOAT16)
assert refcore.explain("linear", x, w, provider="native").chosen[1] == "linear_gemm_amx"
got = refcore.run("linear", x, w, provider="native").astype(np.float64)
want = refcore.run("linear", x, w, provider="reference").astype(np.float64)
assert np.abs(got - want).max() <= 0.03 + 0.016 * np.abs(want).max(), "mismatch"
assert "torch" not in sys.modules
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"


@needs_gemm
@pytest.mark.parametrize("m", [32, 33, 64, 100, 300])
@pytest.mark.parametrize("k", [32, 96])
def test_whole_tiles(m: int, k: int) -> None:
    """K a multiple of 32 and whole 32-row blocks (no tail path at all), which the drawn samples
    rarely hit, for every GEMM kernel and dtype."""
    rng = np.random.default_rng(m * k)
    for kern in _gemm_kernels():
        if kern.op not in ("linear", "linear_gelu", "matmul"):
            continue
        for dname in sorted(kern.dtypes):
            _check_whole(kern, dname, m, k, rng)


def _check_whole(kern, dname: str, m: int, k: int, rng) -> None:
    from refcore.tensors import numpy_dtype
    from refcore.testing import assert_close

    dt = numpy_dtype(dname)
    x = rng.standard_normal((2, m, k)).astype(dt)
    w = (rng.standard_normal((k, 48)) * 0.2).astype(dt)
    args = (
        {"input": x, "other": w}
        if kern.op == "matmul"
        else {"input": x[0], "weight": np.ascontiguousarray(w.T), "bias": w[0]}
    )
    spec = REG.op(kern.op)
    want = resolve(spec.reference)(**args)
    assert_close(kern.fn(**args), want, spec.tolerance_for(dname), f"{kern.name} {dname}")


@needs_gemm
@pytest.mark.parametrize("k", [67, 64])
@pytest.mark.parametrize("level", ["portable", "avx2", "avx512", "avx512_bf16", "amx"])
def test_c_writes_only_inside_its_output(level: str, k: int) -> None:
    """Every GEMM C function, odd M and N, output between sentinel guards; K odd, or a multiple
    of 32 (AMX then reads x's whole 32-row blocks in place and packs only the partial one)."""
    if not refcore.cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    from refcore_native import _runtime as rt

    rng, guard = np.random.default_rng(0), 64
    m, n = 37, 45
    names = [nm for nm in dir(native._build.library().lib) if nm.endswith("_" + level)]
    names = [nm for nm in names if nm.startswith(("rc_gemm_f", "rc_gemm_b", "rc_matmul_"))]
    assert names
    for name in names:
        dt = BFLOAT16 if "_bf16_" in name else np.dtype(np.float32)
        x, w = rng.standard_normal((m, k)).astype(dt), rng.standard_normal((n, k)).astype(dt)
        buf = np.empty(m * n + 2 * guard, dt)
        buf.view(np.uint8)[:] = 0xA5
        y, before = buf[guard:-guard], buf.copy()
        c = rt.c_function(name)
        if name.startswith("rc_matmul_"):
            rc = c.fn(c.ptr(x), c.ptr(np.ascontiguousarray(w.T)), c.ptr(y), 1, 0, 0, m, n, k, 2)
        else:
            res = rng.standard_normal((m, n)).astype(dt)
            rc = c.fn(c.ptr(x), c.ptr(w), c.ptr(w[0, :n] if k >= n else w[0]), c.ptr(res),
                      c.ptr(y), m, n, k, 0, 2, 2)  # fmt: skip
        assert rc == 0, name
        assert buf[:guard].tobytes() == before[:guard].tobytes(), name
        assert buf[-guard:].tobytes() == before[-guard:].tobytes(), name
        assert not (y.view(np.uint8) == 0xA5).all(), f"{name} wrote nothing"


def test_fp32_gemm_has_no_static_size_bound() -> None:
    """Every fp32 GEMM is accepted at every level, large, deep or small (measured choice decides
    against MKL per CPU: the kernel wins on AMD Zen 4, loses on the Intel Xeon at large M, and
    on Zen 3 it depends on the shape)."""
    for op in ("linear", "matmul"):
        for m, k, n in ((128, 768, 768), (32, 256, 256), (128, 1025, 768), (1024, 1536, 384)):
            x = np.ones((m, k), np.float32)
            w = np.ones((k, n) if op == "matmul" else (n, k), np.float32)
            why = refcore.explain(op, x, w, provider="native")
            gemm = [r for r in why.candidates if "_gemm_" in r.kernel and "dtype" not in r.verdict]
            tried = [r for r in gemm if r.verdict != "not tried" and "needs" not in r.verdict]
            assert tried and all("declined" not in r.verdict for r in tried), why
            assert why.chosen and "_gemm_" in why.chosen[1], why


@needs_gemm
@pytest.mark.parametrize(
    "mnk", [(40, 300, 64), (33, 50, 100), (300, 70, 96), (520, 90, 64), (1100, 90, 64)]
)
def test_two_threads_large_and_swapped(mnk: tuple[int, int, int]) -> None:
    """The C functions on shapes dispatch may decline or never draw (large fp32 and bf16 GEMMs,
    several 256-row chunks, enough of them for whole-chunk work items, M < N with whole and
    partial weight blocks), on 2 threads: the
    shared weight panels (claimed by whichever thread needs one first), the swapped roles of
    a plain bf16 weight at M < N, prepacked weights, and batched matmul."""
    from refcore_native import _runtime as rt

    from refcore.testing import assert_close

    m, n, k = mnk
    rng = np.random.default_rng(m + n + k)
    for kern in _gemm_kernels():
        if kern.op not in ("linear", "linear_add", "matmul"):
            continue
        for dname in sorted(kern.dtypes):
            dt = BFLOAT16 if dname == "bfloat16" else np.dtype(np.float32)
            tag = "bf16" if dname == "bfloat16" else "f32"
            x = rng.standard_normal((2, m, k)).astype(dt)
            w = (rng.standard_normal((n, k)) * 0.2).astype(dt)
            b, res = w[:, 0].copy(), rng.standard_normal((m, n)).astype(dt)
            tol = REG.op(kern.op).tolerance_for(dname)
            want = x.astype(np.float64) @ w.astype(np.float64).T
            y = np.full((2, m, n), np.nan, dt)
            if kern.op == "matmul":
                c = rt.c_function(f"rc_matmul_{tag}_{kern.isa}")
                wt = np.ascontiguousarray(np.stack([w.T, -w.T]))
                assert c.fn(c.ptr(x), c.ptr(wt), c.ptr(y), 2, m * k, k * n, m, n, k, 2) == 0
                assert_close(y, want * np.array([1, -1])[:, None, None], tol, kern.name)
                continue
            c = rt.c_function(f"rc_gemm_{tag}_{kern.isa}")
            mine = {"amx_bf16_vnni2" if tag == "bf16" else "avx512_f32_panel32"} & kern.layouts
            layouts = [None, *sorted(mine)]
            for lay in layouts:
                wa = w if lay is None else refcore.pack("linear", w, lay).data
                ra = res if kern.op == "linear_add" else None
                rc = c.fn(c.ptr(x[0]), c.ptr(wa), c.ptr(b), c.opt(ra), c.ptr(y[0]), m, n, k,
                          int(lay is not None), 0, 2)  # fmt: skip
                assert rc == 0
                expect = want[0] + b.astype(np.float64) + (0 if ra is None else res)
                assert_close(y[0], expect, tol, f"{kern.name} {dname} layout {lay}")


@needs_gemm
def test_bf16_gemm_with_many_outputs_is_left_to_torch_by_the_amx_kernel() -> None:
    from refcore_native.gemm import BF16_MAX_OUTPUTS

    w = np.ones((3072, 64), BFLOAT16)
    big, small = np.ones((1024, 64), BFLOAT16), np.ones((512, 64), BFLOAT16)
    assert 1024 * 3072 > BF16_MAX_OUTPUTS >= 512 * 3072
    why = refcore.explain("linear", big, w, provider="native")
    gemm = [r for r in why.candidates if "_gemm_" in r.kernel and "dtype" not in r.verdict]
    # only the AMX kernel keeps the bound (measured on the Xeon); below AMX measured choice
    # decides (the vdpbf16ps kernel beat oneDNN there on AMD Zen 4)
    amx = [r for r in gemm if r.kernel.endswith("_amx") and r.verdict != "not tried"]
    assert all("torch's oneDNN" in r.verdict for r in amx), why
    assert all("torch's oneDNN" not in r.verdict for r in gemm if r not in amx), why
    if not amx:  # no AMX kernel took part (CPU or cap without AMX): a GEMM kernel runs it
        assert why.chosen and "_gemm_" in why.chosen[1], why
    assert "_gemm_" in refcore.explain("linear", small, w, provider="native").chosen[1]


@pytest.mark.parametrize("k", [37, 1030])
@pytest.mark.parametrize("level", ["portable", "avx2", "avx512", "avx512_bf16"])
def test_small_m_c_on_two_threads_inside_its_output(level: str, k: int) -> None:
    """The small-M linear C functions (csrc/linalg_<level>.c) on 2 threads, every M up to 16,
    odd N, K odd or past one K chunk (1024), output between sentinel guards, against float64."""
    if not refcore.cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    from refcore_native import _runtime as rt

    from refcore.testing import assert_close

    rng, guard, n = np.random.default_rng(k), 64, 45
    names = [nm for nm in dir(native._build.library().lib) if nm.startswith("rc_linear_")]
    names = [nm for nm in names if nm.endswith("_" + level)]
    assert names
    for name in names:
        dt = BFLOAT16 if "_bf16_" in name else np.dtype(np.float32)
        tol = REG.op("linear").tolerance_for("bfloat16" if "_bf16_" in name else "float32")
        for m in (1, 2, 3, 7, 16):
            x = rng.standard_normal((m, k)).astype(dt)
            w = (rng.standard_normal((n, k)) / 8).astype(dt)
            b = rng.standard_normal(n).astype(dt)
            buf = np.empty(m * n + 2 * guard, dt)
            buf.view(np.uint8)[:] = 0xA5
            y, before = buf[guard:-guard], buf.copy()
            c = rt.c_function(name)
            c.fn(c.ptr(x), c.ptr(w), c.ptr(b), c.ptr(y), m, n, k, 2)
            assert buf[:guard].tobytes() == before[:guard].tobytes(), name
            assert buf[-guard:].tobytes() == before[-guard:].tobytes(), name
            want = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
            assert_close(y.reshape(m, n), want, tol, f"{name} M={m}")
