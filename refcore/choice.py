"""Measured choice: a kernel runs instead of torch only where it measured at least torch's speed.

A kernel that accepts a routed call is not necessarily faster than torch on this CPU: the native
provider's thresholds were tuned on one machine, numba's code quality varies by ISA, and the same
shape can go either way on an AVX2-only Zen 3 and an AMX Xeon. So when routing meets a new call
structure, it times every provider kernel that accepts it against torch's own call, on the call's
own arguments, interleaved (torch, kernels, torch, ...), and runs the fastest; a kernel must win
by ``MARGIN``, else torch runs. Each timed call reads its own copy of the arguments (`Rotation`):
their data comes cold from memory, as a model's weights do, while the code stays warm. The
numbers are kept per *shape class* (dims above 8 rounded up to a power of two, so a decode step
whose key length grows by one does not measure again) for the process, and
`refcore.explain` shows them ("measured 1.2 ms vs torch 1.9 ms"). The same timing decides, per
input class, between an optimized model's whole graph and its eager code (`against_eager`).

What is never measured: a kernel its provider declares a correctness fallback (`Kernel.fallback`,
e.g. the native provider's portable C) never runs where torch can run the call; the ``reference``
provider, asked for by name, always runs (it is the meaning, not a speed choice).

``REFCORE_CHOICE=rules`` turns measuring off: the first kernel that accepts the call runs (still
never a fallback). Tests of routing use it so that what ran does not depend on the machine's load;
the kernels themselves are tested against the references directly.

Example:
    >>> m = Measurement(kernel_us=80.0, torch_us=100.0)
    >>> m.faster, str(m)
    (True, 'measured 80.0 us vs torch 100.0 us')
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

ENV = "REFCORE_CHOICE"
MODES = ("measure", "rules")
#: a kernel must measure this much faster than torch to be chosen. Timing one cold call on a
#: shared machine is noisy: ResNet-50 fp32 on Zen 3 chose conv kernels that measured 0.5-6% faster
#: than torch, and in the model the run was as fast as torch alone or slower (0.93-1.08x eager over
#: runs); a kernel within 5% of torch is not a measured win.
MARGIN = 1.05
#: timed rounds per measurement; fewer when the first rounds already differ by ``CLEAR``
ROUNDS = 5
CLEAR = 1.5
#: seconds of timed rounds after which a measurement stops at two rounds whatever the verdict: a
#: call that takes seconds (spmm_reduce on a 1M-node graph, AMD Zen 5: 84-89 s for five rounds of
#: torch and two kernels) is measured well enough by two of them
BUDGET_S = 2.0
#: dims up to this stay exact in a shape class (batch 1 vs 2 matters); larger ones round up to a
#: power of two. Exact up to 64, a Llama decode from a 32-token prompt met a new class at every
#: token and measured again (its SDPA key length 33, 34, ...): 0.77x eager on Zen 3, bf16.
EXACT = 8


def mode() -> str:
    """``measure`` (the default) or ``rules``, from ``REFCORE_CHOICE``."""
    return _mode(os.environ.get(ENV, ""))


@functools.lru_cache(maxsize=8)
def _mode(raw: str) -> str:  # on every routed call (part of the memo key): parsed once per value
    got = raw.strip().lower() or "measure"
    if got not in MODES:
        raise ValueError(f"{ENV}={got!r}: expected one of {', '.join(MODES)}")
    return got


@dataclass(frozen=True)
class Measurement:
    """Best time per call of a kernel and of torch on the same call, in microseconds; for a
    graph timed against eager in paired rounds, ``won``: the share of rounds it was faster in
    (a kept graph needs `KEEP_SHARE` of them besides `MARGIN` on the medians)."""

    kernel_us: float
    torch_us: float
    won: float | None = None

    @property
    def faster(self) -> bool:
        steady = self.won is None or self.won >= KEEP_SHARE
        return steady and self.kernel_us * MARGIN < self.torch_us

    def __str__(self) -> str:
        return self.said("measured", "torch")

    def said(self, what: str, other: str) -> str:
        if math.isinf(self.torch_us):
            return f"{what} {_fmt(self.kernel_us)}; {other} has no kernel for this call"
        got = f"{what} {_fmt(self.kernel_us)} vs {other} {_fmt(self.torch_us)}"
        return got if self.won is None else f"{got}, faster in {self.won:.0%} of rounds"


def _fmt(us: float) -> str:
    return f"{us / 1e3:.2f} ms" if us >= 1e3 else f"{us:.1f} us"


_setup = 0  # first-call work done in this process (`note_setup`)


def note_setup() -> None:
    """Count one piece of first-call work: a capture compiled, a plan made, kernels measured.
    A call during which some ran is no steady-state sample for `CallTrial`."""
    global _setup
    _setup += 1


def setup_count() -> int:
    return _setup


def measure(kernels: dict[str, Callable[[], Any]], torch_fn: Callable[[], Any],
            evict: Callable[[], None] | None = None) -> dict[str, float]:  # fmt: skip
    """Best microseconds per call of torch (key ``"torch"``) and each kernel, interleaved.

    One untimed warm-up call each (first-call costs: a JIT compile, a library load, the buffer
    pool's first block), then up to `ROUNDS` timed rounds, each call after ``evict()`` put its
    data out of the caches (a `Rotation`'s ``advance``: the next copy of the call's arguments;
    by default `_evictor`, which flushes everything); it stops after two rounds when every
    kernel is already `CLEAR`-ly faster or slower than torch, so a kernel 20x slower than torch
    costs two of its calls, not five, or when the rounds so far took over `BUDGET_S` seconds.

    A call the spec accepts but torch has no kernel for (its warm-up raises RuntimeError, e.g.
    torch.sparse.mm on bf16 CSR values with reduce="sum": "addmm_out_sparse_csr_impl_mkl" not
    implemented for 'BFloat16') takes ``inf`` for torch: any kernel that runs it is faster.
    """
    note_setup()
    fns = {"torch": torch_fn, **kernels}
    try:
        torch_fn()
    except RuntimeError:  # NotImplementedError included: torch cannot run this call
        fns.pop("torch")
    for fn in kernels.values():
        fn()
    evict = evict or _evictor()
    best = dict.fromkeys(("torch", *kernels), float("inf"))
    start = time.perf_counter()
    for r in range(ROUNDS):
        for name, fn in fns.items():
            evict()
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e6)
        if r >= 1 and (
            all(_clear(best[k], best["torch"]) for k in kernels)
            or time.perf_counter() - start > BUDGET_S
        ):
            break
    return best


def _evictor() -> Callable[[], None]:
    """A function that pushes the caches' contents out (it rewrites twice the last-level cache).

    Each timed call starts cold, as a model's calls do: between two calls of one layer the rest
    of the model streams through the caches. Timed hot, a kernel streaming its weight can beat
    torch and lose in the model (measured on Zen 3: bf16 linear 1 x 1024 x 1024 through refcore
    0.72x torch hot, 0.55x cold, while a hot best-of-5 had picked it).

    The rewrite is a torch in-place add, so it runs on torch's thread pool and leaves it awake,
    as the op before a call in a model does; a NumPy rewrite (one thread) let the pool fall
    asleep first. Intel Xeon AMX, fp32 linear 1 x 1024 x 1024, best of 7, two runs: torch
    371 / 328 us vs our GEMM 361 / 361 us after a NumPy rewrite, 270 / 319 vs 304 / 353 us
    after a torch one (hot: 124-133 vs 137-141 us).
    """
    import torch

    from refcore import buffers

    size = _l3_bytes()
    buf = torch.from_numpy(buffers.empty((min(2 * size, 256 << 20) // 4,), np.dtype(np.float32)))
    return lambda: buf.add_(1.0)


class Rotation:
    """Copies of a call's tensor arguments that measured rounds read in turn: cold data, warm code.

    `_evictor` flushes everything, the code included: torch's C++ dispatch, the binding, the
    tensor conversions and the kernel wrapper all come back from DRAM, which a model's calls
    never do (every op runs the same code). On AMD Zen 4, fp32 linear 1 x 384 x 384: the kernel
    function 19 us hot and 85 us after the flush, torch 77 / 141 us, but the routed call measured
    355 us against torch's 220 us, so torch kept every decode GEMV the kernel ran 1.7-4x faster.
    A rotation instead keeps ``copies`` of the arguments (strides kept: `Plan.bind` binds them
    unchecked) and ``advance`` moves to the next, so between two reads of one copy the others
    (at least twice the last-level cache) went through the caches, as a model's other layers'
    weights do, while the code stays warm. It rotates nothing (`rotates` False: measure flushes
    as before) when an argument is not a dense tensor (an expanded or sliced view, a list of
    tensors) or the arguments exceed `ROTATE_MAX_BYTES` (they cannot stay cached anyway)."""

    def __init__(self, args: tuple, kwargs: dict[str, Any]) -> None:
        self.copies: list[tuple[tuple, dict[str, Any]]] = [(args, kwargs)]
        self.at, self.n = 0, 1  # the copies are made at first use: most calls measure nothing
        found = _dense_tensors(args, kwargs)
        if found is None:
            return
        total = sum(t.nbytes for t in found)
        if total == 0 or total > ROTATE_MAX_BYTES:
            return
        cycle = 2 * _l3_bytes()
        self.n = min(ROTATE_MAX_COPIES, max(2, -(-cycle // total) + 1))

    @property
    def rotates(self) -> bool:
        return self.n > 1

    @property
    def current(self) -> tuple[tuple, dict[str, Any]]:
        if len(self.copies) < self.n:
            args, kwargs = self.copies[0]
            for _ in range(self.n - 1):
                self.copies.append((tuple(map(_copy, args)),
                                    {k: _copy(v) for k, v in kwargs.items()}))  # fmt: skip
        return self.copies[self.at]

    def advance(self) -> None:
        self.at = (self.at + 1) % self.n


#: a call whose tensors hold more bytes than this is not rotated (two copies would not fit
#: the memory a measurement should take; data this large streams from DRAM anyway)
ROTATE_MAX_BYTES = 256 << 20
#: copies at most (calls on tiny tensors: 256 copies of 64 KB stay in L3 but not in L2)
ROTATE_MAX_COPIES = 256


def _dense_tensors(args: tuple, kwargs: dict[str, Any]) -> list[Any] | None:
    """The torch tensors among the arguments when each is contiguous or channels-last dense
    (its `_copy` has its strides), else None (also for a tensor inside a list or tuple). A
    prepacked weight is no torch tensor: every copy shares it (torch's side of that call reads
    the plain weight it was packed from, never copied either), and the other tensors rotate."""
    import torch

    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            if v.layout is not torch.strided:  # sparse: no strides to keep
                return None
            dense = v.is_contiguous() or (
                v.dim() == 4 and v.is_contiguous(memory_format=torch.channels_last)
            )
            if not dense:
                return None
            out.append(v)
        elif isinstance(v, (list, tuple)) and any(isinstance(e, torch.Tensor) for e in v):
            return None
    return out


def _copy(v: Any) -> Any:
    import torch

    if not isinstance(v, torch.Tensor):
        return v
    v = v.detach()  # a parameter: routing measures only calls that need no autograd
    got = v.clone()  # preserve_format: a dense tensor's strides are kept
    if got.stride() != v.stride():  # a size-1 dim's stride may differ: equal structure or none
        got = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype).copy_(v)
    return got


@functools.cache
def _l3_bytes() -> int:
    """The last-level cache's size (sysfs, read once: a Rotation is made at every new routing
    decision), 32 MB when unknown."""
    from refcore import cpu

    return _parse_size(cpu.machine()["caches"].get("L3", "")) or (32 << 20)


def _parse_size(text: str) -> int:
    """``32768K`` -> bytes (sysfs cache sizes); 0 when unknown."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1:] in units and text[:-1].isdigit():
        return int(text[:-1]) * units[text[-1]]
    return int(text) if text.isdigit() else 0


