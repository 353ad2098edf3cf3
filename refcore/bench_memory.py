"""``python -m refcore bench memory``: resident memory growth over many kernel calls, per provider.

Each provider runs every op it has kernels for through `refcore.run`, over mixed shapes (the
specs' small sample cases, several draws per op and dtype), round robin, ``calls`` times in all.
A warm-up first runs every distinct call `WARMUP_PASSES` times (first-use costs: library loads,
JIT compiles, memo entries, pool blocks), then `WARMUP_FRACTION` of ``calls`` more: the
allocators' own steady state takes longer (AMD EPYC Zen 3: after the passes alone, native's RSS
still rose 0.6-1.1 MB over the next ~7,500-25,000 calls, then stayed flat to 100,000; measured
again in the same process, the growth was 0, so a step, not a leak). The figure is the resident
set size (RSS, ``/proc/self/statm``) after the measured calls minus before them, after a garbage
collection each time; the growth at each quarter tells a steady leak from a step. A leak of even
a few bytes per call shows: 100,000 calls x 10 bytes is 1 MB, the budget (`BUDGET_BYTES`).

Example:
    >>> rows = memory_rows(["reference"], calls=200)  # doctest: +SKIP
    >>> rows[0].provider, rows[0].calls
    ('reference', 200)
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import refcore
from refcore.provider import installed
from refcore.registry import default_registry
from refcore.sampling import RandomDraw, cases, draw_sample

CALLS = 100_000
BUDGET_BYTES = 1 << 20
WARMUP_PASSES = 3
WARMUP_FRACTION = 0.25
SEEDS = 4  # draws per (op, dtype): shapes and attribute values vary between them


@dataclass(frozen=True)
class MemoryRow:
    provider: str
    calls: int
    distinct: int  # distinct calls (op, dtype, drawn sample) cycled through
    ops: int
    rss_before: int  # bytes, after the warm-up
    growth: int  # bytes, RSS after the calls minus before
    checkpoints: tuple[int, ...]  # growth at each quarter of the calls
    us_per_call: float

    @property
    def within_budget(self) -> bool:
        return self.growth < BUDGET_BYTES


def rss() -> int:
    """This process's resident set size in bytes (Linux ``/proc/self/statm``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError as e:
        raise RuntimeError(f"bench memory reads /proc/self/statm (Linux only): {e}") from e


def _settled_rss() -> int:
    gc.collect()
    return rss()


def provider_calls(provider: str, seeds: int = SEEDS) -> list[tuple[str, Callable[[], Any]]]:
    """(op, thunk) per (op the provider has kernels for, dtype, draw) that the provider runs."""
    reg = default_registry()
    prov = installed()[provider]
    out = []
    for op in sorted({k.op for k in prov.kernels} & set(reg.ops)):  # not optimizer steps
        spec = reg.op(op)
        dts = {d for k in prov.kernels if k.op == op for d in k.dtypes} & set(spec.dtypes)
        for dt in sorted(dts):
            if not cases(spec, dt, "small"):
                continue
            for seed in range(seeds):
                args = draw_sample(spec, dt, RandomDraw(seed)).args

                def call(op: str = op, args: dict = args) -> Any:
                    return refcore.run(op, **args, provider=provider)

                try:  # a call the provider declines (or that raises) is not part of the loop
                    call()
                except Exception:
                    continue
                out.append((op, call))
    return out


def measure(provider: str, calls: int = CALLS, seeds: int = SEEDS) -> MemoryRow:
    """RSS growth over ``calls`` calls of ``provider``'s kernels after warm-up."""
    found = provider_calls(provider, seeds)
    todo = [fn for _, fn in found]
    if not todo:
        raise ValueError(f"provider {provider!r} runs none of its ops' sample calls here")
    for _ in range(WARMUP_PASSES):
        for fn in todo:
            fn()
    for i in range(int(calls * WARMUP_FRACTION)):
        todo[i % len(todo)]()
    before = _settled_rss()
    marks, seconds, done = [], 0.0, 0
    for q in range(4):  # quarters: a steady leak grows at each, a one-off step does not
        n = calls // 4 + (q < calls % 4)
        t0 = time.perf_counter()
        for i in range(done, done + n):
            todo[i % len(todo)]()
        seconds += time.perf_counter() - t0  # the collections between quarters are not timed
        done += n
        marks.append(_settled_rss() - before)
    growth = marks[-1]
    ops = len({op for op, _ in found})
    return MemoryRow(provider, calls, len(todo), ops, before, growth, tuple(marks),
                     1e6 * seconds / calls)  # fmt: skip


def memory_rows(
    providers: Sequence[str] | None = None, calls: int = CALLS, seeds: int | None = None,
    progress: Callable[[str], Any] | None = None,
) -> list[MemoryRow]:  # fmt: skip
    """`measure` for each provider (default: every available one, the reference included)."""
    avail = {n for n, p in installed().items() if p.availability().available}
    wanted = list(providers or sorted(avail))
    unknown = sorted(set(wanted) - avail)
    if unknown:
        raise ValueError(f"unknown or unavailable providers {unknown}; available: {sorted(avail)}")
    rows = []
    for name in wanted:
        if progress:
            progress(f"{name}: {calls} calls")
        rows.append(measure(name, calls, SEEDS if seeds is None else seeds))
    return rows


def table(rows: Sequence[MemoryRow]) -> list[list[str]]:
    mb = 1 << 20
    head = ["provider", "calls", "distinct calls", "ops", "RSS after warm-up MB", "growth MB",
            "growth per quarter MB", "µs/call", f"< {BUDGET_BYTES // mb} MB"]  # fmt: skip
    return [head] + [_cells(r) for r in rows]


def _cells(r: MemoryRow) -> list[str]:
    mb = 1 << 20
    quarters = " ".join(f"{m / mb:+.2f}" for m in r.checkpoints)
    return [r.provider, f"{r.calls}", f"{r.distinct}", f"{r.ops}", f"{r.rss_before / mb:.1f}",
            f"{r.growth / mb:+.3f}", quarters, f"{r.us_per_call:.1f}",
            "yes" if r.within_budget else "NO"]  # fmt: skip
