"""``python -m refcore launch``: start a script pinned to cores, with every thread setting agreeing.

What a CPU extension's launcher does, for one process or N instances over disjoint cores:

- **cores**: each instance gets its own cores (``sched_setaffinity`` in the child before it
  starts, so every thread it makes inherits them); under ``numactl``, when installed and the
  machine has more than one NUMA node, also its node's memory;
- **threads**: ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` all equal the
  instance's core count, so torch and refcore's providers (`refcore.runtime`: one count, torch's)
  run as many threads as there are cores, and ``GOMP_CPU_AFFINITY`` binds OpenMP thread i to core i;
- **idle OpenMP threads**: ``--omp-wait`` sets libgomp's wait policy, which a running process
  cannot change. libgomp's default spins for a while and then sleeps; on this project's 2-vCPU
  machines the first parallel op after ~50 ms of idle then stalls ~10 ms (``python -m refcore
  bench threads`` measures it), ``passive`` (sleep at once) removes the stall and costs a
  wake-up per parallel region. The default, ``auto``, leaves libgomp's own policy (the best for
  back-to-back work, a server's steady state); pick ``passive`` for bursty serving;
- **allocator**: jemalloc or tcmalloc through ``LD_PRELOAD`` when installed (``--allocator auto``
  takes what it finds and says so when it finds nothing; naming one that is missing is an error);
- **throughput mode** (``--instances N``): N instances start together, each with
  ``REFCORE_INSTANCE`` / ``REFCORE_INSTANCES`` set so a script can take its share of the work;
  their output comes back line by line prefixed ``[i]`` (and into ``--log-dir`` files when
  given), and a script's `report` lines are summed over instances at the end. `barrier` lets the
  instances start their timed part together.

``--dry-run`` prints the plan (cores, environment, command) and starts nothing.

Example:
    >>> [i.cores for i in plan(Options(instances=2), cores=[0, 1, 2, 3], environ={})]
    [(0, 1), (2, 3)]
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

WAITS = ("auto", "passive", "active")
ALLOCATORS = ("auto", "jemalloc", "tcmalloc", "none")
#: the shared objects each allocator ships as (Debian: libjemalloc2, libtcmalloc-minimal4)
ALLOCATOR_LIBS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc.so"),
}
_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
#: a line a script prints through `report`; the launcher sums the values per unit
_REPORT = re.compile(r"^\[refcore-launch\] report ([0-9.eE+-]+) (\S.*)$")


@dataclasses.dataclass(frozen=True)
class Options:
    instances: int = 1
    cores_per_instance: int | None = None  #: default: the available cores split evenly
    cores: tuple[int, ...] | None = None  #: default: the cores this process may run on
    omp_wait: str = "auto"
    allocator: str = "auto"


@dataclasses.dataclass(frozen=True)
class Instance:
    index: int
    cores: tuple[int, ...]
    env: dict[str, str]  #: the variables set or changed for this instance
    prefix: tuple[str, ...]  #: numactl ... when it binds memory, else empty
    notes: tuple[str, ...]


def parse_cores(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)`` (the Linux cpulist format)."""
    out: list[int] = []
    for part in filter(None, text.strip().split(",")):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"launch: argument '--cores' expected a list like 0-3,8; got {text!r}")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(dict.fromkeys(out))


def numa_nodes() -> dict[int, frozenset[int]]:
    """NUMA node -> its cores, from sysfs (empty when sysfs does not say)."""
    nodes = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        node = int(Path(path).parent.name[4:])
        nodes[node] = frozenset(parse_cores(Path(path).read_text()))
    return nodes


def find_allocator(name: str) -> str | None:
    """The path of allocator ``name``'s shared object, or None when it is not installed."""
    dirs = [*_LIB_DIRS, os.path.join(sys.prefix, "lib")]
    for lib in ALLOCATOR_LIBS[name]:
        for d in dirs:
            if os.path.exists(os.path.join(d, lib)):
                return os.path.join(d, lib)
    return None