def _clear(kernel_us: float, torch_us: float) -> bool:
    return kernel_us > CLEAR * torch_us or kernel_us * CLEAR < torch_us


def shape_class(call: Any) -> tuple:
    """The key measurements are kept under: op, dtype, and per argument its dims (above `EXACT`
    rounded up to a power of two), its layout, or its value."""
    parts: list[Any] = [call.op.name, call.dtype]
    for name, value in call.arguments.items():
        if getattr(value, "shape", None) is not None:
            parts.append((name, _part(value), call.layout(name)))
        else:
            parts.append((name, _part(value)))
    return tuple(parts)


def _part(value: Any) -> Any:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(map(dim_class, shape))
    if isinstance(value, (list, tuple)):
        return tuple(map(_part, value))
    return (type(value).__name__, repr(value))  # 1, 1.0 and True are different attributes


def dim_class(d: int) -> int:
    """``d`` itself up to `EXACT`, else the next power of two."""
    return d if d <= EXACT else 1 << (d - 1).bit_length()


#: paired rounds a graph is timed in against eager (`against_eager`, `CallTrial`): after
#: `GRAPH_MIN_ROUNDS` when every round is `CLEAR`-ly one way, after `GRAPH_ROUNDS` when the
#: verdict is eager or holds in `KEEP_SHARE` of the rounds, else at most `GRAPH_MAX_ROUNDS`
GRAPH_ROUNDS = 9
GRAPH_MIN_ROUNDS = 2
GRAPH_MAX_ROUNDS = 21
#: a graph is kept only if it was faster than eager in this share of the paired rounds (and by
#: `MARGIN` on the medians). On the shared Intel Xeon AMX host, a Llama fp32 decode step kept its
#: graph on a median of 9 pairs 6% in its favour, where 7 later decode loops put it at 0.92x
#: eager: a median alone is one noisy round from either verdict.
KEEP_SHARE = 0.75


