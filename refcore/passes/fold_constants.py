"""Pass: constant folding of parameter-only subgraphs (computed once, kept as buffers).

A node whose inputs are all attributes of the module (parameters, buffers) or literals, through
any chain of calls, computes the same tensor on every run: e.g. ``self.weight.t()`` or
``self.scale * self.weight``. The pass evaluates such subgraphs once and replaces each result used
by the rest of the graph by a ``get_attr`` of a new buffer. Random ops and in-place methods are
never folded (their result is not a function of the attributes alone, or they mutate them).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import fx

from refcore.passes import PassResult, eliminate_dead_code

_NEVER = ("rand", "normal", "bernoulli", "dropout", "uniform", "empty", "multinomial")


def _foldable(node: fx.Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    if any(w in name for w in _NEVER):
        return False
    return not (node.op == "call_method" and name.endswith("_") and not name.startswith("__"))


def _inline(node: fx.Node, value: Any, values: dict[fx.Node, Any]) -> None:
    """Replace ``node`` by the Python number ``value`` in the arguments of its other users."""
    for user in list(node.users):
        if user in values:
            continue
        user.args = fx.node.map_arg(user.args, lambda n: value if n is node else n)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)


def fold_constants(gm: fx.GraphModule) -> PassResult:
    """Evaluate parameter-only subgraphs once (in place on ``gm``); say how many."""
    values: dict[fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            values[node] = functools.reduce(getattr, node.target.split("."), gm)
        elif _foldable(node) and all(n in values for n in node.all_input_nodes):
            args = fx.node.map_arg(node.args, lambda n: values[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: values[n])
            with torch.no_grad():
                if node.op == "call_method":
                    values[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    values[node] = node.target(*args, **kwargs)
    count = 0
    for node, value in values.items():
        if node.op != "get_attr" and isinstance(value, (int, float, bool)):
            _inline(node, value, values)  # e.g. eps.item() on a frozen scalar
            continue
        if node.op == "get_attr" or not isinstance(value, torch.Tensor):
            continue
        if all(u in values for u in node.users):
            continue  # only an intermediate of a larger folded subgraph
        name = f"_refcore_const_{count}"
        count += 1
        gm.register_buffer(name, value.detach().clone())
        with gm.graph.inserting_before(node):
            new = gm.graph.get_attr(name)
        node.replace_all_uses_with(new, delete_user_cb=lambda u: u not in values)
    eliminate_dead_code(gm)
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    did = (f"fold_constants: {count} parameter-only subgraph(s) folded",) if count else ()
    return PassResult("fold_constants", count, did)