def _allocator_env(choice: str, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    names = ("jemalloc", "tcmalloc") if choice == "auto" else (choice,)
    if choice == "none":
        return {}, "allocator: the system's malloc (--allocator none)"
    for name in names:
        path = find_allocator(name)
        if path is None:
            continue
        preload = " ".join(filter(None, [environ.get("LD_PRELOAD", ""), path]))
        env = {"LD_PRELOAD": preload}
        if name == "jemalloc" and "MALLOC_CONF" not in environ:
            env["MALLOC_CONF"] = "background_thread:true,dirty_decay_ms:10000,muzzy_decay_ms:10000"
        return env, f"allocator: {name} ({path})"
    if choice != "auto":
        libs = " or ".join(ALLOCATOR_LIBS[choice])
        raise FileNotFoundError(
            f"launch: argument '--allocator' expected an installed {choice} ({libs} in "
            f"{', '.join(_LIB_DIRS)}); got none (Debian: apt install "
            f"{'libjemalloc2' if choice == 'jemalloc' else 'libtcmalloc-minimal4'})"
        )
    return {}, "allocator: the system's malloc (neither jemalloc nor tcmalloc is installed)"


def plan(
    opts: Options, cores: Sequence[int] | None = None, environ: Mapping[str, str] | None = None
) -> list[Instance]:
    """Which cores, variables and prefix each instance gets (nothing is started)."""
    environ = os.environ if environ is None else environ
    avail = tuple(sorted(os.sched_getaffinity(0))) if cores is None else tuple(cores)
    use = avail if opts.cores is None else opts.cores
    missing = sorted(set(use) - set(avail))
    if missing:
        raise ValueError(f"launch: argument '--cores' expected cores of {avail}; got {missing}")
    if opts.omp_wait not in WAITS:
        raise ValueError(
            f"launch: argument '--omp-wait' expected one of {WAITS}; got {opts.omp_wait!r}"
        )
    if opts.allocator not in ALLOCATORS:
        raise ValueError(
            f"launch: argument '--allocator' expected one of {ALLOCATORS}; got {opts.allocator!r}"
        )
    n = opts.instances
    if not isinstance(n, int) or n < 1 or n > len(use):
        raise ValueError(
            f"launch: argument '--instances' expected 1..{len(use)} (a core each); got {n}"
        )
    per = opts.cores_per_instance or len(use) // n
    if per < 1 or per * n > len(use):
        raise ValueError(
            f"launch: argument '--cores-per-instance' expected 1..{len(use) // n} "
            f"({n} instances on {len(use)} cores); got {per}"
        )
    alloc_env, alloc_note = _allocator_env(opts.allocator, environ)
    nodes = numa_nodes()
    numactl = shutil.which("numactl")
    out = []
    for i in range(n):
        mine = use[i * per : (i + 1) * per]
        env = {
            "OMP_NUM_THREADS": str(per),
            "MKL_NUM_THREADS": str(per),
            "NUMBA_NUM_THREADS": str(per),
            "GOMP_CPU_AFFINITY": ",".join(map(str, mine)),
            "REFCORE_INSTANCE": str(i),
            "REFCORE_INSTANCES": str(n),
            **alloc_env,
        }
        if opts.omp_wait != "auto":
            env["OMP_WAIT_POLICY"] = opts.omp_wait.upper()
        notes = [alloc_note]
        prefix: tuple[str, ...] = ()
        home = [k for k, cs in nodes.items() if set(mine) <= cs]
        if len(nodes) > 1 and home and numactl:
            prefix = (numactl, f"--cpunodebind={home[0]}", f"--membind={home[0]}")
        elif len(nodes) > 1:
            why = "numactl not installed" if not numactl else "its cores span NUMA nodes"
            notes.append(f"memory: not bound to a NUMA node ({why})")
        else:
            notes.append(
                f"memory: one NUMA node ({len(nodes) or 'sysfs says no'}), nothing to bind"
            )
        out.append(Instance(i, tuple(mine), env, prefix, tuple(notes)))
    return out


def command(program: Sequence[str], module: bool = False) -> list[str]:
    """The argv to run: ``python script.py ...``, ``python -m module ...`` or a program."""
    if not program:
        raise ValueError("launch: expected a script (script.py args...), -m module, or a program")
    if module:
        return [sys.executable, "-m", *program]
    if program[0].endswith(".py"):
        if not os.path.isfile(program[0]):
            raise FileNotFoundError(f"launch: script {program[0]!r} does not exist")
        return [sys.executable, *program]
    if shutil.which(program[0]) is None:
        raise FileNotFoundError(f"launch: program {program[0]!r} is not a file or on PATH")
    return list(program)


def describe(instances: Sequence[Instance], command: Sequence[str]) -> str:
    """What `--dry-run` prints: per instance its cores, notes and an equivalent shell line."""
    lines = []
    for inst in instances:
        lines.append(f"instance {inst.index}: cores {','.join(map(str, inst.cores))} "
                     f"({len(inst.cores)} threads)")  # fmt: skip
        lines.extend(f"  {note}" for note in inst.notes)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in inst.env.items())
        cpus = ",".join(map(str, inst.cores))
        cmd = shlex.join([*inst.prefix, "taskset", "-c", cpus, *command])
        lines.append(f"  {env} {cmd}")
    return "\n".join(lines)