def _settled(ratios: list[float]) -> bool:
    """Whether paired rounds with these eager / graph ratios decide (see `GRAPH_ROUNDS`)."""
    n = len(ratios)
    if n >= GRAPH_MAX_ROUNDS:
        return True
    if n >= GRAPH_MIN_ROUNDS and (
        all(q > CLEAR for q in ratios) or all(q * CLEAR < 1.0 for q in ratios)
    ):
        return True
    return n >= GRAPH_ROUNDS and (statistics.median(ratios) <= MARGIN or _won(ratios) >= KEEP_SHARE)


def _won(ratios: list[float]) -> float:
    return sum(q > 1.0 for q in ratios) / len(ratios)


def _paired(graph_us: list[float], ratios: list[float]) -> Measurement:
    """The verdict of paired rounds: the graph's median time, the eager time the median ratio
    implies, and the share of rounds the graph won."""
    g = statistics.median(graph_us)
    return Measurement(g, g * statistics.median(ratios), _won(ratios))


def against_eager(run: Callable[[], Any], eager: Callable[[], Any]) -> Measurement:
    """A whole optimized graph (``run``) against the model's own eager code (``eager``, as
    "torch") on the same call. Per-call choice cannot see what a graph adds between its calls
    (conversions, plan steps, cache effects): an optimized model keeps its graph for an input
    class only where this measured it `MARGIN` faster (`refcore.optimize`).

    Paired rounds, not best-of: each round times both back to back (the order alternating),
    and the verdict is the median of the rounds' eager / graph ratios, so a drift of the shared
    machine's speed between rounds cancels within each pair. Caches are not flushed: a program
    calls its model back to back, and a whole model streams its own weights through them (a
    flush before each call kept MiniLM fp32's graph on the Intel Xeon AMX as 7-9% faster,
    twice, where the kept graph then ran at 0.99-1.03x eager).
    Best-of-5 times kept MiniLM fp32's graph on Zen 3 as 7% faster where paired medians put it
    at 0.97-1.06x. Rounds as `GRAPH_ROUNDS` says; reports the graph's median time, the eager
    time that median ratio implies, and the share of rounds the graph won (`Measurement.won`).
    """
    run()
    eager()  # first-call costs (the eager code may never have run in this process)
    graph_us: list[float] = []
    ratios: list[float] = []
    while not _settled(ratios):
        times = {}
        for name in ("graph", "eager") if len(ratios) % 2 == 0 else ("eager", "graph"):
            t0 = time.perf_counter()
            (run if name == "graph" else eager)()
            times[name] = (time.perf_counter() - t0) * 1e6
        graph_us.append(times["graph"])
        ratios.append(times["eager"] / times["graph"])
    return _paired(graph_us, ratios)


