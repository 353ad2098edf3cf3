"""``python -m refcore bench ops``: every op x shape x dtype, each provider against stock torch.

All timings come from one process run: the implementations of a row are interleaved in every
repeat, and each row reports medians of the repeats after warm-up, so ratios hold on a noisy,
shared machine. Shapes are declared in ``specs/benchmarks.yaml``. A short probe measures the
machine's limits (memory bandwidth, fp32/bf16 GEMM, int8 GEMM through torch) in the same run.

Example:
    >>> rows = bench_ops(ops=["relu"], dtypes=["float32"], repeat=3)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import refcore
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.sampling import draw_bench, evaluate
from refcore.spec import BenchSpec
from refcore.testing import call_torch

THREADS = 2


@dataclass(frozen=True)
class Limits:
    """What this machine reaches through torch, measured in this run."""

    bandwidth_gbs: float
    fp32_gflops: float
    bf16_gflops: float
    int8_gops: float

    def __str__(self) -> str:
        return (
            f"bandwidth {self.bandwidth_gbs:.0f} GB/s, fp32 GEMM {self.fp32_gflops:.3g} GFLOP/s, "
            f"bf16 GEMM {self.bf16_gflops:.3g} GFLOP/s, int8 GEMM {self.int8_gops:.3g} GOP/s"
        )


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    torch_us: float
    provider_us: dict[str, float] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    bytes: float = 0.0
    flops: float | None = None
    #: the torch callable timed when it is not the op's own function (specs/benchmarks.yaml)
    anchor: str = ""
    #: with an anchor: the op's own torch function's time, what routing times a kernel against
    own_us: float | None = None

    def ratio(self, provider: str) -> float:
        """torch time / provider time: above 1 the provider is faster."""
        return self.torch_us / self.provider_us[provider]

    def rate(self, us: float) -> str:
        if self.flops:
            return f"{self.flops / us / 1e3:.0f} GFLOP/s"
        return f"{self.bytes / us / 1e3:.1f} GB/s"


def _time_per_call(fn: Callable[[], Any], min_seconds: float = 2e-3) -> float:
    """Seconds per call, looping enough calls to last ``min_seconds`` (timeit's autorange)."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_seconds or n >= 1 << 16:
            return dt / n
        n *= max(2, int(min_seconds / max(dt, 1e-9)))


def interleaved(
    fns: dict[str, Callable[[], Any]], repeat: int, warmup: int = 2, min_seconds: float = 2e-3
) -> dict[str, float]:
    """Median microseconds per call for each function, timed in interleaved rounds (each round
    loops a function for at least ``min_seconds``)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            samples[name].append(_time_per_call(fn, min_seconds) * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


def libraries() -> dict[str, str]:
    """torch's version and the MKL / oneDNN builds it runs (from ``torch.__config__.show()``)."""
    import torch

    out = {"torch": torch.__version__}
    for line in torch.__config__.show().splitlines():
        text = line.strip(" -")
        if "Math Kernel Library Version" in text:
            out["mkl"] = text.split("Version", 1)[1].split("-Product")[0].strip()
        elif text.startswith("Intel(R) MKL-DNN"):
            out["onednn"] = text.split()[2]
    return out


def probe(seconds: float = 0.3) -> Limits:
    """Measure memory bandwidth and GEMM throughput through torch on `THREADS` threads."""
    import torch

    torch.set_num_threads(THREADS)
    bw = _bandwidth(seconds)
    m = 2048
    x, y = torch.randn(m, m), torch.randn(m, m)
    fp32 = 2 * m**3 / _best(lambda: torch.mm(x, y), seconds) / 1e9
    xb, yb = x.bfloat16(), y.bfloat16()
    bf16 = 2 * m**3 / _best(lambda: torch.mm(xb, yb), seconds) / 1e9
    xi = torch.randint(-128, 127, (m, m), dtype=torch.int8)
    i8 = 2 * m**3 / _best(lambda: torch._int_mm(xi, xi), seconds) / 1e9
    return Limits(bw, fp32, bf16, i8)


def _bandwidth(seconds: float) -> float:
    """GB/s of a 2-read 1-write stream (torch.add into a reused output), 128 MB per operand."""
    import torch

    n = 1 << 25
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    return 3 * 4 * n / _best(lambda: torch.add(a, b, out=c), seconds) / 1e9


def _best(fn: Callable[[], Any], seconds: float) -> float:
    fn()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _work(
    b: BenchSpec, sample_args: dict[str, Any], out: Any, dtype: str
) -> tuple[float, float | None]:
    env = {**{k: v for k, v in dict(b.dims).items()}, "esize": 2 if dtype == "bfloat16" else 4}
    flops = float(evaluate(b.flops, env)) if b.flops else None
    if b.bytes:
        return float(evaluate(b.bytes, env)), flops
    moved = sum(v.nbytes for v in sample_args.values() if isinstance(v, np.ndarray))
    return float(moved + out.numel() * out.element_size()), flops


def providers_to_run(requested: Sequence[str] | None) -> list[str]:
    avail = [n for n, p in installed().items() if p.availability().available]
    if requested:
        unknown = [p for p in requested if p not in installed()]
        if unknown:
            raise ValueError(f"bench: unknown providers {unknown}; known: {sorted(installed())}")
        return list(requested)
    return sorted(n for n in avail if n != "reference")  # the float64 references are not fast


def bench_ops(
    ops: Iterable[str] | None = None,
    providers: Sequence[str] | None = None,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    repeat: int = 5,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Time each benchmark shape for torch and every provider whose kernel accepts it."""
    import torch

    torch.set_num_threads(THREADS)
    reg = default_registry()
    names = sorted(ops) if ops else sorted(reg.benchmarks)
    for n in names:
        if n not in reg.benchmarks:
            raise ValueError(f"bench: no benchmark shapes for op {n!r}; see specs/benchmarks.yaml")
    provs = providers_to_run(providers)
    jobs = [(n, b, dt) for n in names for b in reg.benchmarks[n] for dt in dtypes
            if dt in reg.op(n).dtypes]  # fmt: skip
    rows = []
    for i, (name, b, dtype) in enumerate(jobs):
        if progress:
            progress(f"[{i + 1}/{len(jobs)}] {name} {b.label} {dtype}")
        rows.append(_bench_one(name, b, dtype, provs, repeat))
    return rows


def _bench_one(name: str, b: BenchSpec, dtype: str, provs: Sequence[str], repeat: int) -> Row:
    spec = default_registry().op(name)
    sample = draw_bench(spec, b, dtype)
    targs = sample.torch_args(keep_layout=True)
    fn = resolve(b.torch or spec.torch.function)
    fns: dict[str, Callable[[], Any]] = {"torch": lambda: call_torch(spec, fn, targs)}
    declined = {}
    for p in provs:
        why = refcore.explain(name, provider=p, **targs) if p in installed() else None
        if why is None or why.chosen is None:
            declined[p] = "no kernel" if why is None else _reason(why)
            continue
        kern = next(k for k in installed()[p].kernels_for(name) if k.name == why.chosen[1])
        if kern.fallback:  # routing never runs it where torch can: not a speed row
            fast = _reason(why)  # why the faster kernels declined, the telling reason
            declined[p] = f"{kern.name} is a correctness fallback; routing runs torch" + (
                f" ({fast})" if fast != "no kernel" else "")  # fmt: skip
            continue
        fns[p] = lambda p=p: refcore.run(name, provider=p, **targs)
    if b.torch and len(fns) > 1:  # an anchor: routing still weighs the op's own torch function
        own = resolve(spec.torch.function)
        fns["own"] = lambda: call_torch(spec, own, targs)
    out = fns["torch"]()
    times = interleaved(fns, repeat)
    moved, flops = _work(b, sample.args, out, dtype)
    return Row(name, b.label, dtype, times.pop("torch"), times, declined, moved, flops,
               b.torch or "", times.pop("own", None))  # fmt: skip


def _reason(why: refcore.Explanation) -> str:
    texts = [c.verdict for c in why.candidates if c.verdict.startswith(("declined", "implements"))]
    # the last refusal is the most general kernel's (e.g. the portable one), the telling reason
    return texts[-1] if texts else "no kernel"


def table(rows: Sequence[Row], limits: Limits | None) -> list[list[str]]:
    provs = sorted({p for r in rows for p in r.provider_us})  # providers that ran something
    head = ["op", "shape", "dtype", "torch us", *[f"{p} us" for p in provs],
            *[f"{p}/torch" for p in provs], "best rate", "limit"]  # fmt: skip
    out = [head]
    for r in rows:
        best = min([r.torch_us, *r.provider_us.values()])
        limit = ""
        if limits:
            peak = limits.bf16_gflops if r.dtype == "bfloat16" else limits.fp32_gflops
            limit = f"{peak:.0f} GFLOP/s" if r.flops else f"{limits.bandwidth_gbs:.0f} GB/s"
        out.append([
            r.op, r.shape, r.dtype, f"{r.torch_us:.1f}",
            *[f"{r.provider_us[p]:.1f}" if p in r.provider_us else "-" for p in provs],
            *[_ratio_cell(r, p) if p in r.provider_us else "-" for p in provs],
            r.rate(best), limit,
        ])  # fmt: skip
    return out


def _ratio_cell(r: Row, provider: str) -> str:
    x = r.ratio(provider)
    # routing times the kernel against the op's torch function on its first call of a shape
    # (refcore/choice.py); another anchor (torch's int8 path for qlinear) is a comparison, and
    # where the kernel trails it the cell says what routing does by the op's own function (on a
    # CPU without VNNI oneDNN's int8 sums of full-range weights saturate: not the op's meaning,
    # so qlinear's torch function is a float64 GEMM there)
    if x >= 1.0:
        return f"{x:.2f}x"
    if r.own_us is None:
        return f"{x:.2f}x (torch runs)"
    own = r.own_us / r.provider_us[provider]
    if own < 1.0:
        return f"{x:.2f}x (torch runs)"
    return f"{x:.2f}x (kernel runs: {own:.2f}x the op's torch function)"


def markdown(rows: Sequence[Row], limits: Limits | None, meta: dict[str, Any]) -> str:
    """The table as Markdown, headed by when, where and how it was measured."""
    cells = table(rows, limits)
    lines = [
        f"Measured {meta['date']} on {meta['cpu']}, {meta['threads']} threads, "
        f"medians of {meta['repeat']} interleaved runs after warm-up "
        "(`python -m refcore bench ops`).",
        "",
        *machine_lines(meta),
    ]
    if limits:
        lines += [f"Machine limits in the same run (through torch): {limits}.", ""]
    lines.append("| " + " | ".join(cells[0]) + " |")
    lines.append("|" + "---|" * len(cells[0]))
    lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
    return "\n".join(lines) + "\n"


def machine_lines(meta: dict[str, Any]) -> list[str]:
    m, libs = meta.get("machine"), meta.get("libraries")
    if not m or not libs:
        return []
    caches = ", ".join(f"{k} {v}" for k, v in m["caches"].items())
    versions = ", ".join(f"{k} {v}" for k, v in libs.items())
    model = f"{m['model']} (family/model {m['family_model']})"
    return [f"Machine: {model}, {m['cores']} cores, {caches}; {versions}.", ""]


def write_json(path: str, rows: Sequence[Row], limits: Limits | None, meta: dict[str, Any]) -> None:
    data = {"meta": meta, "limits": asdict(limits) if limits else None,
            "rows": [asdict(r) for r in rows]}  # fmt: skip
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def plot(path: str, rows: Sequence[Row]) -> None:
    """Bar chart: ratio to torch per op x shape x dtype, one bar per provider."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("bench --plot needs matplotlib: pip install matplotlib") from e
    provs = sorted({p for r in rows for p in r.provider_us})
    labels = [f"{r.op} {r.shape} {r.dtype}" for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    height = 0.8 / max(1, len(provs))
    for j, p in enumerate(provs):
        ys = [i + j * height for i in range(len(rows))]
        ax.barh(ys, [r.ratio(p) if p in r.provider_us else 0 for r in rows], height, label=p)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to torch (torch time / provider time; > 1 is faster)")
    if provs:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def overhead_rows(provider: str = "native", repeat: int = 5) -> list[list[str]]:
    """Per-call µs of tiny torch calls: plain torch, and under `refcore.enabled` (routing on).

    Rows: an unrouted function (the cost of the TorchFunctionMode alone), routed calls a kernel
    runs, and a call torch keeps (bound, then declined). Tiny tensors, so the time is the call
    path, not the math. Columns: ``provider`` (the kernel path) and ``auto``, which leaves calls
    this small on torch after one memoised decision.
    """
    import torch

    torch.set_num_threads(THREADS)
    x, w, b = torch.randn(4, 8), torch.randn(8, 8), torch.randn(8)
    calls: dict[str, Callable[[], Any]] = {
        "torch.tanh (not routed)": lambda: torch.tanh(x),
        "F.relu": lambda: torch.nn.functional.relu(x),
        "x + y": lambda: x + x,
        "F.layer_norm": lambda: torch.nn.functional.layer_norm(x, (8,)),
        "F.linear": lambda: torch.nn.functional.linear(x, w, b),
        "x + 1.0 (kept on torch)": lambda: x + 1.0,
    }
    rows = [["call", "torch µs", f"{provider} µs", f"{provider} overhead µs", "auto µs", "ran"]]
    with torch.no_grad():
        for name, fn in calls.items():
            times, ran = {}, "-"
            for p in (provider, "auto"):
                with refcore.enabled(p) as rep:
                    times[p] = interleaved({p: fn}, repeat)[p]
                if p == provider:
                    ran = ", ".join(sorted({o for (_, o) in rep.counts})) or "-"
            off = interleaved({"torch": fn}, repeat)["torch"]
            rows.append([name, f"{off:.1f}", f"{times[provider]:.1f}",
                         f"{times[provider] - off:.1f}", f"{times['auto']:.1f}", ran])  # fmt: skip
    return rows


def _chain(nodes: int) -> Any:
    """A module of ``nodes`` small spec'd calls on its input: gelu, add, softmax in turn (no two
    of them fuse, so the optimized graph has ``nodes`` calls too)."""
    import torch
    import torch.nn.functional as F

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for i in range(nodes):
                step = i % 3
                x = F.gelu(x) if step == 0 else x + y if step == 1 else F.softmax(x, -1)
            return x

    return Chain().eval()


def graph_overhead_rows(provider: str = "native", repeat: int = 5,
                               nodes: int = 100) -> list[list[str]]:  # fmt: skip
    """Per-node µs of a graph of ``nodes`` tiny calls: torch eager, under `refcore.enabled`,
    optimized with routing nodes, and planned (`refcore.plan`); the refcore cost per node is the
    time over what runs the calls. Two choices: measured (tiny calls stay on torch, so the cost
    is over torch eager) and ``REFCORE_CHOICE=rules`` (the provider's kernels run; the cost is
    over those kernels called directly on the bound arrays, `Kernel.fn`)."""
    import os

    import torch

    from refcore import choice

    torch.set_num_threads(THREADS)
    rows = [["choice", "run", "µs per node", "refcore µs per node", "over"]]
    saved = os.environ.get(choice.ENV)
    try:
        for mode in ("measure", "rules"):
            os.environ[choice.ENV] = mode
            times, base, over = _graph_times(provider, repeat, nodes, kernels=mode == "rules")
            for name, us in times.items():
                extra = "-" if name == "torch eager" else f"{(us - base) / nodes:.2f}"
                rows.append([mode, name, f"{us / nodes:.2f}", extra, over])
    finally:
        if saved is None:
            os.environ.pop(choice.ENV, None)
        else:
            os.environ[choice.ENV] = saved
    return rows


def _graph_times(provider: str, repeat: int, nodes: int,
                 kernels: bool) -> tuple[dict[str, float], float, str]:  # fmt: skip
    """(µs per run of each way, the baseline's µs, what the baseline is) for `_chain`."""
    import torch
    from torch import fx

    from refcore.optimize import DEFAULT_PASSES
    from refcore.plan import Step

    model = _chain(nodes)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    unplanned = tuple(p for p in DEFAULT_PASSES if p != "plan")
    routed = refcore.optimize(model, provider=provider, passes=unplanned, capture="fx")
    planned = refcore.optimize(model, provider=provider, capture="fx")

    def enabled() -> Any:
        with refcore.enabled(provider):
            return model(x, y)

    fns = {"torch eager": lambda: model(x, y), "refcore.enabled": enabled,
           "optimize, routing nodes": lambda: routed(x, y),
           "optimize, planned": lambda: planned(x, y)}  # fmt: skip
    with torch.no_grad():
        # a round of a few 2 ms calls swung by 2x on the shared machine: rounds of 50 ms
        if not kernels:
            times = interleaved(fns, repeat, min_seconds=0.05)
            return times, times["torch eager"], "torch eager"
        planned(x, y)  # the planning run: its kernel steps are the baseline's calls
        calls: list[tuple[Any, Any]] = []

        class Record(fx.Interpreter):
            def call_function(self, target: Any, a: tuple, kw: dict) -> Any:
                step = getattr(target, "step", None)
                if isinstance(step, Step):
                    calls.append((step.fn, step.bind(a, kw)))
                return super().call_function(target, a, kw)

        (plan,) = planned.planned.plans.values()
        Record(plan[0]).run(x, y)

        def alone() -> None:
            for fn, bound in calls:
                fn(**bound)

        # in the same interleaved rounds: this machine's speed drifts between rounds
        times = interleaved({**fns, "kernels alone": alone}, repeat, min_seconds=0.05)
        base = times.pop("kernels alone")
    return times, base, f"its {len(calls)} kernels alone"
