"""Run `refcore.fuzz` calls per kernel in worker processes; count outcomes; report failures.

Each kernel is fuzzed alone: the worker puts it in a provider of its own, named as its real
provider, so ``refcore.run(op, provider=...)`` runs that kernel or declines. Workers are separate
Python processes (``python -m refcore.fuzz_run``) fed batches of call indices over a pipe; each
reports one line per call. A worker that dies mid-batch records a ``crash`` for the call it was
running (its exit status and the tail of its stderr, where `faulthandler` prints the Python stack);
one silent for ``timeout`` seconds on a call records a ``hang`` and is killed. Either way a fresh
worker carries on with the next call. Calls within a worker share its memos, so a result that
depends on earlier calls shows up; each failure is replayed alone in a fresh worker to say whether
it does.

Call ``i`` of a run with seed ``s`` draws from seed ``s * 2**32 + i``; ``python -m refcore fuzz
--replay native/layer_norm_avx2@<seed>`` reruns one call in-process.

Example:
    >>> t = Tally("native", "relu", "relu_avx2")
    >>> t.add("raised:TypeError"); t.add("ok"); t.raised
    Counter({'TypeError': 1})
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

OUTCOMES = ("ok", "raised", "declined", "disputed", "wrong", "crash", "hang")
FAILURES = ("wrong", "crash", "hang")


@dataclass
class Tally:
    """Outcome counts of one kernel, and its first failing calls."""

    provider: str
    op: str
    kernel: str
    calls: int = 0
    ok: int = 0
    declined: int = 0
    disputed: int = 0  # off the reference where torch is as far off (`refcore.fuzz._arbitrate`)
    wrong: int = 0
    crash: int = 0
    hang: int = 0
    generator_error: int = 0  # calls refcore.fuzz failed to draw (its bug, not the kernel's)
    cpu_s: float = 0.0  # worker CPU time of the completed batches
    raised: Counter = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)
    disputes: list[dict[str, Any]] = field(default_factory=list)

    def add(self, outcome: str, seed: int | None = None, detail: str = "", desc: str = "") -> None:
        self.calls += 1
        kind, _, exc = outcome.partition(":")
        if kind == "raised":
            self.raised[exc] += 1
        else:
            setattr(self, kind, getattr(self, kind) + 1)
        if (kind in FAILURES or kind == "generator_error") and len(self.failures) < 5:
            self.failures.append({"outcome": kind, "seed": seed, "detail": detail, "call": desc})
        if kind == "disputed" and len(self.disputes) < 5:
            self.disputes.append({"seed": seed, "detail": detail, "call": desc})

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.kernel}"

    def as_json(self) -> dict[str, Any]:
        keys = ("provider", "op", "kernel", "calls", "ok", "declined", "disputed", "disputes")
        d = {k: getattr(self, k) for k in keys}
        d.update(cpu_s=round(self.cpu_s, 2), generator_error=self.generator_error)
        d.update(raised=dict(self.raised), failures=self.failures)
        d.update({k: getattr(self, k) for k in FAILURES})
        return d


def call_seed(seed: int, i: int) -> int:
    return seed * 2**32 + i


# ----------------------------------------------------------------------------------- worker side


def _scoped(provider: str, op: str, kernel: str, factory: str | None):
    """A provider named ``provider`` holding only ``op``'s kernel ``kernel``."""
    from refcore.provider import Provider, installed
    from refcore.registry import resolve

    provs = {p.name: p for p in resolve(factory)()} if factory else installed()
    prov = provs[provider]
    if not prov.availability().available:
        raise RuntimeError(f"{provider} unavailable: {prov.availability().reason}")
    k = next(k for k in prov.kernels if k.op == op and k.name == kernel)
    return Provider(name=provider, kernels=(k,))


