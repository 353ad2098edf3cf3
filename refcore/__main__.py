"""Command line: ``python -m refcore {demo,info}``."""

from __future__ import annotations

import argparse
import sys


def _info() -> int:
    import refcore

    print(f"refcore {refcore.__version__}\nCPU: {refcore.cpu.describe()}\nproviders:")
    for name, av in refcore.providers().items():
        print(f"  {name:<10} {av}")
    print(f"ops ({len(refcore.ops())}): {', '.join(refcore.ops())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="encode sentences with all-MiniLM-L6-v2 through refcore ops")
    demo.add_argument("--provider", default="auto", help="auto, reference, numba, native, ...")
    sub.add_parser("info", help="CPU features, providers, ops")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from refcore.demo import main as demo_main

        return demo_main(args.provider)
    return _info()


if __name__ == "__main__":
    sys.exit(main())
