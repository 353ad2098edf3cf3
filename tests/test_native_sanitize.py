"""The sanitized native build (``REFCORE_NATIVE_SANITIZE=1``) can fail, and fails cleanly.

``python -m refcore sanitize`` runs the native kernel tests under AddressSanitizer and
UndefinedBehaviorSanitizer; a suite that passes there means something only if an out-of-bounds
access does fail it. These tests compile tiny faulty C functions with the build's own sanitizer
flags and run them in subprocesses with the environment the command sets: ASan must report a read
past a malloc'd block and past a NumPy array (NumPy's data is an exact-size malloc, so no slack
hides a kernel's overrun; the buffer pool's blocks have slack, which is why the command turns the
pool off), UBSan a signed overflow. They also check that the sanitized library has a cache entry
of its own and that loading it without the preloaded runtime is a clear "unavailable", not an
abort.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from refcore_native import _build

FAULTY_C = r"""
#include <stdint.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default"))) /* the build hides symbols by default */

EXPORT int rc_read_past_malloc(int n)  /* reads p[n] of an n-element block */
{
    int *p = malloc((size_t)n * sizeof *p);
    for (int i = 0; i < n; i++)
        p[i] = i;
    volatile int v = p[n];
    free(p);
    return v;
}

EXPORT float rc_read_past(const float *x, int64_t n)  /* reads x[n] of the caller's n elements */
{
    float s = 0.0f;
    for (int64_t i = 0; i <= n; i++)
        s += x[i];
    return s;
}

EXPORT int rc_overflow(int a)
{
    return a + 1;
}
"""


def _runtimes() -> tuple[Path, ...]:
    try:
        return _build.sanitizer_runtimes()
    except _build.BuildError as e:
        pytest.skip(f"no sanitizer runtime on this machine: {e}")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory) -> Path:
    """The faulty functions, compiled and linked with the sanitized build's flags."""
    _runtimes()
    tmp = tmp_path_factory.mktemp("faulty")
    src, obj, so = tmp / "faulty.c", tmp / "faulty.o", tmp / "libfaulty.so"
    src.write_text(FAULTY_C)
    cc, _ = _build.compiler()
    env = _build._tool_env()
    for cmd in (
        [*cc, *_build.kernel_flags(True), "-c", str(src), "-o", str(obj)],
        [*cc, *_build.link_flags(True), str(obj), "-o", str(so)],
    ):
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "warning:" not in res.stdout + res.stderr
    return so


def _sanitized_python(code: str, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **_build.sanitizer_env(), **extra}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_flags_are_the_builds() -> None:
    flags = _build.kernel_flags(True)
    assert {"-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1"} <= set(flags)
    assert "-O3" not in flags and {"-Wall", "-Wextra"} <= set(flags)
    assert _build.kernel_flags(False) == _build.KERNEL_FLAGS


def test_asan_reports_a_read_past_a_malloc(faulty: Path) -> None:
    res = _sanitized_python(f"import ctypes; ctypes.CDLL({str(faulty)!r}).rc_read_past_malloc(8)")
    assert res.returncode != 0, res.stderr
    assert "heap-buffer-overflow" in res.stderr, res.stderr[-3000:]


def test_asan_reports_a_read_past_a_numpy_array(faulty: Path) -> None:
    """37 floats (148 bytes, not a multiple of 8 or 16): a read of element 37 is outside the
    block NumPy allocated, which ASan tracks to the byte."""
    res = _sanitized_python(
        f"""
        import ctypes, numpy as np
        f = ctypes.CDLL({str(faulty)!r}).rc_read_past
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_float
        x = np.ones(37, np.float32)
        f(x.ctypes.data, 37)
        """
    )
    assert res.returncode != 0, res.stderr
    assert "heap-buffer-overflow" in res.stderr, res.stderr[-3000:]
    assert "rc_read_past" in res.stderr


def test_ubsan_reports_signed_overflow(faulty: Path) -> None:
    res = _sanitized_python(f"import ctypes; ctypes.CDLL({str(faulty)!r}).rc_overflow(2**31 - 1)")
    assert res.returncode != 0, res.stderr
    assert "signed integer overflow" in res.stderr, res.stderr[-3000:]


def test_sanitized_build_has_its_own_key(monkeypatch) -> None:
    _build.recipe.cache_clear()
    try:
        monkeypatch.delenv(_build.ENV_SANITIZE, raising=False)
        release = _build.recipe()
        _build.recipe.cache_clear()
        monkeypatch.setenv(_build.ENV_SANITIZE, "1")
        sanitized = _build.recipe()
    finally:
        _build.recipe.cache_clear()
    assert sanitized.sanitize and not release.sanitize
    assert sanitized.key != release.key and sanitized.module != release.module


def test_sanitized_without_runtime_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    _runtimes()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update({_build.ENV_SANITIZE: "1", _build.ENV_CACHE: str(tmp_path / "cache")})
    res = subprocess.run(
        [sys.executable, "-c", "import refcore; print(refcore.providers()['native'])"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith("unavailable: REFCORE_NATIVE_SANITIZE=1 loads the native library"), out
    assert "LD_PRELOAD=" in out and "libasan" in out and "detect_leaks=0" in out
    assert not list((tmp_path / "cache").rglob("*.so")), "built although it cannot load"
