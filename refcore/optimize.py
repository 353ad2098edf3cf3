"""`refcore.optimize`: capture a model, rewrite its graph with refcore's passes, route its ops.

The returned module computes the same function as the input (within the specs' tolerances). The
model is captured by torch.fx when it can be traced symbolically, else by dynamo (torch.compile's
graph capture, which handles transformers models, with dynamic shapes so other batch sizes and
sequence lengths need no new optimize call). The graph passes (``refcore/passes``, run in the
order of the table `refcore.pipeline.PIPELINE`, which the torch.compile backend reads too) drop
inference dropouts, fold batch-norms and parameter-only subgraphs, and fuse the patterns of
``specs/fusions.yaml``; every remaining call of a spec'd torch function runs under
`refcore.enabled` routing. A model neither can capture is not an error: it keeps its own code,
runs under routing, and ``notes`` say why it was not captured.

Example:
    >>> import torch, refcore
    >>> m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU())
    >>> fast = refcore.optimize(m, provider="reference")
    >>> fast(torch.ones(2, 8)).shape
    torch.Size([2, 8])
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Sequence
from typing import Any

from refcore import pipeline
from refcore.dispatch import AUTO
from refcore.passes import WRITES, writes_inputs_or_state

#: every pass of the table (`refcore.pipeline.PIPELINE`), in its order
DEFAULT_PASSES = pipeline.names()
CAPTURES = ("auto", "fx", "dynamo", "none")
#: dynamo graphs an optimized model may add to its code object's cache (see OptimizedModule)
RECOMPILE_LIMIT = 64


def optimize(model: Any, dtype: Any = None, example_inputs: Any = None, provider: str = AUTO,
             passes: Sequence[str] | None = None, *, capture: str = "auto",
             inplace: bool = False, optimizer: Any = None) -> Any:  # fmt: skip
    """Return an ``nn.Module`` computing ``model``'s function with refcore's passes and kernels.

    ``dtype=torch.bfloat16`` converts floating parameters and floating inputs (fp32 accumulation
    stays the kernels' business); outputs come back in that dtype. ``example_inputs`` (a tuple of
    positional or a dict of keyword arguments) is run once, so capture happens (and any capture
    failure falls back) inside optimize. ``capture``: ``"auto"`` (fx, else dynamo), ``"fx"``
    (a model torch.fx cannot trace raises ValueError), ``"dynamo"`` or ``"none"`` (op-level
    routing only). The caller's model is not changed unless
    ``inplace=True``. The result is for inference: eval mode, parameters without gradients.
    ``passes`` names the passes of `refcore.pipeline.PIPELINE` to run (default: all; they run
    in the table's order). ``optimized.notes`` lists what each pass did and what stayed on torch.

    With ``optimizer`` (a torch.optim or refcore.optim SGD / Adagrad / Adam / AdamW / Lamb) it
    prepares training instead and returns ``(model, optimizer)``: refcore.optim's optimizer of
    the same rule and state, bf16 parameters with split-BF16 masters for
    ``dtype=torch.bfloat16`` (`refcore.optim.train.prepare`).
    """
    import torch

    if optimizer is not None:
        from refcore.optim.train import prepare

        return prepare(model, optimizer, dtype, provider, inplace)

    from refcore.integration import _check_provider

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optimize: expected a torch.nn.Module, got {type(model).__name__}")
    devices = {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()}
    if devices - {"cpu"}:
        raise ValueError(f"optimize: refcore runs CPU models; parameters are on {sorted(devices)}")
    if passes is not None:
        pipeline.check(passes)
    if capture not in CAPTURES:
        raise ValueError(f"optimize: capture={capture!r}; expected one of {CAPTURES}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"optimize: dtype expected a floating torch.dtype, got {dtype!r}")
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list, dict)):
        raise TypeError(
            "optimize: example_inputs expected a tuple of positional or a dict of keyword "
            f"arguments, got {type(example_inputs).__name__}"
        )
    _check_provider(provider, strict=False)
    m = model if inplace else copy.deepcopy(model)
    m.eval()
    # An inference module: without parameter gradients, its calls route even in grad mode.
    m.requires_grad_(False)
    notes: list[str] = []
    if dtype is not None:
        m.to(dtype)
        notes.append(f"dtype: floating parameters and inputs in {dtype}")
    if passes is None or "channels_last" in passes:
        from refcore.passes.channels_last import channels_last

        n = channels_last(m)
        if n:
            notes.append(f"channels_last: {n} conv2d weight(s) in NHWC")
    example = None
    if isinstance(example_inputs, (tuple, list)):
        example = _cast(tuple(example_inputs), dtype)
    out = _capture(m, provider, passes, notes, capture, dtype, example)
    if example_inputs is not None:
        with torch.no_grad():
            out(**example_inputs) if isinstance(example_inputs, dict) else out(*example_inputs)
    return out


def _capture(m: Any, provider: str, passes: Sequence[str] | None, notes: list[str], capture: str,
             dtype: Any, example: tuple | None) -> Any:  # fmt: skip
    import torch

    if capture in ("auto", "fx"):
        try:
            if isinstance(m, torch.fx.GraphModule):
                # a graph already (torch.export's, e.g. torchao's pt2e int8 models): taken as
                # it is; a trace would run its calls on constants (a weight's dequantize) away
                gm, how = copy.deepcopy(m), "the given fx graph"
            else:
                _traceable(m)
                gm, how = torch.fx.symbolic_trace(m), "torch.fx"
        except Exception as e:  # fx cannot trace data-dependent code (transformers models)
            if capture == "fx":  # asked for by name: no other capture stands in for it
                raise ValueError(
                    f"optimize: capture='fx': torch.fx cannot trace {type(m).__name__} "
                    f"({type(e).__name__}: {str(e)[:200]}); capture='auto' or 'dynamo' "
                    "captures it with dynamo"
                ) from e
            notes.append(f"not captured by torch.fx ({type(e).__name__}: {str(e)[:100]})")
        else:
            notes.append(f"captured by {how}: {len(gm.graph.nodes)} nodes")
            if example is not None:  # shapes and dtypes for passes that need them (attention)
                from torch.fx.passes.shape_prop import ShapeProp

                try:
                    with torch.no_grad():
                        ShapeProp(gm).propagate(*example)
                except Exception as e:  # the passes then match less (e.g. no attention)
                    notes.append(f"shapes not propagated ({type(e).__name__}: {str(e)[:100]})")
            writes = writes_inputs_or_state(gm)  # before the passes: what the model's code does
            results = pipeline.run(gm, "fx", provider, passes)
            notes.extend(pipeline.notes(results))
            if writes:
                notes.append(f"{WRITES}{writes}")
            return OptimizedModule(gm, provider, notes, dtype, routed=True, passes=results,
                                   eager=m)  # fmt: skip
    if capture in ("auto", "dynamo"):
        from refcore.compile_backend import backend

        notes.append("captured by dynamo (dynamic shapes); passes run on each captured graph")
        compiled = torch.compile(
            m, backend=backend(provider, passes=passes, notes=notes, freeze=m), dynamic=True
        )
        return OptimizedModule(compiled, provider, notes, dtype, routed=False, eager=m)
    notes.append("not captured (capture='none'): its ops are routed one by one")
    return OptimizedModule(m, provider, notes, dtype, routed=True)


def _traceable(m: Any) -> None:
    """Raise where torch.fx's trace would not compute the model's function for every call: a
    ``forward`` argument defaulting to None. The trace passes a proxy for it, so ``if mask is
    not None`` takes one branch for good, and a call without the argument then failed (or,
    with another branch, computed another function); dynamo guards on it instead."""
    import inspect

    optional = [name for name, p in inspect.signature(m.forward).parameters.items()
                if p.default is None]  # fmt: skip
    if optional:
        raise TypeError(f"forward arguments {optional} default to None; a trace would fix "
                        "the branches their `is None` tests take")  # fmt: skip


def _untimed(args: tuple, kwargs: dict[str, Any], notes: list[str]) -> str:
    """Why a call may not be run more than once to time it ("" if it may): a graph writes
    its inputs or state (a note from capture), or an argument is an object a call may change
    (e.g. a transformers KV cache, which each run would append to)."""
    import torch

    written = next((n for n in notes if n.startswith(WRITES)), "")
    if written:
        return written
    plain = (torch.Tensor, int, float, bool, str, type(None), torch.dtype)
    for name, v in (*enumerate(args), *kwargs.items()):
        items = v if isinstance(v, tuple) else (v,)  # a list may be changed in place
        if not all(isinstance(x, plain) for x in items):
            return f"argument {name} is a {type(v).__name__}, which a call may change"
    return ""


def _cast(value: Any, dtype: Any) -> Any:
    import torch

    if dtype is None:
        return value

    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _sparse_layout(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The layout of the first sparse tensor among a call's arguments (and in their tuples and
    lists), or None."""
    import torch

    for v in (*args, *kwargs.values()):
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.layout != torch.strided:
                return t.layout
    return None


@functools.cache
def _module_class() -> type:
    import torch

    from refcore import library
    from refcore.integration import enabled, memo_key, reporting

    class OptimizedModule(torch.nn.Module):
        """``inner`` (a captured graph, or the model) run under refcore routing.

        ``notes`` say what the passes did (``passes``: their `PassResult` s, for an fx graph;
        a dynamo-captured model's graphs add their notes as dynamo captures them). A
        dynamo-captured model routes inside its compiled graphs; if dynamo fails on a call, the
        model falls back to op-level routing for good and the reason joins ``notes``.
        """

        def __init__(self, inner: torch.nn.Module, provider: str, notes: list[str], dtype: Any,
                     routed: bool, passes: tuple = (), eager: Any = None) -> None:  # fmt: skip
            from refcore.plan import Planned

            super().__init__()
            # the model's own code, timed against the graph per input class (`_timed`); not
            # a registered submodule: its parameters are the graph's, listed once
            self.__dict__["eager"] = eager
            # input class -> choice.Measurement, or why it was not timed
            self.verdicts: dict[Any, Any] = {}
            self.inner, self.provider, self.notes = inner, provider, notes
            self.dtype, self.routed, self.passes = dtype, routed, passes
            self.self_routing = pipeline.routes_itself(passes)  # no routing mode needed
            self.routes_itself = True  # explain(model, ...) reports its own routing
            # a graph whose nodes route themselves replays per-input-class plans (refcore.plan)
            self.planned = Planned(inner) if routed and pipeline.planned(passes) else None

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            # torch.ops.refcore calls in the graph (a quantized model's layers) run with this
            # model's provider, as its routed calls do
            with library.using(self.provider):
                return self._forward(*args, **kwargs)

        def _forward(self, *args: Any, **kwargs: Any) -> Any:
            if self.dtype is not None:
                args = _cast(args, self.dtype)
                kwargs = {k: _cast(v, self.dtype) for k, v in kwargs.items()}
            if self.routed:
                if self.self_routing:
                    return self._timed(self._graph, args, kwargs)
                with enabled(self.provider):
                    return self.inner(*args, **kwargs)
            if torch.overrides._len_torch_function_stack() > 0:
                # a caller's mode (e.g. refcore.enabled around this call) is active: dynamo would
                # trace it, and refcore's kernels with it; run the model's own code, routed
                with enabled(self.provider):
                    return self.inner._orig_mod(*args, **kwargs)
            sparse = _sparse_layout(args, kwargs)
            if sparse is not None:
                # dynamo does not capture sparse inputs (a PyG GNN's torch.sparse_csr adj_t:
                # torch 2.13 raised IndexError in its automatic-dynamic stride bookkeeping);
                # such calls run the model's own code, routed (torch.sparse.mm -> spmm_reduce)
                note = (f"inputs with a {sparse} tensor: not captured by dynamo (it takes "
                        "strided tensors only); their ops are routed one by one")  # fmt: skip
                if note not in self.notes:
                    self.notes.append(note)
                with enabled(self.provider):
                    return self.inner._orig_mod(*args, **kwargs)
            try:
                return self._timed(self._dynamo, args, kwargs)
            except torch._dynamo.exc.TorchDynamoException as e:
                self.notes.append(f"dynamo capture failed ({type(e).__name__}: {str(e)[:160]}); "
                                  "its ops are routed one by one")  # fmt: skip
                self.inner, self.routed, self.eager = self.inner._orig_mod, True, None
                return self._forward(*args, **kwargs)

        def _dynamo(self, *args: Any, **kwargs: Any) -> Any:
            """The dynamo-captured model. Floats (eps, momentum) as constants, not 0-d tensor
            inputs: passes read them. Dynamo's recompile limit counts every compiled graph of
            the model's code object, other instances' and other backends' too: with a
            torch.compile'd copy of the same model class it was reached, and dynamo then ran
            this model's forward uncaptured and unrouted (Llama bf16 decode 0.87x eager in a
            bench run). The settings are entered here, not around `_timed`, where every call
            the eager code runs paid for them: a one-linear model through optimize took 120 us
            a call against 20 us for the model itself, 29 us without."""
            limit = max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)
            with torch._dynamo.config.patch(specialize_float=True, recompile_limit=limit):
                return self.inner(*args, **kwargs)

        def _graph(self, *args: Any, **kwargs: Any) -> Any:
            """An fx graph whose nodes route themselves, through its plans."""
            with reporting(self.provider):
                return (self.planned or self.inner)(*args, **kwargs)

        def _timed(self, run: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
            """``run`` (the captured graph), or the model's eager code where the graph did not
            measure faster than it by `choice.MARGIN` for this input class (as a kernel must
            beat torch): a graph within noise of eager gains nothing and risks a slower model.
            Timed once per class after its first call, in
            ``measure`` mode (`choice.against_eager`), if nothing the call is given or the graph
            writes can change between runs (tensors, numbers, strings, None only; no graph
            writing its inputs or state). The first call's result is always the graph's."""
            from refcore import choice
            from refcore.plan import MAX_PLANS, _needs_grad, input_class

            eager = self.eager
            if (
                eager is None
                or choice.mode() != "measure"
                or (torch.is_grad_enabled() and _needs_grad(args, kwargs))
            ):
                return run(*args, **kwargs)
            key = (memo_key(), input_class(args, kwargs))
            m = self.verdicts.get(key)
            if isinstance(m, choice.CallTrial):
                return self._trial(m, key, run, eager, args, kwargs)
            if m is None:
                out = run(*args, **kwargs)  # captures, plans, measures its kernels
                if len(self.verdicts) >= MAX_PLANS:
                    return out
                why = _untimed(args, kwargs, self.notes)
                if why:  # timed on the calls themselves instead, each run once
                    trial = self.verdicts[key] = choice.CallTrial()
                    trial.record("graph", 0.0, clean=False)  # this call: the first graph call
                    self.notes.append(f"not run twice to time it ({why}): timed against eager "
                                      "on its calls themselves")  # fmt: skip
                    return out
                m = self.verdicts[key] = choice.against_eager(
                    lambda: run(*args, **kwargs), lambda: eager(*args, **kwargs)
                )
                kept = "graph kept" if m.faster else "eager code runs"
                shapes = [tuple(a.shape) for a in (*args, *kwargs.values()) if hasattr(a, "shape")]
                self.notes.append(f"inputs {shapes}: {m.said('graph', 'eager')}: {kept}")
                return out
            if isinstance(m, str) or m.faster:
                return run(*args, **kwargs)
            with reporting(self.provider) as rep:
                rep.record("(whole model)", f"eager code ({m.said('graph', 'eager')})")
                return eager(*args, **kwargs)

        def _trial(self, trial: Any, key: Any, run: Any, eager: Any, args: tuple,
                   kwargs: dict[str, Any]) -> Any:  # fmt: skip
            """One call of a `choice.CallTrial`: run by what it names, timed, recorded; when
            the trial decides, its verdict replaces it for the input class."""
            from refcore import choice

            name = trial.next()
            before = choice.setup_count()
            t0 = time.perf_counter()
            if name == "graph":
                out = run(*args, **kwargs)
            else:
                with reporting(self.provider) as rep:
                    rep.record("(whole model)", "eager code (timing the graph against it)")
                    out = eager(*args, **kwargs)
            us = (time.perf_counter() - t0) * 1e6
            trial.record(name, us, clean=choice.setup_count() == before)
            m = trial.verdict
            if m is not None:
                self.verdicts[key] = m
                if isinstance(m, str):
                    self.notes.append(f"not timed against eager: {m}; graph kept")
                else:
                    kept = "graph kept" if m.faster else "eager code runs"
                    self.notes.append(f"calls timed in place: {m.said('graph', 'eager')}: {kept}")
            return out

    return OptimizedModule


def OptimizedModule(inner: Any, provider: str, notes: list[str], dtype: Any = None,
                    routed: bool = True, passes: tuple = (), eager: Any = None) -> Any:  # fmt: skip
    return _module_class()(inner, provider, notes, dtype, routed, passes, eager)
