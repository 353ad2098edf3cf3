"""Pass: pack the constant weights of linear and conv calls once, in the layout their kernel reads.

*Where*: a ``torch.nn.functional.linear`` or ``conv2d`` node or a fused one (`FusedOp` of
``linear_relu``, ``conv2d_add_relu``, ...: an op tagged ``gemm`` with a ``weight``) whose
``weight`` is a ``get_attr`` (a parameter or buffer of the module). *What*: `refcore.pack` into
the layout the best kernel of the allowed providers reads for that op and dtype
(``Kernel.layouts``, specs/layouts.yaml); `choose_layout` decides. A layout with pack ``params``
(the conv geometry of ``onednn_conv``) gets those the graph knows: the node's attributes, and
the input's shape where shape propagation recorded it (fx with example inputs; else the kernel
completes the pack on its first call).

The node's target becomes a `PrepackedOp`, which keeps the packed copy and still receives the
plain weight: when the weight tensor changes after packing (its version counter or storage moved:
``load_state_dict``, an optimizer step) it packs again, and when no kernel takes the packed call
(autograd, another dtype, a provider without the layout) it runs the plain call as before. So the
graph computes the same function as before, and nothing else changes in it.

Example:
    >>> import torch, refcore
    >>> from refcore.passes.functional import functionalize
    >>> gm = functionalize(torch.fx.symbolic_trace(torch.nn.Linear(64, 64)))
    >>> notes = []
    >>> _ = prepack(gm, "reference", notes)
    >>> notes[-1]
    'prepack: 1 linear call(s) left plain (no kernel of reference reads a packed float32 weight)'
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from refcore import tensors
from refcore.call import spelling
from refcore.dispatch import AUTO
from refcore.packed import PackedWeight, pack, pack_params
from refcore.provider import installed
from refcore.registry import default_registry


def choose_layout(op: str, dtype: str, provider: str = AUTO, arg: str = "weight") -> str | None:
    """The packed layout read by the highest-ranked kernel of ``op`` for ``dtype`` among the
    allowed providers' kernels that this CPU runs, or None (the reference never asks for one)."""
    reg = default_registry()
    usable = {
        name for name, lay in reg.layouts.items()
        if f"{op}.{arg}" in lay.args and dtype in lay.dtypes
    }  # fmt: skip
    provs = sorted(installed().items(), key=lambda kv: (-kv[1].priority, kv[0]))
    for name, prov in provs:
        if name == "reference" or (provider != AUTO and name != provider):
            continue
        kernels = prov.kernels_for(op)
        if not kernels or not prov.availability().available:
            continue
        for k in kernels:
            from refcore import cpu

            if dtype in k.dtypes and cpu.has(k.isa) and k.layouts & usable:
                return sorted(k.layouts & usable)[0]
    return None


