"""MiniLM sentences per second, for ``python -m refcore launch`` to compare instance layouts.

``python -m refcore launch [--instances N] -m refcore.models.throughput [--seconds 20]`` runs
all-MiniLM-L6-v2 (real weights, batch 8 x 128 tokens) under `refcore.optimize` in each instance
(or eager with ``--eager``), waits at `refcore.launch.barrier` until every instance is warm, then
runs batches for ``--seconds`` and reports its rate; the launcher adds the instances' rates up.
With ``--gap-ms`` it idles between batches, as a server between requests, and prints the median
latency only. Threads: what the launcher set (``OMP_NUM_THREADS``), or torch's default.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    import refcore
    import refcore.runtime
    from refcore import launch
    from refcore.models import zoo

    ap = argparse.ArgumentParser(prog="python -m refcore.models.throughput")
    ap.add_argument("--seconds", type=float, default=20.0, help="timed part per instance (20)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--eager", action="store_true", help="torch as it is, no refcore.optimize")
    ap.add_argument("--provider", default="auto")
    ap.add_argument("--streams", type=int, default=1,
                    help="split each batch over this many streams (refcore.runtime)")  # fmt: skip
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle this long between batches (a server between requests)")  # fmt: skip
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    model = zoo.minilm()
    inputs = zoo.inputs("minilm", args.batch, args.seq)
    if args.eager:
        model = model.to(dtype)
    else:
        model = refcore.optimize(model, dtype=dtype, provider=args.provider, example_inputs=inputs)
    if args.streams > 1:
        model = refcore.runtime.MultiStream(model, streams=args.streams)
    with torch.no_grad():
        for _ in range(3):
            model(**inputs)
        launch.barrier()
        lat: list[float] = []
        t0 = time.perf_counter()
        while not lat or time.perf_counter() - t0 < args.seconds:
            if args.gap_ms:
                time.sleep(args.gap_ms / 1e3)
            t = time.perf_counter()
            model(**inputs)
            lat.append(time.perf_counter() - t)
        secs = time.perf_counter() - t0
    mode = "eager" if args.eager else f"refcore.optimize({args.provider})"
    how = f"{args.streams} streams" if args.streams > 1 else f"{torch.get_num_threads()} threads"
    print(f"MiniLM b{args.batch} s{args.seq} {args.dtype} {mode}, {how}: {len(lat)} batches "
          f"in {secs:.1f} s, median latency {statistics.median(lat) * 1e3:.2f} ms")  # fmt: skip
    if not args.gap_ms:  # with gaps the rate is the gaps', not the model's
        launch.report(len(lat) * args.batch / secs, "sentences/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
