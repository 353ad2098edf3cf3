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


def _gemm_kernels() -> list:
    prov = refcore.providers().get("native")
    if prov is None or not prov.available:
        return []
    return [k for k in native.make_provider().kernels if "_gemm_" in k.name]


needs_gemm = pytest.mark.skipif(not _gemm_kernels(), reason="no native GEMM kernel on this CPU")


@pytest.mark.parametrize("layout", sorted(PACKERS))
@given(n=st.integers(1, 80), k=st.integers(1, 130), seed=st.integers(0, 2**31))
def test_c_packer_matches_the_layout_reference(layout: str, n: int, k: int, seed: int) -> None:
    level, dt, fn = PACKERS[layout]
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
@pytest.mark.parametrize("level", ["portable", "avx512", "avx512_bf16", "amx"])
def test_c_writes_only_inside_its_output(level: str) -> None:
    """Every GEMM C function, odd sizes, output between sentinel guards."""
    if not refcore.cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    from refcore_native import _runtime as rt

    rng, guard = np.random.default_rng(0), 64
    m, n, k = 37, 45, 67
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
