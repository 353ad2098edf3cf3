"""``python -m refcore bench models``: real models under eager, torch.compile, refcore.enable and
refcore.optimize, fp32 and bf16, measured in one process as ratios to eager; and, for the forward
models in fp32, static int8: ``int8`` (`refcore.quantize`, x86_static_int8; ``int8_optimize``
the quantized model through `refcore.optimize`, which folds its batch-norms and fuses its
post-ops; ``int8_w7_optimize`` the same under x86_static_int8_w7, 7-bit weights) against
``torch_int8``, torch's own int8 path (torchao's pt2e flow with X86InductorQuantizer, then
torch.compile with freezing; torchao is a benchmark extra), both calibrated on the timed input.

Every mode of a (model, dtype) pair is warmed up (compilation happens there), then timed in
interleaved rounds: each round runs every mode once, and each mode reports the median of its
rounds (its ratio to eager: the median of the rounds' eager / mode ratios). Forward models
time one call; the causal LM times per-token greedy decode (the median step of a short
generation after a fixed prompt, KV cache on).

Example:
    >>> rows = bench_models(["minilm"], ["float32"], ["eager", "optimize"])  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from refcore import choice
from refcore.bench import machine_lines
from refcore.models import zoo

MODES = (
    "eager",
    "compile",
    "enable",
    "optimize",
    "int8",
    "int8_optimize",
    "int8_w7_optimize",
    "torch_int8",
)
INT8_MODES = ("int8", "int8_optimize", "int8_w7_optimize", "torch_int8")
# model -> (batch, size) : batch 8 x seq 128, batch 4 x 224^2, decode after a 32-token prompt
# unet: a classifier-free-guidance batch of 2 at 32 x 32 latents (a 256 x 256 image)
SHAPES = {"minilm": (8, 128), "resnet50": (4, 224), "llama": (1, 32), "unet": (2, 32)}
DECODE_STEPS = 8


@dataclass
class ModelRow:
    model: str
    shape: str
    dtype: str
    mode: str
    ms: float | None  # median per call (per token for decode); None when the mode failed
    eager_ms: float
    eager_fp32_ms: float | None = None
    note: str = ""
    # the median over rounds of eager's time / this mode's time in the same round
    paired: float | None = None

    @property
    def ratio(self) -> float | None:
        """eager time / this mode's time, above 1 the mode is faster: the median of the rounds'
        ratios (each round times eager and the mode back to back), so a drift of the shared
        machine's speed between rounds cancels within each round, as in `choice.against_eager`.
        The ratio of the medians moved by up to 0.09 from it: MiniLM fp32 read 0.91x where the
        optimized model ran the eager code itself (Intel Xeon AMX, eager 183 ms in one run, 214
        ms in the next)."""
        if self.paired is not None:
            return self.paired
        return self.eager_ms / self.ms if self.ms else None


def _shape_label(name: str, batch: int, size: int) -> str:
    if name == "resnet50":
        return f"{batch}x3x{size}x{size}"
    if name == "llama":
        return f"decode/token, prompt {size}"
    if name == "unet":
        return f"{batch}x4x{size}x{size} latents"
    return f"{batch}x{size}"


def _runner(mode: str, model: Any, dtype: Any, provider: str,
            inputs: dict[str, Any]) -> tuple[Any, str]:  # fmt: skip
    """A callable with the model's interface for ``mode``, and a note on what it is."""
    import torch

    import refcore

    if mode == "eager":
        return model, ""
    if mode in ("int8", "int8_optimize", "int8_w7_optimize"):
        scheme = "x86_static_int8_w7" if mode == "int8_w7_optimize" else "x86_static_int8"
        q = refcore.quantize(model, scheme, provider, calibration=[inputs])
        if mode == "int8":
            return q, f"{scheme}, provider={provider}"
        return refcore.optimize(q, provider=provider), f"{scheme} + optimize, {provider}"
    if mode == "torch_int8":
        return _torch_int8(model, inputs), "torchao pt2e X86InductorQuantizer + inductor"
    if mode == "compile":
        torch._inductor.config.freezing = True  # a bench process: inference with frozen weights
        return torch.compile(model), "inductor, freezing on"
    if mode == "enable":

        def routed(*args: Any, **kwargs: Any) -> Any:
            with refcore.enabled(provider):
                return model(*args, **kwargs)

        return routed, f"provider={provider}"
    fast = refcore.optimize(model, provider=provider)
    return fast, f"provider={provider}"


def verdicts(model: Any) -> str:
    """What an optimized model runs per input class after its warm-up: its graph or its eager
    code, with the paired ratio that decided (`choice.against_eager`; "" for other modes), so a
    row near 1.0x says whether it is the graph's speed or eager's own.

    Example:
        >>> verdicts(object())
        ''
    """
    said = []
    for m in getattr(model, "verdicts", {}).values():
        if isinstance(m, choice.Measurement) and m.kernel_us > 0:
            what = "graph" if m.faster else "eager code"
            said.append(f"{what} ({m.torch_us / m.kernel_us:.2f}x in its trial)")
        elif isinstance(m, choice.CallTrial):
            said.append("graph and eager code in turn (still on trial)")
        elif isinstance(m, str):
            said.append(f"graph (untimed: {m})")
    return ", ".join(said)


def _torch_int8(model: Any, inputs: dict[str, Any]) -> Any:
    """torch's int8 path as its docs give it: export, prepare_pt2e with the x86 inductor
    quantizer's default (static) config, calibrate, convert_pt2e, compile with freezing."""
    import torch
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    graph = torch.export.export(model, (), inputs).module()
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        prepared(**inputs)
    torch._inductor.config.freezing = True
    return torch.compile(convert_pt2e(prepared))


