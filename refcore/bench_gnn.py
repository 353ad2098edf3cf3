"""``python -m refcore bench gnn``: PyG models' full-graph inference, against PyG on torch.

A two-layer GCN, GraphSAGE (mean) and GIN (`refcore.models.gnn`, PyG's own layers, 64 -> 128 ->
7) on an R-MAT power-law graph (100k nodes, ~1.6M edges by default), each way of running it timed
in interleaved rounds after warm-up:

- ``pyg``: PyG on torch eager with an ``edge_index``, its default CPU path (an E x F message
  tensor gathered, then scattered): the baseline of every ratio;
- ``pyg_csr``: PyG on torch eager with a ``torch.sparse_csr`` ``adj_t`` (``torch.sparse.mm``);
- ``compile``: ``torch.compile(model)`` with the ``edge_index`` (dynamo takes no sparse input);
- ``enable``: ``refcore.enabled("auto")`` with the ``adj_t`` (``spmm_reduce`` where a kernel
  measures faster);
- ``optimize``: ``refcore.optimize(model, provider="auto")`` with the ``adj_t``;
- ``optimize_ei``: the same with PyG's default ``edge_index``: each layer's gather and scatter
  fused into one ``gather_scatter`` (specs/fusions.yaml), no E x F message tensor.

"x pyg" is the median over rounds of pyg's time over the mode's in that round, as `bench models`
reports "x eager". The inputs differ between modes (edge_index / adj_t) because PyG takes either
and each runs its own code path; every mode's output is checked against pyg's first.

`train_rows` (``--train``): one full-graph training step per mode (forward, cross-entropy,
backward, Adam step), ``pyg``, ``pyg_csr``, ``compile`` and ``enable`` as above; under
``enable`` each aggregation whose input needs a gradient runs a kernel forward where one measures
faster, and its gradient (``spmm_reduce_backward``) is routed the same way. ``compile_refcore``:
``torch.compile`` with refcore's backend on the ``edge_index``: each layer's message passing is
one ``gather_scatter`` and, where its input needs a gradient, ``gather_scatter_backward``.

`rss_rows` (``--rss``): each mode's two forwards in a fresh process on a large graph (1M nodes,
~16M edges by default), the peak resident memory of each sampled every 2 ms, less the resident
memory before the first (graph, features and model built): what a forward holds at its peak.
An edge_index forward gathers an E x F message tensor (16M x 64 fp32: 4 GB); an adj_t one, or
optimize's fused gather_scatter, never forms it. optimize's first call also times the graph
against the eager code (which forms it), so its second call is the one without it.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MODES = ("pyg", "pyg_csr", "compile", "enable", "optimize", "optimize_ei")


@dataclass
class Row:
    model: str
    graph: str
    dtype: str
    ms: dict[str, float | None]  # mode -> median ms per forward (None: the mode failed)
    ratio: dict[str, float | None]  # mode -> median paired pyg / mode
    notes: dict[str, str] = field(default_factory=dict)


def _fresh_dynamo(modes: Sequence[str]) -> None:
    """Each model's compile mode starts from an empty dynamo cache: the models share code
    objects (TwoLayer.forward, PyG's layers), and after 8 recompiles of one (models x dtypes x
    inference / training) dynamo runs it eagerly, so "compile" would time eager."""
    if any(m.startswith(("compile", "optimize")) for m in modes):
        import torch

        torch._dynamo.reset()


def _runners(kind: str, g: Any, dtype: Any, modes: Sequence[str]) -> tuple[dict, dict]:
    """The modes' forward calls, and their notes (optimize's: its notes list, filled as it
    runs)."""
    import torch

    import refcore
    from refcore.models import gnn

    _fresh_dynamo(modes)
    m = gnn.model(kind, g.x.shape[1], 7).to(dtype)
    x = g.x.to(dtype)
    ei, adj = g.edge_index, g.adj_t().to(dtype)
    fns: dict[str, Callable[[], Any]] = {}
    notes: dict[str, str] = {}
    for mode in modes:
        if mode == "pyg":
            fns[mode] = lambda: m(x, ei)
        elif mode == "pyg_csr":
            fns[mode] = lambda: m(x, adj)
        elif mode == "compile":
            cm = torch.compile(m)
            fns[mode] = lambda cm=cm: cm(x, ei)
        elif mode == "enable":

            def enabled() -> Any:
                with refcore.enabled("auto"):
                    return m(x, adj)

            fns[mode] = enabled
        elif mode == "optimize":
            fast = refcore.optimize(m, provider="auto")
            fns[mode] = lambda fast=fast: fast(x, adj)
            notes[mode] = fast.notes  # read after the calls: the first one adds to them
        elif mode == "optimize_ei":
            fast_ei = refcore.optimize(m, provider="auto")
            fns[mode] = lambda fast_ei=fast_ei: fast_ei(x, ei)
            notes[mode] = fast_ei.notes
    return fns, notes


def gnn_rows(models: Sequence[str], dtypes: Sequence[str] = ("float32",), repeat: int = 5,
             nodes: int = 100_000, edges: int = 1_600_000, modes: Sequence[str] = MODES,
             progress: Callable[[str], Any] | None = None) -> list[Row]:  # fmt: skip
    import torch

    from refcore.models import gnn

    g = gnn.power_law(nodes, edges)
    label = f"{nodes // 1000}k / {g.edge_index.shape[1] / 1e6:.2f}M"
    rows = []
    for kind in models:
        for dt in dtypes:
            dtype = getattr(torch, dt)
            if progress:
                progress(f"{kind} {dt} on {label}")
            fns, notes = _runners(kind, g, dtype, modes)
            said = notes.pop("optimize", [])
            said_ei = notes.pop("optimize_ei", [])
            ms, ratio = _time(fns, repeat, notes)
            if "optimize" not in notes:
                notes["optimize"] = "; ".join(n for n in said if "torch.sparse_csr" in n)
            if "optimize_ei" not in notes:  # what was fused, and the graph's trial against eager
                notes["optimize_ei"] = "; ".join(
                    n for n in said_ei if "gather_scatter" in n or "eager" in n)
            rows.append(Row(kind, label, dt, ms, ratio, notes))
    return rows


def _time(fns: dict[str, Callable[[], Any]], repeat: int,
          notes: dict[str, str]) -> tuple[dict, dict]:  # fmt: skip
    import torch

    from refcore.registry import default_registry

    tol = default_registry().op("spmm_reduce").tolerance_for("float32")
    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        want = fns["pyg"]()
        for k in list(fns):
            try:
                got = fns[k]()
                fns[k]()  # the second call: captures, measured choices, trials settle
                scale = float(want.float().abs().max()) or 1.0
                err = float((got.float() - want.float()).abs().max()) / scale
                if err > max(100 * tol.rtol, 0.05 if got.dtype == torch.bfloat16 else 0):
                    notes[k] = f"max error {err:.2e} of the output's range against pyg"
            except Exception as e:  # a mode that cannot run this model is a row, not a crash
                notes[k] = f"failed: {type(e).__name__}: {str(e)[:120]}"
                del fns[k]
        for _ in range(repeat):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
    ms = {k: (statistics.median(samples[k]) * 1e3 if k in fns else None) for k in samples}
    base = samples["pyg"]
    ratio = {k: (statistics.median(b / s for b, s in zip(base, samples[k])) if k in fns else None)
             for k in samples}  # fmt: skip
    return ms, ratio


TRAIN_MODES = ("pyg", "pyg_csr", "compile", "enable", "compile_refcore")


def _train_runners(kind: str, g: Any, dtype: Any, modes: Sequence[str]) -> dict:
    """Each mode's training step (Adam, cross-entropy over every node, full graph) on a copy of
    one model, so every mode starts from the same parameters; a step returns its loss."""
    import copy

    import torch

    import refcore
    from refcore.models import gnn

    _fresh_dynamo(modes)
    base = gnn.model(kind, g.x.shape[1], 7).to(dtype).train()
    x, y = g.x.to(dtype), g.y
    ei, adj = g.edge_index, g.adj_t().to(dtype)
    fns: dict[str, Callable[[], Any]] = {}
    for mode in modes:
        m = copy.deepcopy(base)
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        if mode == "compile_refcore":  # dynamo graph, refcore's passes: gather_scatter fused
            from refcore.compile_backend import backend

            net = torch.compile(m, backend=backend("auto"), dynamic=True)
        else:
            net = torch.compile(m) if mode == "compile" else m
        graph = ei if mode in ("pyg", "compile", "compile_refcore") else adj

        def fwd(net: Any = net, graph: Any = graph) -> Any:
            return net(x, graph)

        def step(fwd: Callable[[], Any] = fwd, opt: Any = opt, mode: str = mode) -> Any:
            with refcore.enabled("auto") if mode == "enable" else contextlib.nullcontext():
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(fwd().float(), y)
                loss.backward()
            opt.step()
            return loss.detach()

        fns[mode] = step
    return fns


def train_rows(models: Sequence[str], dtypes: Sequence[str] = ("float32",), repeat: int = 5,
               nodes: int = 100_000, edges: int = 1_600_000, modes: Sequence[str] = TRAIN_MODES,
               progress: Callable[[str], Any] | None = None) -> list[Row]:  # fmt: skip
    """One training step (forward, loss, backward, optimizer step) per mode, timed as
    `gnn_rows` times forwards: "x pyg" against PyG eager with the ``edge_index``. The first
    step's loss (every mode from the same parameters) is checked against pyg's."""
    import torch

    from refcore.models import gnn

    g = gnn.power_law(nodes, edges)
    label = f"{nodes // 1000}k / {g.edge_index.shape[1] / 1e6:.2f}M"
    rows = []
    for kind in models:
        for dt in dtypes:
            if progress:
                progress(f"{kind} {dt} training on {label}")
            fns = _train_runners(kind, g, getattr(torch, dt), modes)
            notes: dict[str, str] = {}
            first = {}
            for k in list(fns):
                try:
                    first[k] = float(fns[k]())
                except Exception as e:  # a mode that cannot train this model is a row
                    notes[k] = f"failed: {type(e).__name__}: {str(e)[:120]}"
                    del fns[k]
            for k, loss in first.items():
                if abs(loss - first["pyg"]) > 1e-3 * max(abs(first["pyg"]), 1.0) * (
                        30 if dt == "bfloat16" else 1):  # fmt: skip
                    notes[k] = f"first loss {loss:.5f} against pyg's {first['pyg']:.5f}"
            ms, ratio = _time_steps(fns, repeat)
            rows.append(Row(kind, label, dt, ms, ratio, notes))
    return rows


def _time_steps(fns: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict, dict]:
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for k in fns:
        fns[k]()  # a second step: compiles and measured choices settle
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
    ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}
    base = samples["pyg"]
    ratio = {k: statistics.median(b / s for b, s in zip(base, v)) for k, v in samples.items()}
    return ms, ratio


def table(rows: list[Row]) -> list[list[str]]:
    out = [["model", "graph", "dtype", "mode", "ms", "x pyg", "note"]]
    for r in rows:
        for mode, t in r.ms.items():
            q = r.ratio[mode]
            out.append([r.model, r.graph, r.dtype, mode, "-" if t is None else f"{t:.1f}",
                        "-" if q is None else f"{q:.2f}x", r.notes.get(mode, "")])  # fmt: skip
    return out


RSS_MODES = ("pyg", "pyg_csr", "enable", "optimize", "optimize_ei")


@dataclass
class RssRow:
    model: str
    graph: str
    mode: str
    before_mb: float | None  # resident before the forward (graph, features, model)
    peak_growth_mb: float | None  # the first forward's peak resident memory over that
    seconds: float | None  # the first forward's wall time (first-call costs included)
    error: str = ""
    #: a second forward's peak over the same start (what the first left resident included), and
    #: its time: optimize's first call also runs the eager code to time the graph against it
    later_growth_mb: float | None = None
    later_seconds: float | None = None


def _rss_child(kind: str, mode: str, nodes: int, edges: int) -> None:
    """In the child: build the graph, run two forwards of ``mode``, print what each held."""
    import threading
    import warnings

    import torch

    import refcore
    from refcore.models import gnn

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    g = gnn.power_law(nodes, edges)
    m = gnn.model(kind, g.x.shape[1], 7)
    adj = g.edge_index if mode in ("pyg", "optimize_ei") else g.adj_t()
    fast = refcore.optimize(m, provider="auto") if mode.startswith("optimize") else None
    page = 4096

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    before, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    runs = []
    for _ in range(2):
        peak[0] = rss()
        t0 = time.perf_counter()
        with torch.no_grad():
            if mode == "enable":
                with refcore.enabled("auto"):
                    m(g.x, adj)
            else:
                (fast or m)(g.x, adj)
        secs = time.perf_counter() - t0
        runs.append(((max(peak[0], rss()) - before) / 2**20, secs))
    done.set()
    t.join()
    out = {"before_mb": before / 2**20, "peak_growth_mb": runs[0][0], "s": runs[0][1],
           "later_growth_mb": runs[1][0], "later_s": runs[1][1]}  # fmt: skip
    print(json.dumps(out))


def rss_rows(models: Sequence[str], nodes: int = 1_000_000, edges: int = 16_000_000,
             modes: Sequence[str] = RSS_MODES, timeout: float = 1800,
             progress: Callable[[str], Any] | None = None) -> list[RssRow]:  # fmt: skip
    label = f"{nodes // 1000}k / ~{edges / 1e6:.0f}M"
    rows = []
    for kind in models:
        for mode in modes:
            if progress:
                progress(f"{kind} {mode} on {label} (a fresh process)")
            code = f"from refcore.bench_gnn import _rss_child; _rss_child({kind!r}, {mode!r}, " \
                   f"{nodes}, {edges})"  # fmt: skip
            try:
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                   timeout=timeout)  # fmt: skip
            except subprocess.TimeoutExpired:
                rows.append(RssRow(kind, label, mode, None, None, None, f"over {timeout:.0f} s"))
                continue
            last = p.stdout.strip().splitlines()[-1:] if p.stdout else []
            if p.returncode != 0 or not last:
                why = f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"
                rows.append(RssRow(kind, label, mode, None, None, None, why[:200]))
                continue
            d = json.loads(last[0])
            rows.append(RssRow(kind, label, mode, d["before_mb"], d["peak_growth_mb"], d["s"],
                               later_growth_mb=d["later_growth_mb"], later_seconds=d["later_s"]))
    return rows


def rss_table(rows: list[RssRow]) -> list[list[str]]:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    out = [["model", "graph", "mode", "before MB", "1st peak +MB", "1st s", "2nd peak +MB",
            "2nd s", "note"]]  # fmt: skip
    for r in rows:
        out.append([r.model, r.graph, r.mode, num(r.before_mb, ".0f"),
                    num(r.peak_growth_mb, ".0f"), num(r.seconds, ".1f"),
                    num(r.later_growth_mb, ".0f"), num(r.later_seconds, ".1f"),
                    r.error])  # fmt: skip
    return out
