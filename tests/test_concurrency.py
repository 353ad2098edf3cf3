"""Concurrency: threads calling kernels at once, processes building the native cache at once.

Threads: every kernel of every provider through `refcore.run` (samples drawn from the specs, the
large tier too, so outputs come from the buffer pool), torch calls routed by `refcore.enabled`,
and a model prepacked by `refcore.optimize`, each from 4 Python threads at once on different
inputs, must give bit for bit what the same calls give one after another. The threaded pass runs
first, in a fresh interpreter: the memos (run's structure keys, routing decisions, prepacked
decisions), the pool and the providers' first use all start empty, so their first fills race.
Every result is kept alive until the comparison, so a pool block handed to two threads at once
shows as a wrong result.

Processes: tests/test_native_build.py's test_concurrent_first_use_builds_once has 4 interpreters
load the native library at once into an empty cache (one build from scratch is enough).

Run as a script (``python tests/test_concurrency.py threads``), this file is the worker.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

THREADS = 4
ROUNDS = 3  # each thread runs its share of the calls this many times, in a different order


def _outcome(fn: Any) -> Any:
    """The result as bytes (dtype, shape, memory), or the exception's type and message."""
    try:
        out = fn()
    except Exception as e:  # a call that raises must raise the same way in both passes
        return ("raised", type(e).__name__, str(e))
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(_bytes(o) for o in outs)


def _bytes(o: Any) -> Any:
    import torch

    if isinstance(o, torch.Tensor):
        o = o.detach()
        return (str(o.dtype), tuple(o.shape), o.contiguous().view(torch.uint8).numpy().tobytes())
    a = np.asarray(o)
    return (str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes())


def _kernel_calls() -> list[tuple[str, Any]]:
    """(label, thunk) for every kernel op of every available provider: small and large samples."""
    import refcore
    from refcore.provider import installed
    from refcore.registry import default_registry
    from refcore.sampling import RandomDraw, cases, draw_sample

    reg = default_registry()
    calls = []
    for pname, prov in sorted(installed().items()):
        # no availability probe here: the providers' first use (library load, numba import and
        # compiles) happens in the threads, and an unavailable one raises alike in both passes
        for op in sorted({k.op for k in prov.kernels} & set(reg.ops)):  # ops, not optimizer steps
            spec = reg.op(op)
            dts = {d for k in prov.kernels if k.op == op for d in k.dtypes} & set(spec.dtypes)
            for dt in sorted(dts):
                # one large draw (outputs from the buffer pool) where it is fast: not the reference
                large = range(1 if pname != "reference" else 0)
                for tier, seeds in (("small", range(3)), ("large", large)):
                    if not cases(spec, dt, tier):
                        continue
                    for seed in seeds:
                        s = draw_sample(spec, dt, RandomDraw(seed), tier)

                        def thunk(op=op, args=s.args, p=pname):
                            return refcore.run(op, **args, provider=p)

                        calls.append((f"{pname} {op} {dt} {tier} {seed}", thunk))
    return calls


def _routed_calls() -> list[tuple[str, Any]]:
    """Torch calls under `refcore.enabled` for each provider (above auto's size threshold)."""
    import torch
    import torch.nn.functional as F

    import refcore

    g = torch.Generator().manual_seed(0)
    calls = []
    for provider in ("auto", "native", "numba"):
        for i, n in enumerate((128, 160, 192, 256)):
            x = torch.randn(n, 256, generator=g)
            w = torch.randn(256, 256, generator=g) * 0.05
            ln_w, ln_b = torch.randn(256, generator=g), torch.randn(256, generator=g)
            q, k, v = (torch.randn(2, 4, n // 4, 64, generator=g) for _ in range(3))

            def thunk(x=x, w=w, ln_w=ln_w, ln_b=ln_b, q=q, k=k, v=v, p=provider):
                with refcore.enabled(p):
                    h = F.layer_norm(F.gelu(F.linear(x, w)), (256,), ln_w, ln_b)
                    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    return F.softmax(torch.add(h, x), dim=-1), F.silu(a)

            calls.append((f"enabled({provider}) {i}", thunk))
    return calls


def _prepacked_calls() -> list[tuple[str, Any]]:
    """A model through `refcore.optimize` (prepacked linear weights where a kernel reads them)."""
    import torch

    import refcore

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 256),
        torch.nn.LayerNorm(256),
    ).eval()
    calls = []
    for provider in ("auto", "native"):
        opt = refcore.optimize(model, provider=provider, example_inputs=(torch.randn(8, 256),))
        for i, m in enumerate((32, 64, 96, 128)):
            x = torch.randn(m, 256)

            def thunk(opt=opt, x=x):
                with torch.no_grad():
                    return opt(x)

            calls.append((f"optimize({provider}) {i}", thunk))
    return calls


def _threads_then_serial(calls: list[tuple[str, Any]]) -> list[str]:
    """Run ``calls`` split over `THREADS` threads (`ROUNDS` times each), then one after another;
    return the labels whose outcomes differ."""
    got: dict[int, list[Any]] = {i: [] for i in range(len(calls))}
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        mine = list(range(t, len(calls), THREADS))
        try:
            barrier.wait()
            for r in range(ROUNDS):
                for i in mine if r % 2 == 0 else mine[::-1]:
                    got[i].append(_outcome(calls[i][1]))
        except BaseException as e:  # a worker's own failure must not pass silently
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    serial = [_outcome(fn) for _, fn in calls]
    return [calls[i][0] for i in range(len(calls)) if any(o != serial[i] for o in got[i])]


def _worker(what: str) -> None:
    import torch

    torch.set_num_threads(2)
    calls = {"kernels": _kernel_calls, "routed": _routed_calls, "prepacked": _prepacked_calls}
    todo = calls[what]()
    wrong = _threads_then_serial(todo)
    print(f"{len(todo)} calls x {THREADS} threads x {ROUNDS} rounds; differing: {len(wrong)}")
    for label in wrong:
        print("DIFFERS", label)


def _run_worker(what: str) -> str:
    res = subprocess.run(
        [sys.executable, __file__, what], capture_output=True, text=True, timeout=1200
    )
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    print(res.stdout)
    assert "differing: 0" in res.stdout, res.stdout
    return res.stdout


@pytest.mark.parametrize("what", ["kernels", "routed", "prepacked"])
def test_threads_give_the_serial_results(what: str) -> None:
    _run_worker(what)


if __name__ == "__main__":
    _worker(sys.argv[1])
