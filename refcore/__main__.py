"""Command line: ``python -m refcore {demo,generate,info,build,sanitize,bench,fuzz}``."""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def _info() -> int:
    import refcore

    print(f"refcore {refcore.__version__}\nCPU: {refcore.cpu.describe()}\nproviders:")
    for name, av in refcore.providers().items():
        print(f"  {name:<10} {av}")
    print(f"ops ({len(refcore.ops())}): {', '.join(refcore.ops())}")
    return 0


def _build(force: bool) -> int:
    """Run every installed provider's ahead-of-time build hook (`Provider.build`)."""
    from refcore.provider import installed

    builders = {n: p.build for n, p in installed().items() if p.build is not None}
    if not builders:
        print("no installed provider builds anything ahead of time", file=sys.stderr)
        return 1
    failed = 0
    for name, build in sorted(builders.items()):
        try:
            print(f"{name}: {build(force)}")
        except RuntimeError as e:
            print(f"{name} build failed: {e}", file=sys.stderr)
            failed = 1
    return failed


#: what a sanitized run sets besides the providers' own variables: outputs are exact-size
#: allocations (a pooled block has up to 25% slack, where a write past the output would go unseen)
#: and the tests are no rebuilds from scratch (a sanitized build takes minutes)
SANITIZE_ENV = {"REFCORE_BUFFER_POOL_MB": "0"}
SANITIZE_PYTEST = ("-p", "no:cacheprovider", "--capture=sys", "-m", "not rebuilds")


def _glob(pattern: str, root: Path) -> list[str]:
    return sorted(glob.glob(pattern, root_dir=root))


def _sanitize(providers: list[str] | None, profile: str, pytest_args: list[str]) -> int:
    """Run each provider's kernel tests (`Provider.sanitize`) in pytest processes under its
    sanitizers. ``--capture=sys`` leaves file descriptor 2 alone: a sanitizer report, which ends
    the process, reaches the terminal instead of pytest's capture file."""
    from refcore.provider import installed

    hooks = {n: p.sanitize for n, p in installed().items() if p.sanitize is not None}
    unknown = sorted(set(providers or ()) - set(hooks))
    if unknown or not hooks:
        print(f"no sanitized run for {unknown or 'any installed provider'}; providers with one: "
              f"{sorted(hooks) or 'none'}", file=sys.stderr)  # fmt: skip
        return 2
    root = Path(__file__).resolve().parents[1]  # the project: the tests live in a checkout
    if not (root / "tests").is_dir():
        print(f"no tests/ beside {root / 'refcore'}: run from a source checkout", file=sys.stderr)
        return 2
    failed = 0
    for name in providers or sorted(hooks):
        try:
            env, selections = hooks[name]()
        except RuntimeError as e:
            print(f"{name}: no sanitized run here: {e}", file=sys.stderr)
            failed = 1
            continue
        full_env = {**os.environ, **SANITIZE_ENV, **env, "REFCORE_HYPOTHESIS_PROFILE": profile}
        for sel in selections:
            args = [p for a in sel for p in (_glob(a, root) if "*" in a else [a])]
            cmd = [sys.executable, "-m", "pytest", *SANITIZE_PYTEST, *args, *pytest_args]
            print(f"--- {name} sanitized: {' '.join(cmd[1:])}", flush=True)
            t0 = time.monotonic()
            rc = subprocess.run(cmd, cwd=root, env=full_env).returncode
            print(f"--- {name}: exit status {rc} in {time.monotonic() - t0:.0f} s", flush=True)
            failed |= rc != 0
    return int(failed)


def _meta() -> dict[str, object]:
    import refcore
    from refcore import bench

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": refcore.cpu.describe(),
        "machine": refcore.cpu.machine(),
        "threads": bench.THREADS,
        "python": platform.python_version(),
        "libraries": bench.libraries(),
        "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"),
    }


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def _print_table(console, title: str, cells: list[list[str]], left: tuple[str, ...]) -> None:
    from rich.table import Table

    t = Table(title=title)
    for h in cells[0]:
        t.add_column(h, justify="left" if h in left else "right")
    for r in cells[1:]:
        t.add_row(*r)
    console.print(t)


