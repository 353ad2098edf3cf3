"""The native provider's build, cache and call safety (its kernels' results are test_kernels.py's).

Tests that need a compiled library share the one in the user's cache (built on first use);
tests of first use, rebuilds and failures run in subprocesses with a fresh cache directory
(``REFCORE_CACHE_DIR``), so they see exactly what a new user or a new process sees.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import refcore_native
from refcore_native import _build, _runtime

from refcore import cpu
from refcore.tensors import BFLOAT16


def _library() -> _build.Library:
    try:
        return _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")


def _python(
    code: str, cache: Path, timeout: float = 900, **env: str
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter whose native cache is ``cache``."""
    full_env = {**os.environ, _build.ENV_CACHE: str(cache), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _copy_entry(lib: _build.Library, cache: Path) -> _build.Entry:
    """A private copy of the built cache entry under ``cache`` (no rebuild needed to use it)."""
    dst = cache / "native"
    dst.mkdir(mode=0o700, parents=True)
    os.chmod(cache, 0o700)
    key = _build.recipe().key
    for suffix in (".so", ".json", ".log"):
        shutil.copy2(lib.path.with_suffix(suffix), dst / f"native-{key}{suffix}")
    return _build.Entry(dst, key)


# ---------------------------------------------------------------------------------------------
# discovery, the cache directory


def test_nothing_compiles_at_import_or_discovery(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    res = _python(
        """
        import refcore
        from refcore.provider import discover
        prov = discover()["native"]
        print(len(prov.kernels))
        """,
        cache,
    )
    assert res.returncode == 0, res.stderr
    assert int(res.stdout) > 0
    assert not list(cache.rglob("*.so")), "a library was built at discovery"


def test_cache_dirs_are_created_owner_only(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path / "c"))
    d = _build.native_dir()
    for p in (d, d.parent):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o700


def test_cache_dir_readable_by_others_is_tightened(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "c"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    monkeypatch.setenv(_build.ENV_CACHE, str(root))
    _build.native_dir()
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


@pytest.mark.parametrize("where", ["cache", "ancestor"])
def test_cache_writable_by_others_is_refused(tmp_path: Path, monkeypatch, where: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    root = shared / "c"
    root.mkdir(mode=0o700)
    os.chmod(root if where == "cache" else shared, 0o777)  # no sticky bit
    monkeypatch.setenv(_build.ENV_CACHE, str(root))
    with pytest.raises(_build.BuildError, match="writable by group or others"):
        _build.native_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_cache_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "c"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    monkeypatch.setenv(_build.ENV_CACHE, str(root))
    with pytest.raises(_build.BuildError, match="belongs to uid 65534"):
        _build.native_dir()


def test_cache_symlinked_to_a_shared_dir_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The checks apply to where the path leads, not to the link."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # no sticky bit
    link = tmp_path / "link"
    link.symlink_to(shared)
    monkeypatch.setenv(_build.ENV_CACHE, str(link))
    with pytest.raises(_build.BuildError, match=f"{shared}.*writable by group or others"):
        _build.native_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_cache_under_a_directory_of_another_user_is_refused(tmp_path: Path, monkeypatch) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "c").mkdir(parents=True, mode=0o700)
    os.chmod(theirs, 0o755)
    os.chown(theirs, 65534, 65534)  # they could swap our directory for theirs
    monkeypatch.setenv(_build.ENV_CACHE, str(theirs / "c"))
    with pytest.raises(_build.BuildError, match=f"lies under {theirs}, owned by uid 65534"):
        _build.native_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a file to another user")
def test_library_of_another_user_is_not_loaded(tmp_path: Path) -> None:
    entry = _copy_entry(_library(), tmp_path / "cache")
    assert _build._valid(entry)
    os.chown(entry.so, 65534, 65534)
    assert not _build._valid(entry)


def test_build_publishes_by_atomic_rename(tmp_path: Path, monkeypatch) -> None:
    """The .so and its manifest reach their names only by os.replace from a private build
    directory in the same cache directory (one file system: a rename, never a partial file), the
    .so first: a reader that finds the new manifest finds the complete .so it describes."""
    monkeypatch.setenv(_build.ENV_CACHE, str(tmp_path / "cache"))
    entry = _build.Entry(_build.native_dir(), "k" * 20)
    r = dataclasses.replace(_build.recipe(), key=entry.key)

    def fake_compile(r, tmp: Path):
        so = tmp / "native.so"
        so.write_bytes(b"\x7fELF library bytes")
        return so, ["$ cc ..."], None

    moves: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def replace(src, dst) -> None:
        moves.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(_build, "_compile", fake_compile)
    monkeypatch.setattr(_build.os, "replace", replace)
    _build._build(r, entry)
    final = [dst for _, dst in moves]
    assert final.index(entry.so) < final.index(entry.manifest)
    for src, dst in moves:
        assert dst.parent == entry.dir and src.parent.parent == entry.dir
        assert src.parent.name.startswith("tmp-")
    assert _build._valid(entry)
    assert not list(entry.dir.glob("tmp-*"))


# ---------------------------------------------------------------------------------------------
# build, load, rebuild


def test_build_is_cached_warning_free_and_loadable() -> None:
    lib = _library()
    assert refcore_native.build() == lib.path
    man = json.loads(lib.path.with_suffix(".json").read_text())
    assert man["key"] == _build.recipe().key and man["sha256"] == _build._sha256(lib.path)
    log = lib.path.with_suffix(".log").read_text()
    ours = [
        blk
        for blk in log.split("\n$ ")
        # the entry may have been built from another checkout: match csrc/, not the full path
        if f"/{_build.CSRC.name}/" in blk.split("\n")[0]
        and " -c " in blk.split("\n")[0]
        and "-Wextra" in blk
    ]
    assert len(ours) == len(_build.recipe().sources)
    warned = [blk.split("\n")[0] for blk in ours if "warning:" in blk]
    assert not warned, f"kernel sources compile with warnings: {warned}"


def test_invalid_entries_are_detected(tmp_path: Path) -> None:
    entry = _copy_entry(_library(), tmp_path / "cache")
    assert _build._valid(entry)
    good_so, good_man = entry.so.read_bytes(), entry.manifest.read_text()

    def broken(mutate) -> bool:
        entry.so.write_bytes(good_so)
        entry.manifest.write_text(good_man)
        os.chmod(entry.so, 0o755)
        mutate()
        return not _build._valid(entry)

    assert broken(lambda: entry.so.write_bytes(good_so[:-100]))  # truncated
    assert broken(lambda: entry.so.write_bytes(b"\0" * len(good_so)))  # garbage
    assert broken(lambda: entry.manifest.write_text(good_man[:10]))  # torn manifest
    assert broken(lambda: entry.manifest.write_text(good_man.replace(entry.key, "0" * 20)))
    assert broken(lambda: entry.manifest.unlink())
    assert broken(lambda: os.chmod(entry.so, 0o777))  # others could have written it
    assert not broken(lambda: None)


@pytest.mark.rebuilds
def test_corrupt_entry_is_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entry = _copy_entry(_library(), cache)
    entry.so.write_bytes(b"not an ELF file")
    res = _python(
        """
        import numpy as np
        from refcore_native import _build
        lib = _build.library()
        y = np.empty(3, np.float32)
        x = np.float32([-1.0, 0.0, 2.0])
        lib.lib.rc_silu_f32_portable(lib.ffi.from_buffer(x), lib.ffi.from_buffer(y), 3, 1)
        print(lib.how)
        print(repr(y.tolist()))
        """,
        cache,
    )
    assert res.returncode == 0, res.stderr
    how, values = res.stdout.splitlines()
    assert how.startswith("built in")
    np.testing.assert_allclose(eval(values), [-0.26894142, 0.0, 1.7615942], rtol=1e-6)
    assert _build._valid(entry)


@pytest.mark.rebuilds
def test_concurrent_first_use_builds_once(tmp_path: Path) -> None:
    """4 processes loading the library at once into an empty cache: all succeed, one builds,
    all load the same file (path and SHA-256), and no build directory is left behind."""
    cache = tmp_path / "cache"
    code = textwrap.dedent(
        """
        import hashlib, numpy as np, refcore
        from refcore_native import _build
        lib = _build.library()
        x = np.linspace(-3, 3, 50, dtype=np.float32)
        got = refcore.run("gelu", x, provider="native")
        np.testing.assert_allclose(got, refcore.reference("gelu")(x), rtol=1e-5, atol=1e-6)
        print(lib.how)
        print(lib.path)
        print(hashlib.sha256(lib.path.read_bytes()).hexdigest())
        """
    )
    env = {**os.environ, _build.ENV_CACHE: str(cache)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    lines = [out.strip().splitlines() for out, _ in outs]
    assert sum(ln[0].startswith("built in") for ln in lines) == 1, lines
    assert len({ln[1] for ln in lines}) == 1 and len({ln[2] for ln in lines}) == 1, lines
    path = Path(lines[0][1])
    assert path.parent == (cache / "native").resolve()
    assert _build._sha256(path) == lines[0][2]
    assert _build._valid(_build.Entry(path.parent, _build.recipe().key))
    assert not list((cache / "native").glob("tmp-*")), "a build directory was left behind"


def test_unavailable_without_compiler(tmp_path: Path) -> None:
    res = _python(
        """
        import refcore
        print(refcore.providers()["native"])
        """,
        tmp_path / "cache",
        CC="/nonexistent/bin/cc",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("unavailable: no C compiler: CC='/nonexistent/bin/cc'")


def test_failed_build_is_unavailable_with_compiler_output(tmp_path: Path) -> None:
    cc = tmp_path / "fake-cc"
    cc.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "fake-cc 1.0"; exit 0; }\n'
        'echo "fake-cc: error: boom in $*" >&2\nexit 3\n'
    )
    cc.chmod(0o755)
    cache = tmp_path / "cache"
    res = _python(
        """
        import refcore
        print(refcore.providers()["native"])
        """,
        cache,
        CC=str(cc),
    )
    assert res.returncode == 0, res.stderr
    reason = res.stdout.strip()
    assert reason.startswith(
        "unavailable: native library build failed (fake-cc exited with "
        "status 3: fake-cc: error: boom"
    )
    logs = list((cache / "native").glob("*.log"))
    assert len(logs) == 1 and str(logs[0]) in reason
    assert "fake-cc: error: boom" in logs[0].read_text()
    assert not list(cache.rglob("*.so"))


# ---------------------------------------------------------------------------------------------
# calls: validation before C, writes only inside the output, threads


def _kernel(op: str, level: str = "portable"):
    prov = refcore_native.make_provider()
    return next(
        k for k in prov.kernels if k.op == op and k.isa == level and "_gemm_" not in k.name
    ).fn


F = np.float32
BAD_CALLS = [
    ("gelu", dict(input=np.zeros(4, np.float64)), TypeError, "'input' expected dtype float32"),
    ("gelu", dict(input=[1.0, 2.0]), TypeError, "'input' expected a NumPy array"),
    ("gelu", dict(input=np.zeros(4, F), approximate="exact"), ValueError, "'approximate'"),
    ("silu", dict(input=np.zeros((4, 6), F)[:, ::2]), ValueError, "C-contiguous"),
    (
        "add",
        dict(input=np.zeros((2, 3), F), other=np.zeros((2, 3), BFLOAT16)),
        TypeError,
        "'other' expected dtype float32",
    ),
    (
        "add",
        dict(input=np.zeros((2, 3), F), other=np.zeros((2, 1), F)),
        ValueError,
        "'other' expected a shape equal to input's or a trailing row",
    ),
    ("add", dict(input=np.zeros((2, 3), F), other=np.zeros((4,), F)), ValueError, "broadcast"),
    (
        "layer_norm",
        dict(input=np.zeros((2, 3), F), normalized_shape=(2,)),
        ValueError,
        "'normalized_shape' expected the trailing dims",
    ),
    (
        "layer_norm",
        dict(input=np.zeros((2, 3), F), normalized_shape=(3,), weight=np.zeros(2, F)),
        ValueError,
        "'weight' expected shape (3,)",
    ),
    (
        "layer_norm",
        dict(input=np.zeros((2, 3), F), normalized_shape=(3,), eps=-1.0),
        ValueError,
        "'eps' expected a non-negative value",
    ),
    (
        "rms_norm",
        dict(input=np.zeros((2, 3), F).T, normalized_shape=(2,)),
        ValueError,
        "C-contiguous",
    ),
    ("softmax", dict(input=np.zeros((2, 3), F), dim=0), ValueError, "'dim' expected the last dim"),
    ("log_softmax", dict(input=np.zeros((2, 3), BFLOAT16), dim=5), ValueError, "'dim'"),
    (
        "linear",
        dict(input=np.zeros((17, 4), F), weight=np.zeros((3, 4), F)),
        ValueError,
        "at most 16 rows",
    ),
    (
        "linear",
        dict(input=np.zeros((2, 4), F), weight=np.zeros((3, 5), F)),
        ValueError,
        "'weight' expected shape (N, 4)",
    ),
    (
        "linear",
        dict(input=np.zeros((2, 4), F), weight=np.zeros((3, 4), F), bias=np.zeros(4, F)),
        ValueError,
        "'bias' expected shape (3,)",
    ),
    (
        "linear",
        dict(input=np.zeros((2, 4), F), weight=np.zeros((4, 3), F).T),
        ValueError,
        "'weight' expected a C-contiguous",
    ),
]


@pytest.mark.parametrize(
    ("op", "args", "exc", "match"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_input_rejected_before_the_c_call(monkeypatch, op, args, exc, match) -> None:
    def no_c(name: str):
        raise AssertionError(f"C function {name} reached with bad input")

    monkeypatch.setattr(_runtime, "c_function", no_c)
    with pytest.raises(exc, match=f"^{op} \\(native\\): argument .*" + _escape(match)):
        _kernel(op)(**args)


def _escape(s: str) -> str:
    import re

    return re.escape(s)


GUARD = 64  # elements of sentinel on each side of an output


def _guarded(n: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(whole buffer filled with a sentinel, the n-element output view in its middle)."""
    buf = np.empty(n + 2 * GUARD, dtype)
    buf.view(np.uint8)[:] = 0xA5
    return buf, buf[GUARD : GUARD + n]


def _c_calls(level: str, dt: np.dtype, rng: np.random.Generator):
    """(C name, argument builder) for every C function of ``level`` and dtype."""
    tag = "f32" if dt == np.float32 else "bf16"
    rows, d, n = 3, 37, 3 * 37 + 5  # sizes that fill no vector and no unrolled step exactly
    x = rng.normal(size=n).astype(dt)
    x2 = rng.normal(size=n).astype(dt)
    w = rng.normal(size=d).astype(dt)
    calls = []
    for op in ("gelu", "gelu_tanh", "silu"):
        calls.append((f"rc_{op}_{tag}_{level}", n, lambda p, y: (p(x), p(y), n, 1)))
    calls.append((f"rc_add_{tag}_{level}", n, lambda p, y: (p(x), p(x2), p(y), n, 0.5, 1)))
    calls.append(
        (
            f"rc_add_row_{tag}_{level}",
            rows * d,
            lambda p, y: (p(x), p(w), p(y), rows, d, -1.0, 0, 1),
        )
    )
    calls.append(
        (
            f"rc_layer_norm_{tag}_{level}",
            rows * d,
            lambda p, y: (p(x), p(w), p(w), p(y), rows, d, 1e-5, 1),
        )
    )
    calls.append(
        (f"rc_rms_norm_{tag}_{level}", rows * d, lambda p, y: (p(x), p(w), p(y), rows, d, 1e-5, 1))
    )
    for op in ("softmax", "log_softmax"):
        calls.append((f"rc_{op}_{tag}_{level}", rows * d, lambda p, y: (p(x), p(y), rows, d, 1)))
    nb, L, S, E, Ev = 2, 3, 4, 5, 7  # attention: q (nb, L, E), k (nb, S, E), v (nb, S, Ev)
    offs = np.array([[0, L * E], [0, S * E], [0, S * Ev], [0, 0], [0, L * Ev]], np.int64)
    st = np.array([E, 1, E, 1, Ev, 1, 0, 0, Ev, 1], np.int64)
    calls.append(
        (
            f"rc_scaled_dot_product_attention_{tag}_{level}",
            nb * L * Ev,
            lambda p, y: (
                p(x[:30]),
                p(x[30:70]),
                p(x2[:56]),
                p(x),
                p(y),
                p(offs),
                p(st),
                nb,
                L,
                S,
                E,
                Ev,
                0,
                1,
                0.5,
                1,
            ),
        )
    )
    m, nn, k = 5, 7, 37
    # inputs of their own: x and x2 (116 elements) are shorter than m * k and nn * k (ASan found
    # the kernel reading past them in the sanitized build)
    xl, wl = rng.normal(size=m * k).astype(dt), rng.normal(size=nn * k).astype(dt)
    calls.append(
        (
            f"rc_linear_{tag}_{level}",
            m * nn,
            lambda p, y: (p(xl), p(wl), p(w[:nn]), p(y), m, nn, k, 1),
        )
    )
    return calls


LEVEL_DTYPES = [(lvl, dt) for lvl in ("portable", "avx512") for dt in (np.dtype(F), BFLOAT16)]
LEVEL_DTYPES.append(("avx512_bf16", BFLOAT16))


@pytest.mark.parametrize(("level", "dt"), LEVEL_DTYPES, ids=[f"{a}-{b}" for a, b in LEVEL_DTYPES])
def test_c_writes_only_inside_its_output(level: str, dt: np.dtype) -> None:
    if not cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    lib = _library()
    rng = np.random.default_rng(0)
    names = [n for n in dir(lib.lib) if n.startswith("rc_") and n.endswith("_" + level)]
    calls = [c for c in _c_calls(level, dt, rng) if c[0] in names]
    assert len(calls) == 11, [c[0] for c in calls]
    for name, size, args in calls:
        buf, y = _guarded(size, dt)
        before = buf.copy()
        getattr(lib.lib, name)(*args(lib.ffi.from_buffer, y))
        assert (buf[:GUARD].view(np.uint8) == before[:GUARD].view(np.uint8)).all(), name
        assert (buf[-GUARD:].view(np.uint8) == before[-GUARD:].view(np.uint8)).all(), name
        assert not (y.view(np.uint8) == 0xA5).all(), f"{name} wrote nothing"


def test_parallel_paths_match_the_reference(monkeypatch) -> None:
    """Every call split over threads (the suite's small samples run serially), odd sizes."""
    _library()
    from refcore.registry import default_registry, resolve
    from refcore.testing import assert_close

    monkeypatch.setattr(_runtime, "PARALLEL_MIN_BYTES", 0)
    reg, rng = default_registry(), np.random.default_rng(1)
    for k in refcore_native.make_provider().kernels:
        if k.op not in reg.ops:  # optimizer steps: tests/test_optim.py runs them threaded
            continue
        for dname in sorted(k.dtypes):
            dt = BFLOAT16 if dname == "bfloat16" else np.dtype(F)
            x = rng.normal(size=(37, 301)).astype(dt)
            row = rng.normal(size=301).astype(dt)
            gemm = dict(input=x, weight=x * np.float32(0.05).astype(dt), bias=x[0, :37])
            idx = rng.integers(0, 37, 999)
            nhwc = rng.normal(size=(2, 9, 11, 40)).astype(dt)  # channels-last (2, 40, 9, 11)
            wc = (rng.normal(size=(33, 40, 3, 3)) * 0.05).astype(dt)
            conv = dict(input=nhwc.transpose(0, 3, 1, 2), weight=wc, bias=wc[:, 0, 0, 0].copy(),
                        padding=1)  # fmt: skip
            res = rng.normal(size=(2, 9, 11, 33)).astype(dt).transpose(0, 3, 1, 2)
            corner = rng.uniform(-1, 6, (37, 2))  # roi_align boxes: (x1, y1), then (x2, y2)
            args: dict = {
                "gelu": dict(input=x, approximate="tanh"),
                "silu": dict(input=x),
                "add": dict(input=x, other=row, alpha=0.5),
                "layer_norm": dict(input=x, normalized_shape=(301,), weight=row, bias=row),
                "rms_norm": dict(input=x, normalized_shape=(301,), weight=row),
                "softmax": dict(input=x, dim=-1),
                "log_softmax": dict(input=x, dim=1),
                "linear": dict(
                    input=x[:13], weight=x * np.float32(0.05).astype(dt), bias=x[0, :37]
                ),
                # M = 13 (the decode kernel), a scale per group of 8 of K = 296
                "woq_linear": dict(
                    input=np.ascontiguousarray(x[:13, :296]),
                    weight=rng.integers(-127, 128, (37, 296)).astype(np.int8),
                    scales=rng.uniform(0.001, 0.05, (37, 37)).astype(np.float32),
                    bias=x[0, :37],
                ),
                # M = 13, groups of 32 of K = 288
                "woq_int4_linear": dict(
                    input=np.ascontiguousarray(x[:13, :288]),
                    weight=rng.integers(0, 256, (37, 144)).astype(np.uint8),
                    scales=rng.uniform(0.001, 0.05, (37, 9)).astype(np.float32),
                    mins=rng.uniform(-0.4, 0.0, (37, 9)).astype(np.float32),
                    bias=x[0, :37],
                ),
                "linear_relu": gemm,
                "linear_gelu": dict(gemm, approximate="tanh"),
                "linear_silu": gemm,
                "linear_add": dict(gemm, other=np.ascontiguousarray(x[:, :37])),
                "matmul": dict(input=x.reshape(1, 37, 301), other=gemm["weight"].T.copy()),
                # one head (split by query blocks) and 37 heads (a task per head), strided
                "scaled_dot_product_attention": dict(
                    query=x[None, :, :70], key=x[None, :, 70:140], value=x[None, :, 140:170]
                ),
                "add_relu": dict(input=x, other=row),
                "add_gelu": dict(input=row, other=x, approximate="none"),
                "add_silu": dict(input=x, other=x),
                "add_layer_norm": dict(
                    input=x, other=x, normalized_shape=(301,), weight=row, bias=row
                ),
                "conv2d": conv,
                # 37 boxes over a (2, 40, 9, 11) channels-last map, adaptive grid, aligned
                "roi_align": dict(
                    input=nhwc.transpose(0, 3, 1, 2),
                    boxes=np.column_stack([
                        rng.integers(0, 2, 37), corner, corner + rng.uniform(0.5, 7, (37, 2)),
                    ]).astype(np.float32),
                    output_size=(3, 2),
                    spatial_scale=1.0,
                    sampling_ratio=-1,
                    aligned=True,
                ),
                "conv2d_relu": dict(conv, stride=2),
                "conv2d_add_relu": dict(conv, other=res),
                "embedding": dict(input=idx.reshape(3, -1), weight=x),
                "embedding_bag": dict(input=idx, weight=x, offsets=np.arange(40) * 25, mode="mean"),
                # 40 CSR rows of 25 nonzeros (the last 24) over x's 37 rows: embedding_bag's kernel
                "spmm_reduce": dict(
                    crow_indices=np.minimum(np.arange(41) * 25, 999),
                    col_indices=idx,
                    values=rng.normal(size=idx.size).astype(x.dtype),
                    dense=x,
                    reduce="mean",
                ),
                # its gradient: 37 column blocks' worth of output rows, split over the threads
                "spmm_reduce_backward": dict(
                    grad_output=rng.normal(size=(40, x.shape[1])).astype(x.dtype),
                    crow_indices=np.minimum(np.arange(41) * 25, 999),
                    col_indices=idx,
                    values=rng.normal(size=idx.size).astype(x.dtype),
                    dense=x,
                    reduce="mean",
                ),
                # 999 edges over x's 37 rows into 50 nodes (the last 7 without edges), weighted:
                # one node block per thread, each walking every edge
                "gather_scatter": dict(
                    x=x,
                    src_index=idx,
                    dst_index=np.random.default_rng(2).integers(0, 43, idx.size),
                    edge_weight=np.random.default_rng(3).normal(size=idx.size).astype(x.dtype),
                    dim_size=50,
                    reduce="mean",
                ),
                # its x-gradient (mean: the float32 walk of grad_output / count)
                "gather_scatter_backward": dict(
                    grad_output=rng.normal(size=(50, x.shape[1])).astype(x.dtype),
                    x=x,
                    src_index=idx,
                    dst_index=np.random.default_rng(2).integers(0, 43, idx.size),
                    edge_weight=np.random.default_rng(3).normal(size=idx.size).astype(x.dtype),
                    dim_size=50,
                    reduce="mean",
                ),
                # 40 segments of x's 37 rows repeated 27 times (999 rows), PyG's mean
                "segment_reduce": dict(
                    data=x[idx], reduce="mean", offsets=np.minimum(np.arange(41) * 25, 999),
                    initial=0.0,
                ),
                # 999 rows of 301 added into x's 37 (float32 only)
                "index_add": dict(input=x, dim=0, index=idx, source=x[idx]),
                # int8: 44548 values (three flat chunks); qlinear at M = 37 (the GEMM path)
                "quantize_per_tensor": dict(
                    input=np.repeat(x, 4, axis=1),
                    scale=0.02,
                    zero_point=3,
                    quant_min=0,
                    quant_max=255,
                    dtype="uint8",
                ),
                "dequantize_per_tensor": dict(
                    input=rng.integers(-128, 128, (37, 1204)).astype(np.int8),
                    scale=0.02,
                    zero_point=-3,
                    quant_min=-128,
                    quant_max=127,
                    dtype="int8",
                ),
                "qlinear": dict(
                    input=rng.integers(0, 256, (37, 301)).astype(np.uint8),
                    input_scale=0.03,
                    input_zero_point=131,
                    weight=rng.integers(-128, 128, (37, 301)).astype(np.int8),
                    weight_scales=rng.uniform(0.001, 0.02, 37).astype(np.float32),
                    bias=rng.normal(size=37).astype(np.float32),
                ),
                # M = 37 rows quantized per call (the GEMM path), in the kernel's dtype
                "dynamic_qlinear": dict(
                    input=x,
                    weight=rng.integers(-128, 128, (37, 301)).astype(np.int8),
                    weight_scales=rng.uniform(0.001, 0.02, 37).astype(np.float32),
                    bias=rng.normal(size=37).astype(np.float32),
                ),
                # channels-last (2, 40, 9, 11), 33 output channels (a tail panel), padding
                "qconv2d": dict(
                    input=rng.integers(0, 256, (2, 9, 11, 40))
                    .astype(np.uint8)
                    .transpose(0, 3, 1, 2),
                    input_scale=0.03,
                    input_zero_point=131,
                    weight=rng.integers(-128, 128, (33, 40, 3, 3)).astype(np.int8),
                    weight_scales=rng.uniform(0.001, 0.02, 33).astype(np.float32),
                    bias=rng.normal(size=33).astype(np.float32),
                    padding=1,
                ),
            }
            q = dict(output_scale=0.05, output_zero_point=7, quant_min=0, quant_max=255,
                     dtype="uint8")  # fmt: skip
            res8 = rng.normal(size=(2, 9, 11, 33)).astype(np.float32).transpose(0, 3, 1, 2)
            args |= {  # the fused int8 ops: the same calls with their epilogues
                "qlinear_relu": args["qlinear"],
                "qlinear_gelu": dict(args["qlinear"], approximate="tanh"),
                "qlinear_relu_quantize": dict(args["qlinear"], **q),
                "qlinear_gelu_quantize": dict(args["qlinear"], **q, approximate="none"),
                "qconv2d_relu": args["qconv2d"],
                "qconv2d_add_relu": dict(args["qconv2d"], other=res8),
                "qconv2d_relu_quantize": dict(args["qconv2d"], **q),
            }
            chan = nhwc[0, 0, 0].reshape(1, 40, 1, 1)  # one value per channel of (2, 40, 9, 11)
            args |= {  # channels-last maps; NCHW copies below
                "group_norm": dict(input=nhwc.transpose(0, 3, 1, 2), num_groups=8,
                                   weight=nhwc[0, 0, 1].copy(), bias=nhwc[0, 0, 2].copy()),
                "channel_affine": dict(input=nhwc.transpose(0, 3, 1, 2), scale=chan, shift=chan),
            }  # fmt: skip
            args["group_norm_silu"] = args["group_norm"]
            args = args[k.op]
            more = []
            if k.op == "spmm_reduce":
                more = [dict(args, reduce=r) for r in ("sum", "amax", "amin")]
            if k.op == "spmm_reduce_backward":
                more = [dict(args, reduce=r) for r in ("sum", "amax", "amin")]
            if k.op == "gather_scatter":
                more = [dict(args, reduce=r) for r in ("sum", "amax", "amin")]
                more += [dict(args, edge_weight=None, reduce=r) for r in ("sum", "mean", "amax")]
            if k.op == "gather_scatter_backward":
                more = [dict(args, edge_weight=None, reduce="sum"), dict(args, reduce="sum")]
            if k.op == "segment_reduce":
                more = [dict(args, reduce=r, initial=None) for r in ("sum", "max", "min")]
            if k.op == "roi_align":  # the NCHW map, a fixed 2x2 grid, unaligned
                more = [dict(args, input=np.ascontiguousarray(args["input"]), sampling_ratio=2,
                             aligned=False)]  # fmt: skip
            if k.op in ("group_norm", "group_norm_silu", "channel_affine"):
                more = [dict(args, input=np.ascontiguousarray(args["input"]))]
            if k.op == "scaled_dot_product_attention":
                h = x.reshape(37, 7, 43)
                kt = x.reshape(37, 43, 7).swapaxes(1, 2)  # (37, 7, 43), features strided
                more = [dict(query=h, key=kt, value=h, is_causal=True)]
            spec = reg.op(k.op)
            for a in [args, *more]:
                want = resolve(spec.reference)(**a)
                assert_close(k.fn(**a), want, spec.tolerance_for(dname), f"{k.name} {dname}")


def test_variants_registered_per_allowed_level(monkeypatch) -> None:
    monkeypatch.setenv(cpu.ENV_CAP, "portable")
    assert {k.isa for k in refcore_native.make_provider().kernels} == {"portable"}
    monkeypatch.delenv(cpu.ENV_CAP)
    kernels = refcore_native.make_provider().kernels
    allowed = {lvl for lvl in _build.LEVEL_FLAGS if cpu.has(lvl)}
    # every level up to avx512_bf16 has kernels; amx only for the ops that use tiles
    assert allowed - {"amx"} <= {k.isa for k in kernels} <= allowed
    for op in {k.op for k in kernels}:
        ranked = [
            k.isa for k in sorted((k for k in kernels if k.op == op), key=lambda k: -k.priority)
        ]
        assert ranked == sorted(ranked, key=list(cpu.LEVELS).index, reverse=True), op


@pytest.mark.parametrize("first", ["torch", "native"])
def test_one_openmp_pool_with_torch(first: str) -> None:
    """Native parallel regions share torch's libgomp (whichever loads first) and leave torch's
    timing alone; the numbers are printed (run with -s to see them)."""
    _library()
    res = _python(
        f"""
        import statistics, time, numpy as np, refcore
        x = np.random.default_rng(0).normal(size=(1024, 1024)).astype(np.float32)
        if {first!r} == "native":
            refcore.run("gelu", x, provider="native")
        import torch
        torch.set_num_threads(2)
        a = torch.randn(512, 512)

        def torch_ms():
            for _ in range(3):
                torch.mm(a, a)
            ts = []
            for _ in range(11):
                t0 = time.perf_counter(); torch.mm(a, a); ts.append(time.perf_counter() - t0)
            return 1e3 * statistics.median(ts)

        before = torch_ms()
        for _ in range(5):  # parallel native calls (2 threads, above the serial threshold)
            refcore.run("gelu", x, provider="native")
            refcore.run("softmax", x, -1, provider="native")
        after = torch_ms()
        gomp = {{ln.split()[-1] for ln in open("/proc/self/maps") if "libgomp" in ln}}
        print(before, after, len(gomp), *gomp)
        """,
        Path(_build.cache_root()),
    )
    assert res.returncode == 0, res.stderr
    before, after, n_gomp, *paths = res.stdout.split()
    print(
        f"\n{first} first: torch.mm 512^2 {float(before):.2f} ms before native calls, "
        f"{float(after):.2f} ms after; libgomp loaded: {paths}"
    )
    assert int(n_gomp) == 1, f"two OpenMP runtimes in one process: {paths}"
    assert float(after) < 3 * float(before) + 1.0, "torch slowed down after native calls"