class CallTrial:
    """`against_eager` on the calls themselves, for calls that may not run twice (they change an
    argument: a transformers KV cache, which each run appends to). Each call runs once, by the
    graph or by the eager code as `next` says: `TRIAL_WARM` graph calls and one eager call
    untimed (captures, recompiles for dynamic shapes, first-call costs), then paired calls in
    alternating order, the verdict being the median of the pairs' eager / graph ratios, with
    `against_eager`'s rounds, early stop and `KEEP_SHARE`. Consecutive calls are near enough
    alike (a decode step's KV length grows by one). A call during which first-call work ran
    (`note_setup`: a plan for a new class, a kernel measured, a recompile) is no sample: its
    pair is run again.
    Without caches flushed, unlike `against_eager`: these are the program's own calls.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.pair: dict[str, float] = {}
        self.graph_us: list[float] = []
        self.ratios: list[float] = []
        self.verdict: Measurement | str | None = None  # str: why it could not decide

    def next(self) -> str:
        """What runs this call: ``"graph"`` or ``"eager"``."""
        if self.calls < TRIAL_WARM:
            return "graph"
        if self.calls == TRIAL_WARM:
            return "eager"
        order = ("graph", "eager") if len(self.ratios) % 2 == 0 else ("eager", "graph")
        return order[len(self.pair)]

    def record(self, name: str, us: float, clean: bool) -> None:
        """The call `next` named took ``us``; ``clean``: no first-call work ran during it."""
        self.calls += 1
        if self.calls <= TRIAL_WARM + 1:
            return
        if not clean:
            self.pair = {}  # run the pair again
        else:
            self.pair[name] = us
        if len(self.pair) == 2:
            self.graph_us.append(self.pair["graph"])
            self.ratios.append(self.pair["eager"] / self.pair["graph"])
            self.pair = {}
        if _settled(self.ratios) or (self.calls >= TRIAL_MAX_CALLS and self.ratios):
            self.verdict = _paired(self.graph_us, self.ratios)
        elif self.calls >= TRIAL_MAX_CALLS:
            self.verdict = f"no call without first-call work in {self.calls} calls"


#: graph calls a `CallTrial` leaves untimed first (a dynamic-shape capture recompiles on its
#: second call), and the calls after which it decides on the pairs it has
TRIAL_WARM = 2
TRIAL_MAX_CALLS = 96


_measured: dict[tuple, Measurement] = {}  # (shape class, Kernel) -> Measurement


def choose(
    call: Any,
    found: list[tuple[str, Any]],
    torch_fn: Callable[[], Any],
    routed: Callable[[Any], Callable[[], Any]],
    evict: Callable[[], None] | None = None,
) -> tuple[tuple[str, Any] | None, str]:
    """Among ``found`` ((provider, kernel) pairs that accept ``call``), the one to run, or None
    for torch; with the reason `refcore.explain` shows. Measures what this process has not:
    ``routed(kernel)`` is the whole routed path of the call through that kernel (binding,
    conversions and all), ``torch_fn`` torch's own call, ``evict`` what runs before each timed
    call (`measure`)."""
    if mode() == "rules":
        prov, kern = found[0]
        return found[0], f"{prov}/{kern.name}"
    cls = shape_class(call)
    # read each measurement once, into a local: another thread may clear the memo meanwhile
    known = {k: _measured.get((cls, k)) for _, k in found}
    todo = {k: routed(k) for k, m in known.items() if m is None}
    if todo:
        best = measure({f"{k.op}/{k.name}@{id(k)}": fn for k, fn in todo.items()}, torch_fn,
                       evict)  # fmt: skip
        if len(_measured) > 4096:  # a bound, for programs with ever-changing shapes
            _measured.clear()
        for k in todo:
            known[k] = Measurement(best[f"{k.op}/{k.name}@{id(k)}"], best["torch"])
            _measured[(cls, k)] = known[k]
    results = [(pk, known[pk[1]]) for pk in found]
    pk, m = min(results, key=lambda r: r[1].kernel_us)
    label = f"{pk[0]}/{pk[1].name}"
    if m.faster:
        return pk, f"{label} ({m})"
    if m.kernel_us < m.torch_us:
        return None, f"torch: {label} not {MARGIN - 1:.0%} faster ({m})"
    return None, f"torch: measured faster here ({label} {m})"