def _bench_models(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from refcore.models import bench as mbench
    from refcore.models import zoo

    console, meta = _console(), _meta()
    provider = (args.provider or ["auto"])[0]
    meta.update(repeat=args.repeat, provider=provider, threads=args.threads)
    console.print(f"{meta['date']}  {meta['cpu']}  threads={meta['threads']}  provider={provider}")
    others = sorted(set(args.model or ()) - set(zoo.MODELS))
    if others:
        raise SystemExit(f"bench models: --model {', '.join(others)}: GNN models are "
                         "`python -m refcore bench gnn`'s")  # fmt: skip
    with console.status("benchmarking models") as status:
        rows = mbench.bench_models(args.model or zoo.MODELS, args.dtype or ("float32", "bfloat16"),
                                   args.mode or mbench.MODES, provider, args.repeat,
                                   progress=status.update, threads=args.threads)  # fmt: skip
    title = (f"medians of {args.repeat} interleaved rounds after warm-up; "
             "x = the median of the rounds' eager / mode")  # fmt: skip
    _print_table(console, title, mbench.table(rows), ("model", "shape", "dtype", "mode", "note"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(mbench.markdown(rows, meta))
    return 0


def _bench_overhead(args: argparse.Namespace) -> int:
    from refcore.bench import graph_overhead_rows, overhead_rows

    console = _console()
    provider = (args.provider or ["native"])[0]
    cells = overhead_rows(provider, args.repeat)
    _print_table(console, f"per-call cost of routing (provider={provider}), µs", cells, ("call",))
    cells = graph_overhead_rows(provider, args.repeat)
    _print_table(console, f"a graph of 100 tiny calls (provider={provider}), µs per node", cells,
                 ("choice", "run"))  # fmt: skip
    return 0


def _bench_optim(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from refcore import bench_optim

    console, meta = _console(), _meta()
    meta.update(repeat=args.repeat, threads=args.threads)
    console.print(f"{meta['date']}  {meta['cpu']}  threads={args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    names = args.optimizer or list(bench_optim.CLASSES)
    with console.status("stepping optimizers") as status:
        rows = bench_optim.optim_rows(names, args.repeat, progress=status.update)
    title = f"one step, medians of {args.repeat} interleaved rounds; x = torch / refcore"
    _print_table(console, title, bench_optim.table(rows), ("optimizer", "ran"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


def _bench_gnn(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from refcore import bench_gnn
    from refcore.models import gnn

    console, meta = _console(), _meta()
    meta.update(repeat=args.repeat, threads=args.threads)
    console.print(f"{meta['date']}  {meta['cpu']}  threads={args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    models = args.model or list(gnn.MODELS)
    unknown = sorted(set(models) - set(gnn.MODELS))
    if unknown:
        raise SystemExit(f"bench gnn: --model expected any of {gnn.MODELS}, got {unknown}")
    with console.status("running GNN models") as status:
        rows = bench_gnn.gnn_rows(models, args.dtype or ["float32"], args.repeat,
                                  progress=status.update)  # fmt: skip
    title = f"full-graph inference, medians of {args.repeat} interleaved rounds; x pyg = pyg / mode"
    _print_table(console, title, bench_gnn.table(rows), ("model", "mode", "note"))
    train = []
    if args.train:
        with console.status("training steps") as status:
            train = bench_gnn.train_rows(models, args.dtype or ["float32"], args.repeat,
                                         progress=status.update)  # fmt: skip
        title = (f"one full-graph training step (forward, loss, backward, Adam), medians of "
                 f"{args.repeat} interleaved rounds; x pyg = pyg / mode")  # fmt: skip
        _print_table(console, title, bench_gnn.table(train), ("model", "mode", "note"))
    rss = []
    if args.rss:
        with console.status("two forwards per process on the large graph") as status:
            rss = bench_gnn.rss_rows(models, progress=status.update)
        title = "two forwards in a fresh process: each one's peak resident memory over the start"
        _print_table(console, title, bench_gnn.rss_table(rss), ("model", "mode", "note"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows],
                       "train": [asdict(r) for r in train],
                       "rss": [asdict(r) for r in rss]}, f, indent=1)  # fmt: skip
    return 0


def _bench_memory(args: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from refcore import bench_memory

    console, meta = _console(), _meta()
    console.print(f"{meta['date']}  {meta['cpu']}")
    with console.status("calling kernels") as status:
        rows = bench_memory.memory_rows(args.provider, args.calls, progress=status.update)
    title = f"RSS growth over {args.calls} calls per provider after warm-up (mixed shapes)"
    _print_table(console, title, bench_memory.table(rows), ("provider",))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0 if all(r.within_budget for r in rows) else 1


def _bench_threads(args: argparse.Namespace) -> int:
    from refcore import bench_threads

    console, meta = _console(), _meta()
    console.print(f"{meta['date']}  {meta['cpu']}  threads={args.threads}")
    befores = ["torch", *(args.provider or [])]
    with console.status("probing") as status:
        rows = bench_threads.rows(befores, args.repeat, args.threads, progress=status.update)
    title = (f"torch.mm 256x256 fp32 after a parallel softmax and an idle gap, median of "
             f"{args.repeat}; one process per OpenMP wait policy")  # fmt: skip
    _print_table(console, title, bench_threads.table(rows), ("policy", "before"))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from refcore import bench

    if args.what == "threads":
        return _bench_threads(args)
    if args.what == "memory":
        return _bench_memory(args)
    if args.what == "models":
        return _bench_models(args)
    if args.what == "overhead":
        return _bench_overhead(args)
    if args.what == "optim":
        return _bench_optim(args)
    if args.what == "gnn":
        return _bench_gnn(args)
    console, meta = _console(), _meta()
    console.print(f"{meta['date']}  {meta['cpu']}  threads={bench.THREADS}")
    limits = None
    if not args.no_probe:
        with console.status("probing machine limits"):
            limits = bench.probe()
        console.print(f"limits (through torch, this run): {limits}")
    with console.status("benchmarking") as status:
        rows = bench.bench_ops(args.op, args.provider, args.dtype or ("float32", "bfloat16"),
                               args.repeat, progress=status.update)  # fmt: skip
    title = f"medians of {args.repeat} interleaved runs after warm-up; x = torch/provider"
    _print_table(console, title, bench.table(rows, limits), ("op", "shape", "dtype"))
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


def _fuzz(args: argparse.Namespace) -> int:
    """Fuzz kernels (`refcore.fuzz`) in worker processes; print the outcome table."""
    import json

    from refcore import fuzz_run

    if args.replay:
        return _fuzz_replay(args.replay)
    calls = args.calls or (100_000 if args.profile == "fuzz" else 200)
    providers = args.provider or ["native", "numba"]
    kernels = fuzz_run.kernels_of(providers, args.ops)
    cfg = fuzz_run.Settings(seed=args.seed, batch=args.batch, timeout=args.timeout,
                            max_seconds=args.max_seconds)  # fmt: skip
    console, start = _console(), datetime.datetime.now(datetime.timezone.utc)
    console.print(f"{start:%Y-%m-%d %H:%M:%S} UTC  {refcore_cpu()}  {len(kernels)} kernels x "
                  f"{calls} calls, seed {args.seed}, {args.jobs} worker(s)")  # fmt: skip
    shown: set[tuple[str, int]] = set()

    def save(tallies, secs: float) -> None:
        if args.json:  # rewritten after every batch: a long run's figures survive an interruption
            meta = {**_meta(), "calls_per_kernel": calls, "seed": args.seed, "wall_s": secs}
            with open(args.json, "w") as fh:
                json.dump({"meta": meta, "kernels": [t.as_json() for t in tallies]}, fh, indent=1)

    with console.status("fuzzing") as status:

        def progress(tallies):
            done = sum(t.calls for t in tallies)
            status.update(f"fuzzing: {done} of {calls * len(tallies)} calls")
            for t in tallies:
                for f in t.failures:
                    if (t.name, f["seed"]) not in shown:
                        shown.add((t.name, f["seed"]))
                        console.print(
                            f"{f['outcome']} {t.name}@{f['seed']}: {f['call']}\n  "
                            f"{f['detail'][:600]}",
                            markup=False,
                            highlight=False,
                        )
            save(tallies, (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds())

        tallies = fuzz_run.fuzz(kernels, calls, args.jobs, cfg, progress)
        status.update("replaying failures in fresh workers")
        fuzz_run.replay_failures(tallies, cfg)
    secs = (datetime.datetime.now(datetime.timezone.utc) - start).total_seconds()
    title = f"fuzz outcomes per kernel ({secs:.0f} s wall); raised = the reference raised it too"
    _print_table(console, title, fuzz_run.table(tallies), ("kernel", "raised (by type)"))
    for t in tallies:
        for f in t.failures:
            hist = {
                True: " (passes in a fresh worker: depends on earlier calls)",
                False: " (fails in a fresh worker too)",
            }.get(f.get("history_dependent"), "")
            console.print(f"{f['outcome'].upper()} {t.name}{hist}: replay with "
                          f"--replay {t.name}@{f['seed']}\n  call: {f['call']}\n  {f['detail']}",
                          markup=False, highlight=False)  # fmt: skip
    for t in tallies:
        for d in t.disputes:
            replay = f"--replay {t.name}@{d['seed']}"
            console.print(f"disputed {t.name}: {replay}\n  {d['detail'][:600]}",
                          markup=False, highlight=False)  # fmt: skip
    save(tallies, secs)
    return 1 if any(t.wrong or t.crash or t.hang for t in tallies) else 0


def _launch(args: argparse.Namespace) -> int:
    from refcore import launch

    opts = launch.Options(args.instances, args.cores_per_instance, args.cores, args.omp_wait,
                          args.allocator)  # fmt: skip
    try:
        cmd = launch.command(args.program, module=args.module)
        plan = launch.plan(opts)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(launch.describe(plan, cmd))
        return 0
    return launch.run(plan, cmd, args.log_dir)


def refcore_cpu() -> str:
    import refcore

    return refcore.cpu.describe()


def _fuzz_replay(what: str) -> int:
    """Rerun one fuzz call in this process: ``provider/kernel@seed``."""
    from refcore.fuzz import draw_call, judge
    from refcore.fuzz_run import _scoped
    from refcore.provider import installed, using_providers
    from refcore.registry import default_registry

    name, _, seed = what.partition("@")
    pname, _, kname = name.partition("/")
    if pname not in installed() or not seed.isdigit():
        raise SystemExit(f"fuzz --replay: expected provider/kernel@seed with provider one of "
                         f"{sorted(installed())}, got {what!r}")  # fmt: skip
    kernels = {k.name: k.op for k in installed()[pname].kernels}
    if kname not in kernels:
        raise SystemExit(f"fuzz --replay: {pname} has no kernel {kname!r}; "
                         f"its kernels: {', '.join(sorted(kernels))}")  # fmt: skip
    op = kernels[kname]
    fc = draw_call(default_registry().op(op), int(seed))
    print(fc.describe())
    with using_providers(_scoped(pname, op, kname, None)):
        outcome, detail = judge(fc, pname)
    print(outcome, detail)
    return 0 if outcome.split(":")[0] in ("ok", "raised", "declined") else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="all-MiniLM-L6-v2: eager vs refcore.optimize")
    demo.add_argument("--provider", help="native, numba, auto, ...; default: native if available")
    demo.add_argument("--repeat", type=int, default=5, help="timed rounds (median)")
    gen = sub.add_parser("generate", help="SmolLM2-135M-Instruct continues a prompt (greedy)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--dtype", default="float32", help="float32 / bf16")
    gen.add_argument("--provider", default="auto", help="refcore.optimize's provider (auto)")
    gen.add_argument("--eager", action="store_true", help="run the model as it is, no refcore")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument(
        "--scheme",
        choices=["woq_int8", "woq_int4"],
        help="quantize the linear layers first (specs/schemes.yaml)",
    )
    gen.add_argument("--group-size", type=int,
                     help="woq: one scale per this many weights (0: per channel, woq_int8 only; "
                     "default 64 for woq_int8, 32 for woq_int4)")  # fmt: skip
    sub.add_parser("info", help="CPU features, providers, ops")
    build = sub.add_parser(
        "build", help="compile the providers' kernels (native: C) into the cache now"
    )
    build.add_argument("--force", action="store_true", help="rebuild even if the cache is valid")
    san = sub.add_parser(
        "sanitize",
        help="run providers' kernel tests under sanitizers (native: ASan + UBSan build)",
        description="Arguments after -- go to pytest, e.g. `sanitize -- -x -q`.",
    )
    san.add_argument("--provider", action="append", help="provider (repeatable); default: all")
    san.add_argument(
        "--hypothesis-profile", default="sanitize", help="tests/conftest.py profile (sanitize)"
    )
    san.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    bench = sub.add_parser("bench", help="benchmarks against stock torch")
    bench.add_argument(
        "what",
        choices=["ops", "models", "overhead", "memory", "optim", "gnn", "threads"],
        help="ops (kernels), models (real models, 4 modes), overhead (routing µs), "
        "threads (idle OpenMP threads' cost per wait policy), "
        "memory (RSS growth over many calls), optim (an optimizer step over 25M parameters), "
        "gnn (PyG models on a 100k-node graph)",
    )
    bench.add_argument(
        "--optimizer",
        action="append",
        choices=["sgd", "adagrad", "adam", "adamw", "lamb"],
        help="bench optim: optimizer (repeatable); default: all",
    )
    bench.add_argument(
        "--model",
        action="append",
        choices=["minilm", "resnet50", "llama", "unet", "gcn", "sage", "gin"],
        help="bench models: model (repeatable); default: all; bench gnn: gcn, sage, gin",
    )
    from refcore.models.bench import MODES  # no torch import

    bench.add_argument(
        "--mode",
        action="append",
        choices=MODES,
        help="bench models: mode (repeatable; eager always runs); default: all",
    )
    bench.add_argument("--op", action="append", help="op name (repeatable); default: all")
    bench.add_argument("--provider", action="append", help="provider (repeatable); default: all")
    bench.add_argument("--dtype", action="append", choices=["float32", "bfloat16"])
    bench.add_argument("--repeat", type=int, default=5, help="timed rounds per row (median)")
    bench.add_argument(
        "--calls", type=int, default=100_000, help="bench memory: calls per provider (100000)"
    )
    bench.add_argument("--threads", type=int, default=2, help="bench models / optim: threads")
    bench.add_argument(
        "--rss", action="store_true",
        help="bench gnn: also each mode's peak memory on a 1M-node / 16M-edge graph",
    )  # fmt: skip
    bench.add_argument(
        "--train", action="store_true",
        help="bench gnn: also one full-graph training step per mode",
    )  # fmt: skip
    bench.add_argument("--json", help="write machine-readable results here")
    bench.add_argument("--plot", help="write a bar chart (PNG) of ratios to torch here")
    bench.add_argument("--markdown", help="write the table as Markdown here (for README)")
    bench.add_argument("--no-probe", action="store_true", help="skip the machine-limits probe")
    from refcore import launch as launch_mod  # no torch import

    la = sub.add_parser(
        "launch",
        help="run a script pinned to cores, thread variables set (N instances: throughput mode)",
        description=launch_mod.__doc__.split("Example:")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    la.add_argument("--instances", type=int, default=1, help="instances over disjoint cores (1)")
    la.add_argument("--cores-per-instance", type=int, help="default: the cores split evenly")
    la.add_argument("--cores", type=launch_mod.parse_cores, help="e.g. 0-3,8; default: all allowed")
    la.add_argument("--omp-wait", choices=launch_mod.WAITS, default="auto",
                    help="libgomp's idle policy: auto (its default), passive, active")  # fmt: skip
    la.add_argument("--allocator", choices=launch_mod.ALLOCATORS, default="auto",
                    help="LD_PRELOAD jemalloc / tcmalloc if installed (auto: either)")  # fmt: skip
    la.add_argument("--log-dir", help="also write each instance's output to instance_<i>.log here")
    la.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    la.add_argument("-m", dest="module", action="store_true",
                    help="the program is a module: python -m MODULE args...")  # fmt: skip
    la.add_argument("program", nargs=argparse.REMAINDER, help="script.py args... (or a program)")
    fz = sub.add_parser("fuzz", help="bad and extreme inputs per kernel, in worker processes")
    fz.add_argument("--provider", action="append", help="native / numba (repeatable); default both")
    fz.add_argument("--ops", nargs="+", help="only these ops' kernels")
    fz.add_argument("--calls", type=int, help="calls per kernel (default 200; profile fuzz: 1e5)")
    fz.add_argument(
        "--profile",
        choices=["short", "fuzz"],
        default=os.environ.get("REFCORE_FUZZ_PROFILE", "short"),
        help="short (200 calls per kernel) or fuzz (100,000); env REFCORE_FUZZ_PROFILE",
    )
    fz.add_argument("--jobs", type=int, default=1, help="worker processes")
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--batch", type=int, default=500, help="calls per batch sent to a worker")
    fz.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="CPU seconds one call may take (wall seconds: 10x) before it is a hang",
    )
    fz.add_argument("--max-seconds", type=float, help="start no batch after this many seconds")
    fz.add_argument("--json", help="write the outcome counts and failures here")
    fz.add_argument("--replay", help="rerun one call in-process: provider/kernel@seed")
    args = parser.parse_args(argv)
    if args.command == "fuzz":
        return _fuzz(args)
    if args.command == "launch":
        return _launch(args)
    if args.command == "demo":
        from refcore.demo import main as demo_main

        return demo_main(args.provider, args.repeat)
    if args.command == "generate":
        from refcore.generate import main as generate_main

        return generate_main(args.prompt, args.max_new_tokens, args.dtype, args.provider,
                             args.eager, args.chat, args.scheme,
                             args.group_size)  # fmt: skip
    if args.command == "bench":
        return _bench(args)
    if args.command == "build":
        return _build(args.force)
    if args.command == "sanitize":
        return _sanitize(args.provider, args.hypothesis_profile, args.pytest_args)
    return _info()


if __name__ == "__main__":
    sys.exit(main())
