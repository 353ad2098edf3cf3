"""``python -m refcore bench threads``: what idle OpenMP threads cost the next op, per wait policy.

libgomp reads its wait policy once, when it loads (with torch), so each policy runs in its own
process: ``default`` (libgomp's: spin a while, then sleep), ``passive`` (``OMP_WAIT_POLICY``:
sleep at once), ``spin0`` (``GOMP_SPINCOUNT=0``). In each, a parallel op (softmax over 512 x
4096 fp32, torch's or a refcore provider's kernel) runs, the process idles ``gap`` ms (a server
between requests), and a 256 x 256 fp32 ``torch.mm`` is timed: the median over ``--repeat``
rounds, against the same ``mm`` back to back (no idle). On this project's 2-vCPU machines the
default policy turned a ~0.3 ms ``mm`` into ~10 ms after 50 ms of idle; `refcore.launch`'s
``--omp-wait passive`` is the remedy when requests arrive with gaps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin0": {"GOMP_SPINCOUNT": "0"},
}
GAPS_MS = (0.0, 10.0, 50.0)


@dataclasses.dataclass
class Row:
    policy: str
    before: str  #: what ran before the idle gap: torch or a provider's softmax
    mm_us: dict[str, float]  #: gap (ms, as text) -> median torch.mm microseconds


def probe(before: str, repeat: int, threads: int) -> dict[str, float]:
    """In this process: the median mm time after ``before``'s softmax and each idle gap."""
    import torch

    import refcore

    torch.set_num_threads(threads)
    x = torch.randn(512, 4096)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def first() -> None:
        if before == "torch":
            torch.softmax(x, -1)
        else:
            refcore.run("softmax", x, dim=-1, provider=before)

    def mm() -> float:
        t0 = time.perf_counter()
        torch.mm(a, b)
        return time.perf_counter() - t0

    for _ in range(5):
        first(), mm()
    out = {}
    for gap in GAPS_MS:
        ts = []
        for _ in range(repeat):
            first()
            if gap:
                time.sleep(gap / 1e3)
            ts.append(mm())
        out[f"{gap:g}"] = statistics.median(ts) * 1e6
    return out


def rows(befores: list[str], repeat: int, threads: int, progress=None) -> list[Row]:
    """Every (policy, before) pair, each in a fresh process (the policy is read at load)."""
    out = []
    for policy, env in POLICIES.items():
        for before in befores:
            if progress:
                progress(f"{policy}: {before} then idle")
            code = (f"import json, refcore.bench_threads as b; "
                    f"print(json.dumps(b.probe({before!r}, {repeat}, {threads})))")  # fmt: skip
            r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                               capture_output=True, text=True, timeout=900)  # fmt: skip
            if r.returncode != 0:
                raise RuntimeError(
                    f"bench threads ({policy}, {before}): {r.stderr.strip()[-2000:]}"
                )
            out.append(Row(policy, before, json.loads(r.stdout.strip().splitlines()[-1])))
    return out


def table(rs: list[Row]) -> list[list[str]]:
    head = ["policy", "before", *(f"mm after {g:g} ms idle (us)" for g in GAPS_MS)]
    return [
        head,
        *([r.policy, r.before, *(f"{r.mm_us[f'{g:g}']:.0f}" for g in GAPS_MS)] for r in rs),
    ]