def _serve(factory: str | None) -> None:
    import faulthandler

    from refcore.fuzz import draw_call, judge
    from refcore.provider import using_providers
    from refcore.registry import default_registry

    faulthandler.enable()
    import torch  # noqa: F401  (loaded before any call: kernels follow its thread count)

    reg = default_registry()
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    scopes: dict[tuple, Any] = {}
    for line in sys.stdin:
        job = json.loads(line)
        key = (job["provider"], job["op"], job["kernel"])
        if key not in scopes:  # one provider object per kernel: run's memos see one provider set
            scopes[key] = _scoped(*key, factory)
        prov = scopes[key]
        op = reg.op(job["op"])
        cpu = time.process_time()
        with using_providers(prov):
            for i in range(job["start"], job["start"] + job["count"]):
                try:
                    fc = draw_call(op, call_seed(job["seed"], i))
                except Exception as e:  # a bug of the generator, not of the kernel: counted apart
                    rec = {"i": i, "o": "generator_error", "d": repr(e)[:500], "c": op.name}
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    continue
                outcome, detail = judge(fc, job["provider"])
                rec: dict[str, Any] = {"i": i, "o": outcome}
                if outcome in ("wrong", "disputed"):
                    rec.update(d=detail[:2000], c=fc.describe()[:2000])
                out.write(json.dumps(rec) + "\n")
                out.flush()
        out.write(json.dumps({"done": True, "cpu": time.process_time() - cpu}) + "\n")
        out.flush()


# ----------------------------------------------------------------------------------- parent side


