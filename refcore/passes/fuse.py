"""Pass: replace chains of function calls by fused ops, driven by ``specs/fusions.yaml``.

A pattern (e.g. ``linear -> gelu``) matches a chain of ``call_function`` nodes whose targets are the
ops' torch functions (the specs' ``torch.function``), where each link feeds exactly the argument
the pattern binds to ``prev`` and is used by nothing else. The chain becomes one node calling a
`refcore.integration.FusedOp`, with the fused op's arguments gathered through the pattern's
bindings. Patterns whose fused op no allowed provider implements are left unfused (and reported).

A link after the first may also be the in-place form of its op (``x += r``: ``operator.iadd``,
as ResNet blocks write their residual add) when it mutates the previous link's output: that
intermediate has no other user, so computing out of place instead is unobservable.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx

from refcore.integration import FusedOp
from refcore.registry import Registry, default_registry, resolve
from refcore.spec import FusionSpec, OpSpec

#: op -> its in-place forms, fusable where they mutate the chain's own intermediate (see above)
INPLACE: dict[str, tuple[Any, ...]] = {"add": (operator.iadd, torch.Tensor.add_)}


def _named_args(spec: OpSpec, node: fx.Node) -> dict[str, Any] | None:
    """The node's arguments named as in the op's signature, or None if they do not fit it."""
    t = spec.torch
    order = t.positional or tuple(a.name for a in spec.signature.args if not a.kwarg_only)
    if len(node.args) > len(order):
        return None
    named = {**dict(zip(order, node.args)), **node.kwargs}
    for key, allowed in t.extra:
        if key in named and named.pop(key) != allowed and allowed != "any":
            return None
    if set(named) - {a.name for a in spec.signature.args}:
        return None
    return named


def _match(fusion: FusionSpec, start: fx.Node, funcs: dict[str, Any], reg: Registry):
    """Nodes and fused-op arguments if ``fusion`` matches a chain starting at ``start``."""
    nodes, fused_args, prev = [], {}, None
    for i, (op, binding) in enumerate(zip(fusion.chain, fusion.inputs)):
        node = start if i == 0 else next(iter(prev.users), None)
        if node is None or node.op != "call_function":
            return None
        inplace = i > 0 and node.target in INPLACE.get(op, ()) and node.args[:1] == (prev,)
        if node.target not in funcs[op] and not inplace:
            return None
        if i > 0 and len(prev.users) != 1:
            return None
        named = _named_args(reg.op(op), node)
        if named is None:
            return None
        for arg, src in binding.items():
            if src == "prev":
                if named.get(arg) is not prev:
                    return None
            elif arg in named:
                fused_args[src] = named[arg]
        if any(a not in binding for a in named):
            return None  # an argument the pattern does not carry over
        nodes.append(node)
        prev = node
    for a in reg.op(fusion.op).signature.tensor_args:
        if not isinstance(fused_args.get(a.name), fx.Node) and fused_args.get(a.name) is not None:
            return None  # e.g. x + 1.0: a Python number where the fused op takes a tensor
    return nodes, fused_args


def _targets(spec: OpSpec) -> set[Any]:
    """Every callable a graph node may use for the op: its torch function and aliases."""
    return {resolve(d) for d in (spec.torch.function, *spec.torch.also)}


def fuse(gm: fx.GraphModule, provider: str, implemented: Iterable[str],
         notes: list[str] | None = None) -> fx.GraphModule:  # fmt: skip
    """Fuse every matching chain whose fused op is in ``implemented`` (in place; returns ``gm``)."""
    reg = default_registry()
    have = set(implemented)
    notes = notes if notes is not None else []
    patterns = sorted(reg.fusions.values(), key=lambda f: -len(f.chain))  # longest first
    for fusion in patterns:
        if fusion.op is None:
            continue
        funcs = {op: _targets(reg.op(op)) for op in fusion.chain}
        count = 0
        for node in list(gm.graph.nodes):
            if node.graph is not gm.graph or node.op != "call_function":
                continue
            found = _match(fusion, node, funcs, reg)
            if found is None:
                continue
            if fusion.op not in have:
                why = f"no provider has a {fusion.op} kernel this CPU runs other than a fallback"
                notes.append(f"{fusion.name}: left unfused ({why})")
                break
            chain, fused_args = found
            with gm.graph.inserting_before(chain[-1]):
                new = gm.graph.call_function(FusedOp(fusion.op, provider), (), fused_args)
            chain[-1].replace_all_uses_with(new)
            for n in reversed(chain):
                gm.graph.erase_node(n)
            count += 1
        if count:
            notes.append(f"{fusion.name}: fused {count} chain(s) into {fusion.op}")
    gm.graph.lint()
    gm.recompile()
    return gm