class PrepackedOp:
    """A graph node's target: ``op`` with its weight packed once (see the module doc)."""

    def __init__(self, op: str, provider: str, layout: str, weight: torch.Tensor,
                 params: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.op, self.provider, self.layout = op, provider, layout
        self.params = dict(params or {})
        self.__name__ = f"refcore_prepacked_{op}"
        self.__module__ = __name__
        self.packed: PackedWeight | None = self._pack(weight)
        self._key = self._version(weight)
        self.decisions: dict[Any, dict[Any, Any]] = {}  # route_call's memo per `memo_key`
        self._fused: Any = None  # the FusedOp the plain weight's calls route through

    @staticmethod
    def _version(w: torch.Tensor) -> tuple[int, int]:
        return (w._version, w.data_ptr())

    def _pack(self, w: torch.Tensor) -> PackedWeight:
        return pack(self.op, w.detach(), self.layout, **self.params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from refcore.integration import _needs_grad, _record, route_call

        spec = default_registry().op(self.op)
        # as given (no defaults): the call's structure key is the one `specialize` looks up
        named = spelling(spec).arguments(args, kwargs, defaults=False)
        w = named["weight"]
        if _needs_grad((), named) or not isinstance(w, torch.Tensor):
            return self._plain(named)
        if self._version(w) != self._key:  # the parameter changed since it was packed
            try:
                self.packed = self._pack(w)
            except (TypeError, ValueError):  # e.g. converted to a dtype the layout lacks
                self.packed = None
            self._key = self._version(w)
            self.decisions.clear()
        if self.packed is None:
            return self._plain(named)
        self._weight = w  # for _unpacked, should torch run the call
        return route_call(self._unpacked, spec, f"prepacked {self.op}", self.provider, (),
                          {**named, "weight": self.packed}, _memo(self.decisions),
                          _record, self._torch_unpacked)  # fmt: skip

    def specialize(self, args: tuple, kwargs: dict[str, Any], records: Any = None) -> Any:
        """What a plan runs for a call shaped like this one (`refcore.plan`): the kernel on the
        packed weight while the weight is the one packed; None where torch ran it."""
        from refcore.integration import _specialize
        from refcore.plan import Adapted

        w = kwargs.get("weight")
        if args or self.packed is None or not isinstance(w, torch.Tensor):
            return None
        if self._version(w) != self._key:
            return None
        packed = self.packed
        name = f"prepacked {self.op}"

        def plain(**kw: Any) -> Any:  # a call the step's guard rejects, with the plain weight
            return self(**{**kw, "weight": w})

        got = _specialize(_memo(self.decisions), self._unpacked, None, plain, name, (),
                          {**kwargs, "weight": packed})  # fmt: skip
        if got is None:
            return self._specialize_plain(kwargs, w, records)

        def adapt(a: tuple, kw: dict[str, Any]) -> Any:
            wt = kw.get("weight")
            if a or wt is not w or self._version(wt) != self._key or self.packed is not packed:
                return None
            return (), {**kw, "weight": packed}

        return Adapted(got[0], adapt, self, frozenset({"weight"})), got[1]

    def _specialize_plain(self, kwargs: dict[str, Any], w: torch.Tensor, records: Any) -> Any:
        """Where torch ran the packed call: what the plain weight's call ran (a plan replays
        that), if its decision is known; the packed call's decision is recorded as before. A
        fused op's plain call is its chain, each call routed: where torch ran every one
        (``records``: what this call recorded), the plan calls the chain's torch functions,
        as `FusedOp.specialize` does (Llama fp32 decode, 16 steps under cProfile: 26,848
        Python calls with the routed chain of linear_silu, 19,825 without)."""
        from refcore.integration import _decisions, _key, _torch_table, memo_key

        packed_known = _memo(self.decisions).get(
            _key(self._unpacked, (), {**kwargs, "weight": self.packed})
        )
        if packed_known is None:
            return None
        outcome = (f"prepacked {self.op}", packed_known[1])
        plain_fn = _PLAIN.get(self.op)
        if plain_fn is not None:  # _plain: F.linear / F.conv2d(**named) under routing
            inner = _decisions(self.provider, *memo_key()).get(_key(plain_fn, (), kwargs))
        else:
            inner = self._fused.decisions.get(memo_key(), {}).get(
                _key(self._fused.composition, (), kwargs)) if self._fused else None  # fmt: skip
        if inner is None or inner[0] is not None:
            return None  # a kernel runs the plain call: the node routes it (rare)
        if plain_fn is None and not (records and all(o.startswith("torch") for _, o in records)):
            return None  # a kernel ran one of the chain's calls: the composition routes them

        def direct(**kw: Any) -> Any:
            if kw.get("weight") is not w or self._version(w) != self._key:
                return self(**kw)
            return self._torch_plain(kw)

        direct.__name__ = f"refcore_plain_{self.op}"
        if plain_fn is None:
            return direct, [rec for rec, n in records.items() for _ in range(n)]
        return direct, [outcome, (_torch_table(None)[plain_fn][1], inner[1])]

    def _unpacked(self, **packed: Any) -> Any:
        return self._plain({**packed, "weight": self._weight})

    def _torch_unpacked(self, **packed: Any) -> Any:
        """torch's own call with the plain weight, nothing routed (what kernels are timed
        against; `refcore.integration.route_call`)."""
        return self._torch_plain({**packed, "weight": self._weight})

    def _torch_plain(self, named: dict[str, Any]) -> Any:
        from refcore.derive import torch_call

        plain_fn = _PLAIN.get(self.op)
        if plain_fn is not None:
            return plain_fn(**named)
        return torch_call(self.op)(named)

    def _plain(self, named: dict[str, Any]) -> Any:
        """The call with the plain weight: routed like any other (the packed one was declined)."""
        from refcore.integration import FusedOp, routing_inside

        plain_fn = _PLAIN.get(self.op)
        if plain_fn is not None:
            with routing_inside(self.provider):
                return plain_fn(**named)
        if self._fused is None:  # one node, one memo of its decisions
            self._fused = FusedOp(self.op, self.provider)
        return self._fused(**named)

    def __repr__(self) -> str:
        return f"PrepackedOp({self.op!r}, provider={self.provider!r}, layout={self.layout!r})"


#: the unfused ops a PrepackedOp may stand for, and the torch function of their plain call
_PLAIN: dict[str, Any] = {"linear": F.linear, "conv2d": F.conv2d}
#: torch function -> the op its calls are
_FUNCTIONS: dict[Any, str] = {F.linear: "linear", F.conv2d: "conv2d"}


def _memo(per_key: dict[Any, dict[Any, Any]]) -> dict[Any, Any]:
    from refcore.integration import memo_key

    return per_key.setdefault(memo_key(), {})


def _weight_call(node: fx.Node) -> tuple[str, dict[str, Any]] | None:
    """(op, named arguments) of a linear- or conv-family node, else None."""
    from refcore.integration import FusedOp

    if node.op != "call_function":
        return None
    op = _FUNCTIONS.get(node.target) if callable(node.target) else None
    if op is not None:
        try:
            spelled = spelling(default_registry().op(op), "torch")
            return op, spelled.arguments(node.args, node.kwargs, defaults=False)
        except (TypeError, ValueError):  # not a call refcore's op takes
            return None
    if isinstance(node.target, FusedOp) and not node.args:
        spec = default_registry().op(node.target.op)
        if "weight" in {a.name for a in spec.signature.args} and "gemm" in spec.tags:
            return node.target.op, dict(node.kwargs)
    return None


def _constant(gm: fx.GraphModule, node: Any) -> torch.Tensor | None:
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    obj: Any = gm
    for part in node.target.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) and obj.dim() in (2, 4) else None


def _params(op: str, layout: str, named: dict[str, Any]) -> dict[str, Any] | None:
    """``layout``'s pack params for the node's call, as far as the graph knows them; None when
    an attribute the pack reads is computed in the graph (the packed form would be a guess)."""
    known: dict[str, Any] = {}
    for name, value in named.items():
        if not isinstance(value, fx.Node):
            known[name] = value
            continue
        meta = value.meta.get("tensor_meta") or value.meta.get("val")
        shape = getattr(meta, "shape", None)
        if shape is not None and all(isinstance(d, int) for d in shape):
            known[name] = SimpleNamespace(shape=tuple(shape))
    params = pack_params(op, layout, known)
    sources = {src.partition(".")[0] for _, src in default_registry().layouts[layout].params}
    if any(isinstance(named.get(a), fx.Node) and a not in known for a in sources - {"input"}):
        return None
    return params


def prepack(gm: fx.GraphModule, provider: str = AUTO, notes: list[str] | None = None) -> Any:
    """Give every linear- or conv-family call on a constant weight a `PrepackedOp` target (in
    place; returns ``gm``). Calls no allowed kernel reads packed stay as they are, with a note."""
    notes = notes if notes is not None else []
    packed: dict[str, int] = {}
    plain: dict[tuple[str, str], int] = {}
    for node in list(gm.graph.nodes):
        found = _weight_call(node)
        if found is None:
            continue
        op, named = found
        w = _constant(gm, named.get("weight"))
        if w is None:
            continue
        family = "conv2d" if w.dim() == 4 else "linear"
        dtype = tensors.dtype_name(w)
        layout = choose_layout(op, dtype, provider)
        if layout is None:
            plain[family, dtype] = plain.get((family, dtype), 0) + 1
            continue
        params = _params(op, layout, named)
        if params is None:
            notes.append(f"prepack: a {op} call left plain (attributes its {layout} pack reads "
                         "are computed in the graph)")  # fmt: skip
            continue
        try:
            node.target = PrepackedOp(op, provider, layout, w, params)
        except (TypeError, ValueError):  # the layout does not take this weight (its rank)
            plain[family, dtype] = plain.get((family, dtype), 0) + 1
            continue
        node.args, node.kwargs = (), named
        packed[family] = packed.get(family, 0) + 1
    for family, count in packed.items():
        notes.append(f"prepack: {count} {family} weight(s) packed once")
    for (family, dtype), count in plain.items():
        notes.append(f"prepack: {count} {family} call(s) left plain (no kernel of {provider} "
                     f"reads a packed {dtype} weight)")  # fmt: skip
    gm.recompile()
    return gm
