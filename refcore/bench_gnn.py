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
- ``optimize``: ``refcore.optimize(model, provider="auto")`` with the ``adj_t``.

"x pyg" is the median over rounds of pyg's time over the mode's in that round, as `bench models`
reports "x eager". The inputs differ between modes (edge_index / adj_t) because PyG takes either
and each runs its own code path; every mode's output is checked against pyg's first.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

MODES = ("pyg", "pyg_csr", "compile", "enable", "optimize")


@dataclass
class Row:
    model: str
    graph: str
    dtype: str
    ms: dict[str, float | None]  # mode -> median ms per forward (None: the mode failed)
    ratio: dict[str, float | None]  # mode -> median paired pyg / mode
    notes: dict[str, str] = field(default_factory=dict)


def _runners(kind: str, g: Any, dtype: Any, modes: Sequence[str]) -> tuple[dict, dict]:
    """The modes' forward calls, and their notes (optimize's: its notes list, filled as it
    runs)."""
    import torch

    import refcore
    from refcore.models import gnn

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
            ms, ratio = _time(fns, repeat, notes)
            if "optimize" not in notes:
                notes["optimize"] = "; ".join(n for n in said if "torch.sparse_csr" in n)
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


def table(rows: list[Row]) -> list[list[str]]:
    out = [["model", "graph", "dtype", "mode", "ms", "x pyg", "note"]]
    for r in rows:
        for mode, t in r.ms.items():
            q = r.ratio[mode]
            out.append([r.model, r.graph, r.dtype, mode, "-" if t is None else f"{t:.1f}",
                        "-" if q is None else f"{q:.2f}x", r.notes.get(mode, "")])  # fmt: skip
    return out
