"""``python -m refcore demo``: all-MiniLM-L6-v2 on real weights, through refcore's ops.

Encodes a few sentences with the model's real weights twice: through `refcore.run` (auto: the best
available provider per op, falling back and saying why) and through torch's own functions. Prints
the agreement (cosine similarity per sentence, fp32 and bf16), the sentence-similarity matrix, and
which kernel ran each op (`refcore.explain`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

import refcore
from refcore.models.minilm import MiniLM, torch_ops

SENTENCES = (
    "The cat sits on the mat.",
    "A kitten is resting on a rug.",
    "Stock markets fell sharply on Tuesday.",
    "Shares dropped steeply at the start of the week.",
)


class RecordingOps:
    """An ``ops`` callable over `refcore.run` that counts calls and keeps one explanation per op."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.counts: collections.Counter[str] = collections.Counter()
        self.explained: dict[str, refcore.Explanation] = {}

    def __call__(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.counts[name] += 1
        if name not in self.explained:
            self.explained[name] = refcore.explain(name, *args, provider=self.provider, **kwargs)
        return refcore.run(name, *args, provider=self.provider, **kwargs)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(provider: str = "auto") -> int:
    print("refcore demo: all-MiniLM-L6-v2 (real weights) encoded through refcore ops")
    print(f"CPU: {refcore.cpu.describe()}")
    print("providers:")
    for name, av in refcore.providers().items():
        print(f"  {name:<10} {av}")
    model = MiniLM.load()
    for dtype in ("float32", "bfloat16"):
        rec = RecordingOps(provider)
        ours = model.encode(SENTENCES, rec, dtype=dtype)
        theirs = model.encode(SENTENCES, torch_ops(), dtype=dtype, as_torch=True)
        cos = (ours * theirs).sum(1)
        print(f"\n[{dtype}] refcore (provider={provider}) against torch")
        print(f"  cosine(refcore, torch) per sentence: {' '.join(f'{c:.6f}' for c in cos)}")
        sim = ours @ ours.T
        print("  sentence similarity (refcore):")
        for s, row in zip(SENTENCES, sim):
            print(f"    {' '.join(f'{v:5.2f}' for v in row)}  {s}")
    print(f"\nwhich kernel ran each op ({sum(rec.counts.values())} op calls per encode):")
    rows = [("op", "calls", "ran", "fallbacks / reasons")]
    for name, n in sorted(rec.counts.items()):
        why = rec.explained[name]
        ran = "/".join(why.chosen) if why.chosen else "none"
        first: dict[str, str] = {}  # one reason per provider: its variants usually agree
        for c in why.candidates:
            if c.verdict not in ("chosen", "not tried"):
                first.setdefault(c.provider, f"{c.provider}: {c.verdict}")
        notes = "; ".join(first.values())
        rows.append((name, str(n), ran, notes or "-"))
    print(_table(rows))
    print(f"\nexplain for one call:\n{next(iter(rec.explained.values()))}")
    worst = float(np.min(cos))
    return 0 if worst > 0.99 else 1