def _pipe(index: int, stream, log, totals: dict[str, float], many: bool, lock) -> None:
    for raw in stream:
        line = raw.rstrip("\n")
        m = _REPORT.match(line)
        with lock:
            if m:
                totals[m.group(2)] = totals.get(m.group(2), 0.0) + float(m.group(1))
            if log is not None:
                log.write(raw)
            print(f"[{index}] {line}" if many else line, flush=True)


def run(instances: Sequence[Instance], command: Sequence[str], log_dir: str | None = None) -> int:
    """Start every instance, relay their output, wait; the worst return code (0 when all pass)."""
    many = len(instances) > 1
    barrier = tempfile.mkdtemp(prefix="refcore-launch-")
    totals: dict[str, float] = {}
    lock = threading.Lock()
    procs, pumps, logs = [], [], []
    t0 = time.perf_counter()
    try:
        for inst in instances:
            env = {**os.environ, **inst.env, "REFCORE_LAUNCH_BARRIER": barrier}
            log = None
            if log_dir is not None:
                os.makedirs(log_dir, exist_ok=True)
                log = open(os.path.join(log_dir, f"instance_{inst.index}.log"), "w")
                logs.append(log)
            cores = set(inst.cores)
            p = subprocess.Popen(
                [*inst.prefix, *command], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, bufsize=1,
                preexec_fn=lambda cores=cores: os.sched_setaffinity(0, cores),
            )  # fmt: skip
            procs.append(p)
            t = threading.Thread(target=_pipe, args=(inst.index, p.stdout, log, totals, many, lock))
            t.start()
            pumps.append(t)
        codes = [p.wait() for p in procs]
    except BaseException:  # Ctrl-C or a failed start: no instance outlives the launcher
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        raise
    finally:
        for t in pumps:
            t.join()
        for log in logs:
            log.close()
        shutil.rmtree(barrier, ignore_errors=True)
    wall = time.perf_counter() - t0
    summary = ", ".join(f"[{i}] exit {c}" for i, c in enumerate(codes))
    print(f"[refcore-launch] {len(codes)} instance(s) in {wall:.1f} s: {summary}", flush=True)
    for unit, total in totals.items():
        print(f"[refcore-launch] total over instances: {total:.6g} {unit}", flush=True)
    return max(codes, key=abs)


def report(value: float, unit: str) -> None:
    """Print a figure the launcher sums over instances (``report(41.5, "sentences/s")``)."""
    print(f"[refcore-launch] report {float(value):.9g} {unit}", flush=True)


def barrier(timeout: float = 600.0) -> None:
    """Wait until every instance of this launch reached here (no-op outside `launch`).

    Instances load their models at different speeds; timing only after the barrier measures them
    running together.
    """
    where, n = os.environ.get("REFCORE_LAUNCH_BARRIER"), int(os.environ.get("REFCORE_INSTANCES", 1))
    if not where or n == 1:
        return
    Path(where, f"ready_{os.environ.get('REFCORE_INSTANCE', '0')}").touch()
    deadline = time.monotonic() + timeout
    while len(glob.glob(os.path.join(where, "ready_*"))) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"refcore.launch.barrier: {n} instances did not all arrive in {timeout} s"
            )
        time.sleep(0.01)