class Worker:
    """One worker process and a line reader with a timeout over its stdout."""

    def __init__(self, factory: str | None, env: dict[str, str] | None) -> None:
        cmd = [
            sys.executable,
            "-m",
            "refcore.fuzz_run",
            *(["--factory", factory] if factory else []),
        ]
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        self.buf = b""

    def line(self, timeout: float, wall: float | None = None) -> str | None:
        """The next line, or None on EOF (the worker died); TimeoutError once the worker has
        spent ``timeout`` CPU seconds (a loop) or run ``wall`` seconds (default 10 x timeout: a
        deadlock or a sleep) without one. On a shared machine a busy worker may get a few % of
        a core, so CPU time is the clock for loops; time it spends stopped (SIGSTOP from a
        scheduler pausing background jobs) does not count as wall time."""
        fd = self.proc.stdout.fileno()
        wall = 10 * timeout if wall is None else wall
        waited, last, cpu0 = 0.0, time.monotonic(), self._cpu()
        while b"\n" not in self.buf:
            if select.select([fd], [], [], 0.5)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self.buf += chunk
                continue
            now, state = time.monotonic(), self._state()
            if state not in "Tt":
                waited += now - last
            last = now
            if waited > wall or self._cpu() - cpu0 > timeout:
                raise TimeoutError
        got, self.buf = self.buf.split(b"\n", 1)
        return got.decode()

    def _stat(self) -> list[str]:
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()
        except OSError:
            return []

    def _state(self) -> str:
        st = self._stat()
        return st[0] if st else "?"

    def _cpu(self) -> float:
        """CPU seconds the worker used so far (user + system, all threads)."""
        st = self._stat()
        return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK") if st else 0.0

    def send(self, job: dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()

    def death(self) -> str:
        """Exit status and the tail of stderr of a worker that died or was killed."""
        code = self.proc.wait()
        self.err.seek(max(0, self.err.seek(0, 2) - 1500))
        tail = self.err.read().decode(errors="replace").strip()
        return f"worker exit status {code}; stderr tail:\n{tail}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the process this object started, by its pid
        self.proc.wait()
        self.err.close()


@dataclass
class Settings:
    seed: int = 0
    batch: int = 500
    #: a call hangs after this many CPU seconds, or wall_timeout seconds (default 10 x timeout)
    timeout: float = 60.0
    wall_timeout: float | None = None
    start_timeout: float = 600.0
    factory: str | None = None
    env: dict[str, str] | None = None
    #: wall-time budget: no batch starts after it (each kernel gets the same number of batches
    #: up to then, as batches are handed out kernel by kernel)
    max_seconds: float | None = None


def _describe(op: str, seed: int) -> str:
    from refcore.fuzz import draw_call
    from refcore.registry import default_registry

    try:
        return draw_call(default_registry().op(op), seed).describe()
    except Exception as e:  # reported, not raised: the run goes on
        return f"{op} seed {seed}: not drawn again ({e!r})"


class _Slot:
    """A worker slot: runs batches, restarting its worker after a crash or a hang."""

    def __init__(self, cfg: Settings) -> None:
        self.cfg, self.w = cfg, None

    def _start(self) -> Worker:
        w = Worker(self.cfg.factory, self.cfg.env)
        try:
            ready = w.line(self.cfg.start_timeout)
        except TimeoutError:
            ready = None
        if ready != "ready":
            raise RuntimeError(f"fuzz worker did not start: {w.death()}")
        return w

    def run(self, t: Tally, start: int, count: int, lock: threading.Lock) -> None:
        i, end = start, start + count
        while i < end:
            self.w = self.w or self._start()
            self.w.send(dict(provider=t.provider, op=t.op, kernel=t.kernel, seed=self.cfg.seed,
                             start=i, count=end - i))  # fmt: skip
            while i < end:
                try:
                    got = self.w.line(self.cfg.timeout, self.cfg.wall_timeout)
                except TimeoutError:
                    got, kind = None, "hang"
                    self.w.proc.kill()
                else:
                    kind = "crash"
                if got is None:  # died or killed while running call i
                    why = self.w.death()
                    self.w.close()
                    self.w = None
                    seed = call_seed(self.cfg.seed, i)
                    with lock:
                        t.add(kind, seed, why, _describe(t.op, seed))
                    i += 1
                    break
                rec = json.loads(got)
                with lock:
                    t.add(rec["o"], call_seed(self.cfg.seed, i), rec.get("d", ""), rec.get("c", ""))
                i += 1
            if i >= end and self.w is not None:
                done = json.loads(self.w.line(self.cfg.timeout) or "{}")  # the batch's end
                with lock:
                    t.cpu_s += done.get("cpu", 0.0)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def fuzz(
    kernels: list[tuple[str, str, str]], calls: int, jobs: int = 1, cfg: Settings | None = None,
    progress: Any = None,
) -> list[Tally]:  # fmt: skip
    """Fuzz each (provider, op, kernel) with ``calls`` calls on ``jobs`` worker processes."""
    cfg = cfg or Settings()
    tallies = [Tally(*k) for k in kernels]
    work = [(t, s, min(cfg.batch, calls - s)) for s in range(0, calls, cfg.batch) for t in tallies]
    lock = threading.Lock()
    errors: list[BaseException] = []
    stop = time.monotonic() + cfg.max_seconds if cfg.max_seconds else None

    def loop() -> None:
        slot = _Slot(cfg)
        try:
            while True:
                with lock:
                    if not work or errors or (stop and time.monotonic() > stop):
                        return
                    t, s, n = work.pop(0)
                slot.run(t, s, n, lock)
                if progress:
                    with lock:
                        progress(tallies)
        except BaseException as e:  # reported by the caller
            errors.append(e)
        finally:
            slot.close()

    threads = [threading.Thread(target=loop) for _ in range(max(1, jobs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return tallies


def replay_failures(tallies: list[Tally], cfg: Settings, most: int = 5) -> None:
    """Rerun up to ``most`` failing calls, each alone in a fresh worker; note on each failure
    whether it fails there too (if not, it depended on earlier calls: ``history_dependent``)."""
    done = 0
    for t in tallies:
        for f in t.failures:
            if done >= most or f["outcome"] in ("hang", "generator_error"):
                continue
            done += 1
            one = Tally(t.provider, t.op, t.kernel)
            again = dataclasses.replace(cfg, seed=f["seed"] // 2**32, batch=1, max_seconds=None)
            _Slot(again).run(one, f["seed"] % 2**32, 1, threading.Lock())
            f["history_dependent"] = not (one.wrong or one.crash or one.hang)


def kernels_of(providers: list[str], ops: list[str] | None) -> list[tuple[str, str, str]]:
    """(provider, op, kernel) for every op kernel (not optimizer steps) of the named providers,
    optionally of ``ops``."""
    from refcore.provider import installed
    from refcore.registry import default_registry

    reg, out = default_registry(), []
    for pname in providers:
        prov = installed()[pname]
        if not prov.availability().available:
            raise RuntimeError(f"{pname} unavailable: {prov.availability().reason}")
        out += [(pname, k.op, k.name) for k in prov.kernels
                if k.op in reg.ops and (not ops or k.op in ops)]  # fmt: skip
    return out


def table(tallies: list[Tally]) -> list[list[str]]:
    """Rows for printing: a header, then one row per kernel."""
    rows = [["kernel", "calls", "ok", "raised (by type)", "declined", "disputed", *FAILURES,
             "gen err", "cpu"]]  # fmt: skip
    for t in tallies:
        raised = ", ".join(f"{k} {v}" for k, v in sorted(t.raised.items())) or "0"
        rows.append([t.name, str(t.calls), str(t.ok), raised, str(t.declined), str(t.disputed),
                     str(t.wrong), str(t.crash), str(t.hang), str(t.generator_error),
                     f"{t.cpu_s:.1f}"])  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    factory = argv[argv.index("--factory") + 1] if "--factory" in argv else None
    _serve(factory)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
