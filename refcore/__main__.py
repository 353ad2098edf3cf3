"""Command line: ``python -m refcore {demo,info,bench}``."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys


def _info() -> int:
    import refcore

    print(f"refcore {refcore.__version__}\nCPU: {refcore.cpu.describe()}\nproviders:")
    for name, av in refcore.providers().items():
        print(f"  {name:<10} {av}")
    print(f"ops ({len(refcore.ops())}): {', '.join(refcore.ops())}")
    return 0


def _build(force: bool) -> int:
    try:
        import refcore_native
    except ImportError:
        hint = "pip install -e providers/native"
        print(f"the native provider is not installed ({hint})", file=sys.stderr)
        return 1
    try:
        path = refcore_native.build(force=force)
    except refcore_native.BuildError as e:
        print(f"native build failed: {e}", file=sys.stderr)
        return 1
    print(f"native kernels built: {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    import refcore
    from refcore import bench

    console = Console(width=None if sys.stdout.isatty() else 200)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": refcore.cpu.describe(),
        "threads": bench.THREADS,
        "python": platform.python_version(),
        "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"),
    }
    console.print(f"{meta['date']}  {meta['cpu']}  threads={bench.THREADS}")
    limits = None
    if not args.no_probe:
        with console.status("probing machine limits"):
            limits = bench.probe()
        console.print(f"limits (through torch, this run): {limits}")
    with console.status("benchmarking") as status:
        rows = bench.bench_ops(args.op, args.provider, args.dtype or ("float32", "bfloat16"),
                               args.repeat, progress=status.update)  # fmt: skip
    cells = bench.table(rows, limits)
    t = Table(title=f"medians of {args.repeat} interleaved runs after warm-up; x = torch/provider")
    for h in cells[0]:
        t.add_column(h, justify="left" if h in ("op", "shape", "dtype") else "right")
    for r in cells[1:]:
        t.add_row(*r)
    console.print(t)
    missing: dict[str, set[str]] = {}
    for r in rows:
        for p, why in r.declined.items():
            if why.startswith("implements no kernel"):
                missing.setdefault(p, set()).add(r.op)
            else:
                console.print(f"  {r.op} {r.shape} {r.dtype}: {p} not run ({why})")
    for p, ops in sorted(missing.items()):
        console.print(f"  {p} has no kernel for: {', '.join(sorted(ops))}")
    if args.json:
        bench.write_json(args.json, rows, limits, meta)
    if args.plot:
        bench.plot(args.plot, rows)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(bench.markdown(rows, limits, {**meta, "repeat": args.repeat}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="encode sentences with all-MiniLM-L6-v2 through refcore ops")
    demo.add_argument("--provider", default="auto", help="auto, reference, numba, native, ...")
    sub.add_parser("info", help="CPU features, providers, ops")
    build = sub.add_parser("build", help="compile the native provider's kernels into the cache now")
    build.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    bench = sub.add_parser("bench", help="benchmarks against stock torch")
    bench.add_argument("what", choices=["ops"], help="what to benchmark")
    bench.add_argument("--op", action="append", help="op name (repeatable); default: all")
    bench.add_argument("--provider", action="append", help="provider (repeatable); default: all")
    bench.add_argument("--dtype", action="append", choices=["float32", "bfloat16"])
    bench.add_argument("--repeat", type=int, default=5, help="timed rounds per row (median)")
    bench.add_argument("--json", help="write machine-readable results here")
    bench.add_argument("--plot", help="write a bar chart (PNG) of ratios to torch here")
    bench.add_argument("--markdown", help="write the table as Markdown here (for README)")
    bench.add_argument("--no-probe", action="store_true", help="skip the machine-limits probe")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from refcore.demo import main as demo_main

        return demo_main(args.provider)
    if args.command == "bench":
        return _bench(args)
    if args.command == "build":
        return _build(args.force)
    return _info()


if __name__ == "__main__":
    sys.exit(main())
