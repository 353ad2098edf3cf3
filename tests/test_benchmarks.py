"""Benchmarks run (not how fast: that is for asv and `python -m refcore bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from refcore import bench
from refcore.__main__ import main
from refcore.registry import default_registry

ROOT = Path(__file__).resolve().parents[1]


def test_every_benchmark_shape_draws_valid_inputs() -> None:
    """Each declared shape binds and passes its op's checks (small dims substituted for speed)."""
    import refcore
    from refcore.call import bind
    from refcore.sampling import draw_bench

    reg = default_registry()
    for op, shapes in reg.benchmarks.items():
        for b in shapes:
            small = type(b)(**{**b.__dict__, "dims": tuple((k, min(v, 64)) for k, v in b.dims)})
            sample = draw_bench(reg.op(op), small, reg.op(op).dtypes[0])
            bind(reg.op(op), (), sample.args)
            assert refcore.run(op, provider="reference", **sample.args) is not None


def test_bench_ops_measures_torch_and_providers(tmp_path) -> None:
    rows = bench.bench_ops(ops=["relu"], dtypes=["float32"], repeat=1)
    assert rows and all(r.torch_us > 0 for r in rows)
    assert {r.shape for r in rows} == {b.label for b in default_registry().benchmarks["relu"]}
    cells = bench.table(rows, None)
    assert cells[0][:4] == ["op", "shape", "dtype", "torch us"] and len(cells) == len(rows) + 1


def test_cli_writes_json_and_plot(tmp_path, capsys) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    md = tmp_path / "r.md"
    argv = ["bench", "ops", "--op", "mul", "--dtype", "bfloat16", "--repeat", "1", "--no-probe"]
    code = main([*argv, "--json", str(out), "--plot", str(png), "--markdown", str(md)])
    assert code == 0
    assert "| mul |" in md.read_text() and "threads" in md.read_text()
    data = json.loads(out.read_text())
    assert data["rows"][0]["op"] == "mul" and data["meta"]["threads"] == bench.THREADS
    assert png.stat().st_size > 1000
    assert "mul" in capsys.readouterr().out


def test_unknown_op_or_provider() -> None:
    with pytest.raises(ValueError, match="no benchmark shapes for op 'nope'"):
        bench.bench_ops(ops=["nope"])
    with pytest.raises(ValueError, match="unknown providers"):
        bench.bench_ops(ops=["relu"], providers=["nope"])


def test_asv_suite_runs_one_case_per_provider() -> None:
    sys.path.insert(0, str(ROOT / "asv_bench"))
    try:
        from benchmarks.ops import TimeOps
    finally:
        sys.path.pop(0)
    shapes, provs, _ = TimeOps.params
    shape = next(s for s in shapes if s.startswith("relu:") and "128x768" in s)
    for p in provs:
        t = TimeOps()
        try:
            t.setup(shape, p, "float32")
        except NotImplementedError:
            assert p != "torch"
            continue
        t.time_op(shape, p, "float32")


def test_build_runs_each_providers_hook_and_reports_failures(capsys) -> None:
    from refcore.__main__ import _build
    from refcore.provider import Provider, using_providers

    def broken(force: bool) -> str:
        raise RuntimeError("no compiler")

    ok = Provider(name="ok", build=lambda force: f"built (force={force})")
    bad = Provider(name="bad", build=broken)
    with using_providers(ok):
        assert _build(True) == 0
    assert "ok: built (force=True)" in capsys.readouterr().out
    with using_providers(ok, bad):
        assert _build(False) == 1
    assert "bad build failed: no compiler" in capsys.readouterr().err
    with using_providers():
        assert _build(False) == 1  # nothing to build is not a success


def test_bench_memory_runs_with_tiny_counts(tmp_path, capsys, monkeypatch) -> None:
    from refcore import bench_memory

    monkeypatch.setattr(bench_memory, "SEEDS", 1)  # one draw per op and dtype: a fast warm-up
    out = tmp_path / "m.json"
    argv = ["bench", "memory", "--calls", "40", "--provider", "reference", "--json", str(out)]
    assert main(argv) in (0, 1)  # 1: over budget, which 40 calls cannot tell apart from noise
    row = json.loads(out.read_text())["rows"][0]
    assert row["provider"] == "reference" and row["calls"] == 40 and len(row["checkpoints"]) == 4
    assert row["distinct"] > 5 and row["ops"] > 5 and row["us_per_call"] > 0
    assert "RSS growth over 40 calls" in capsys.readouterr().out


def test_bench_memory_rejects_unknown_provider() -> None:
    from refcore import bench_memory

    with pytest.raises(ValueError, match="unknown or unavailable providers"):
        bench_memory.memory_rows(["nope"], calls=4)