def _warm_ups(name: str) -> int:
    """Untimed calls (decodes for the causal LM) before the rounds: 2, and for decode enough
    that an optimized model's `choice.CallTrial` (a KV-cache call is timed against eager on
    its own calls, half of them eager) has decided before timing starts, as it has in any
    generation longer than a few dozen tokens. With 2, the first timed round still ran the
    trial, half its calls on a graph the trial then found slower than eager."""
    if name != "llama":
        return 2
    trial = choice.TRIAL_WARM + 1 + 2 * choice.GRAPH_MAX_ROUNDS  # its most calls, all clean
    return 1 + -(-trial // DECODE_STEPS)


def _measure(name: str, fn: Any, inputs: dict[str, Any]) -> float:
    """Seconds: one forward call, or the median decode step for the causal LM."""
    if name == "llama":
        _, steps = zoo.greedy_decode(fn, inputs["input_ids"], DECODE_STEPS)
        return statistics.median(steps)
    t0 = time.perf_counter()
    fn(**inputs)
    return time.perf_counter() - t0


def bench_model(
    name: str,
    dtype_name: str,
    modes: Sequence[str],
    provider: str,
    repeat: int,
    base: Any,
    progress: Callable[[str], None] | None = None,
) -> list[ModelRow]:
    """Rows for one model and dtype (``base``: the fp32 model, left unchanged)."""
    import torch

    dtype = getattr(torch, dtype_name)
    batch, size = SHAPES[name]
    inputs = zoo.inputs(name, batch, size)
    model = base if dtype == torch.float32 else copy.deepcopy(base).to(dtype)
    if dtype != torch.float32:
        inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    runners: dict[str, Any] = {}
    notes: dict[str, str] = {"eager": ""}
    for mode in ("eager", *[m for m in modes if m != "eager"]):
        if mode in INT8_MODES and (dtype != torch.float32 or name == "llama"):
            continue  # int8 rows are for the forward models in fp32
        if progress:
            progress(f"{name} {dtype_name}: preparing {mode}")
        try:
            runners[mode], notes[mode] = _runner(mode, model, dtype, provider, inputs)
            with torch.no_grad():
                for _ in range(_warm_ups(name)):  # compiles, builds, fills caches, decides
                    _measure(name, runners[mode], inputs)
            notes[mode] = "; ".join(filter(None, (notes[mode], verdicts(runners[mode]))))
        except Exception as e:  # a mode that fails is reported, not fatal to the run
            runners.pop(mode, None)
            notes[mode] = f"failed: {type(e).__name__}: {str(e)[:100]}"
    samples: dict[str, list[float]] = {m: [] for m in runners}
    with torch.no_grad():
        for r in range(repeat):
            if progress:
                progress(f"{name} {dtype_name}: round {r + 1}/{repeat}")
            for mode, fn in runners.items():
                samples[mode].append(_measure(name, fn, inputs))
    med = {m: statistics.median(v) * 1e3 for m, v in samples.items()}
    paired = {m: statistics.median(e / t for e, t in zip(samples["eager"], v))
              for m, v in samples.items()}  # fmt: skip
    label = _shape_label(name, batch, size)
    return [ModelRow(name, label, dtype_name, m, med.get(m), med["eager"], note=notes.get(m, ""),
                     paired=paired.get(m))
            for m in ("eager", *[m for m in modes if m != "eager"]) if m in notes]  # fmt: skip


def bench_models(models: Sequence[str] = zoo.MODELS, dtypes: Sequence[str] = ("float32",
                 "bfloat16"), modes: Sequence[str] = MODES, provider: str = "auto",
                 repeat: int = 5, progress: Callable[[str], None] | None = None,
                 threads: int = 2) -> list[ModelRow]:  # fmt: skip
    """Time each model x dtype x mode; rows carry medians and the eager baseline of the dtype."""
    import torch

    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"bench models: unknown modes {bad}; known: {', '.join(MODES)}")
    torch.set_num_threads(threads)
    rows: list[ModelRow] = []
    for name in models:
        if progress:
            progress(f"{name}: loading")
        base = zoo.build(name)
        fp32_eager = None
        for dt in dtypes:
            got = bench_model(name, dt, modes, provider, repeat, base, progress)
            if dt == "float32":
                fp32_eager = got[0].eager_ms
            for r in got:
                r.eager_fp32_ms = fp32_eager
            rows += got
        del base
    return rows


def table(rows: Sequence[ModelRow]) -> list[list[str]]:
    head = ["model", "shape", "dtype", "mode", "ms", "x eager", "x eager fp32", "note"]
    out = [head]
    for r in rows:
        vs32 = f"{r.eager_fp32_ms / r.ms:.2f}x" if r.ms and r.eager_fp32_ms else "-"
        out.append([r.model, r.shape, r.dtype, r.mode, f"{r.ms:.2f}" if r.ms else "-",
                    f"{r.ratio:.2f}x" if r.ratio else "-", vs32, r.note])  # fmt: skip
    return out


def markdown(rows: Sequence[ModelRow], meta: dict[str, Any]) -> str:
    cells = table(rows)
    lines = [
        f"Measured {meta['date']} on {meta['cpu']}, {meta['threads']} threads, medians of "
        f"{meta['repeat']} interleaved rounds after warm-up (`python -m refcore bench models`); "
        "x eager = the median over rounds of eager time / mode time in that round, same dtype.",
        "",
        *machine_lines(meta),
        "| " + " | ".join(cells[0]) + " |",
        "|" + "---|" * len(cells[0]),
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in cells[1:]]
    return "\n".join(lines) + "\n"
