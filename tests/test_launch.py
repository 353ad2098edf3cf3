"""python -m refcore launch: the plan (cores, thread variables, allocator, NUMA) and real runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from refcore import launch

CORES = (0, 1, 2, 3)


def test_instances_get_disjoint_cores_and_matching_thread_counts():
    plan = launch.plan(launch.Options(instances=2), cores=CORES, environ={})
    assert [i.cores for i in plan] == [(0, 1), (2, 3)]
    for i in plan:
        n = str(len(i.cores))
        assert (
            i.env["OMP_NUM_THREADS"] == i.env["MKL_NUM_THREADS"] == i.env["NUMBA_NUM_THREADS"] == n
        )
        assert i.env["GOMP_CPU_AFFINITY"] == ",".join(map(str, i.cores))
        assert (i.env["REFCORE_INSTANCE"], i.env["REFCORE_INSTANCES"]) == (str(i.index), "2")
        assert "OMP_WAIT_POLICY" not in i.env  # auto: libgomp's own policy


def test_cores_per_instance_and_an_explicit_core_list():
    plan = launch.plan(
        launch.Options(instances=2, cores_per_instance=1, cores=(3, 1, 2)), cores=CORES
    )
    assert [i.cores for i in plan] == [(3,), (1,)]
    one = launch.plan(launch.Options(omp_wait="passive"), cores=CORES, environ={})
    assert one[0].cores == CORES and one[0].env["OMP_WAIT_POLICY"] == "PASSIVE"


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        (launch.Options(instances=5), r"'--instances' expected 1\.\.4"),
        (launch.Options(instances=0), r"'--instances' expected"),
        (
            launch.Options(instances=2, cores_per_instance=3),
            r"'--cores-per-instance' expected 1\.\.2",
        ),
        (launch.Options(cores=(0, 9)), r"'--cores' expected cores of \(0, 1, 2, 3\); got \[9\]"),
        (launch.Options(omp_wait="sometimes"), r"'--omp-wait' expected one of"),
        (launch.Options(allocator="mimalloc"), r"'--allocator' expected one of"),
    ],
)
def test_bad_options_say_which_and_what_was_expected(opts, match):
    with pytest.raises(ValueError, match=match):
        launch.plan(opts, cores=CORES, environ={})


def test_parse_cores():
    assert launch.parse_cores("0-2,5,1") == (0, 1, 2, 5)
    with pytest.raises(ValueError, match=r"'--cores' expected a list like 0-3,8; got 'a-b'"):
        launch.parse_cores("a-b")


def test_allocator_is_preloaded_when_found_and_required_only_when_named(monkeypatch, tmp_path):
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setattr(
        launch, "find_allocator", lambda name: str(lib) if name == "jemalloc" else None
    )
    (i,) = launch.plan(launch.Options(), cores=CORES, environ={"LD_PRELOAD": "/x/libfoo.so"})
    assert i.env["LD_PRELOAD"] == f"/x/libfoo.so {lib}" and "MALLOC_CONF" in i.env
    assert f"allocator: jemalloc ({lib})" in i.notes
    with pytest.raises(FileNotFoundError, match=r"'--allocator' expected an installed tcmalloc"):
        launch.plan(launch.Options(allocator="tcmalloc"), cores=CORES, environ={})
    monkeypatch.setattr(launch, "find_allocator", lambda name: None)
    (i,) = launch.plan(launch.Options(), cores=CORES, environ={})
    assert "LD_PRELOAD" not in i.env and "neither jemalloc nor tcmalloc" in i.notes[0]
    (i,) = launch.plan(launch.Options(allocator="none"), cores=CORES, environ={})
    assert "LD_PRELOAD" not in i.env


def test_find_allocator_looks_for_the_shared_objects_it_names(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "_LIB_DIRS", (str(tmp_path),))
    assert launch.find_allocator("tcmalloc") is None
    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    assert launch.find_allocator("tcmalloc") == str(tmp_path / "libtcmalloc_minimal.so.4")


def test_numactl_binds_memory_only_with_several_nodes_and_numactl(monkeypatch):
    monkeypatch.setattr(launch, "numa_nodes", lambda: {0: frozenset({0, 1}), 1: frozenset({2, 3})})
    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/numactl")
    plan = launch.plan(launch.Options(instances=2), cores=CORES, environ={})
    assert [i.prefix[1:] for i in plan] == [
        ("--cpunodebind=0", "--membind=0"),
        ("--cpunodebind=1", "--membind=1"),
    ]
    (spans,) = launch.plan(launch.Options(), cores=CORES, environ={})
    assert spans.prefix == () and any("span NUMA nodes" in n for n in spans.notes)
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    plan = launch.plan(launch.Options(instances=2), cores=CORES, environ={})
    assert all(i.prefix == () and any("numactl not installed" in n for n in i.notes) for i in plan)


def test_command_forms(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    assert launch.command([str(script), "-x"]) == [sys.executable, str(script), "-x"]
    assert launch.command(["pkg.mod", "--y"], module=True) == [
        sys.executable,
        "-m",
        "pkg.mod",
        "--y",
    ]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        launch.command([str(tmp_path / "missing.py")])
    with pytest.raises(ValueError, match="expected a script"):
        launch.command([])


SCRIPT = textwrap.dedent(
    """
    import os, sys
    from refcore import launch
    launch.barrier(timeout=120)
    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    print("instance", os.environ["REFCORE_INSTANCE"], "cores", cores,
          "omp", os.environ["OMP_NUM_THREADS"], "args", *sys.argv[1:])
    launch.report(1.5, "items/s")
    sys.exit(int(os.environ["REFCORE_INSTANCE"]) * int(sys.argv[1]))
    """
)


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "refcore", "launch", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)  # fmt: skip


def test_launch_runs_instances_pinned_and_sums_their_reports(tmp_path):
    avail = sorted(os.sched_getaffinity(0))
    n = min(2, len(avail))
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    logs = tmp_path / "logs"
    out = _cli("--instances", str(n), "--log-dir", str(logs), str(script), "0")
    assert out.returncode == 0, out.stderr + out.stdout
    lines = [ln for ln in out.stdout.splitlines() if "instance" in ln and "cores" in ln]
    seen = {}
    for ln in lines:
        words = ln.split()
        seen[words[words.index("instance") + 1]] = words[words.index("cores") + 1]
    per = len(avail) // n
    assert seen == {str(i): ",".join(map(str, avail[i * per : (i + 1) * per])) for i in range(n)}
    assert f"total over instances: {1.5 * n:g} items/s" in out.stdout
    for i in range(n):
        assert f"instance {i} cores" in (logs / f"instance_{i}.log").read_text()


def test_launch_returns_the_failing_instances_code(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a second instance cannot have its own")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = _cli("--instances", "2", str(script), "3")  # instance 1 exits 1 * 3
    assert out.returncode == 3 and "[1] exit 3" in out.stdout and "[0] exit 0" in out.stdout


def test_dry_run_starts_nothing_and_bad_input_is_a_clear_error(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w')\n")
    out = _cli("--dry-run", "--omp-wait", "passive", str(script))
    assert out.returncode == 0 and not marker.exists()
    assert "OMP_WAIT_POLICY=PASSIVE" in out.stdout and "taskset -c" in out.stdout
    bad = _cli("--instances", str(len(os.sched_getaffinity(0)) + 1), str(script))
    assert bad.returncode == 2 and "'--instances' expected" in bad.stderr and not marker.exists()
    missing = _cli(str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_module_examples_hold():
    import doctest

    from refcore import runtime

    for mod in (launch, runtime):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_bench_threads_probe_times_every_gap():
    pytest.importorskip("torch")
    from refcore import bench_threads

    befores = ["torch"] + [p for p in ("native", "numba") if _available(p)]
    for before in befores:
        us = bench_threads.probe(before, repeat=2, threads=1)
        assert sorted(us) == sorted(f"{g:g}" for g in bench_threads.GAPS_MS)
        assert all(0 < v < 5e6 for v in us.values()), (before, us)
    assert [r[:2] for r in bench_threads.table([bench_threads.Row("p", "torch", us)])[1:]] == [
        ["p", "torch"]
    ]


def _available(provider):
    import refcore

    return refcore.providers()[provider].available


def test_throughput_script_reports_a_rate(capsys):
    pytest.importorskip("transformers")
    from refcore.models import throughput

    assert throughput.main(["--seconds", "0", "--batch", "1", "--seq", "8", "--eager"]) == 0
    out = capsys.readouterr().out
    assert "MiniLM b1 s8 float32 eager" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("[refcore-launch] report")]
    assert float(line.split()[2]) > 0 and line.endswith("sentences/s")


def test_the_readmes_dry_run_command_works_as_written():
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("python -m refcore launch --dry")]
    args = line.split("#")[0].split()[3:]
    out = _cli(*args[1:])
    if len(os.sched_getaffinity(0)) < 2:  # two instances need two cores: a clear error then
        assert out.returncode == 2 and "'--instances' expected 1..1" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert "instance 1: cores" in out.stdout and "refcore.models.throughput" in out.stdout
