"""Pass: spell what a captured graph computes so that a tree pattern can see it.

Two rewrites, neither of which changes what runs:

1. **In-place results threaded.** An in-place tensor method returns its tensor itself, so after
   ``m = a.op_(...)`` every later read of ``a`` may read ``m`` instead: the same object at run
   time. PyG's mean aggregation writes ``count = src.new_zeros(n); count.scatter_add_(0, index,
   ones); count.clamp(min=1)``; threaded, the clamp reads the scatter's result, and the
   ``gather_scatter_mean`` pattern of specs/fusions.yaml sees the count it divides by.
2. **Recorded sizes as values.** ``v.size()[i]`` / ``v.size(i)`` whose value the graph records
   as a static int (dynamo's example values) becomes that int, and one equal to a graph input's
   symbol becomes that input; a size read alone then no longer keeps ``v`` in the graph
   (PyG's scatter reads the gathered message's size to shape its output, which kept the E x F
   message alive beside a fused op).

Example:
    >>> import torch
    >>> def f(x):
    ...     c = x.new_zeros(3)
    ...     c.add_(1)
    ...     return c.clamp(min=2)
    >>> gm = torch.fx.symbolic_trace(f)
    >>> canonicalize(gm).changed
    1
    >>> [n.args[0].target for n in gm.graph.nodes if n.target == "clamp"]
    ['add_']
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

from refcore.passes import PassResult, in_place


def canonicalize(gm: fx.GraphModule) -> PassResult:
    """Apply both rewrites to ``gm`` in place; report how many edges / sizes changed."""
    threaded = _thread_inplace(gm)
    sizes = _sizes(gm)
    gm.graph.lint()
    gm.recompile()
    did = []
    if threaded:
        did.append(f"canonicalize: {threaded} read(s) after an in-place call read its result")
    if sizes:
        did.append(f"canonicalize: {sizes} recorded size(s) used as values")
    return PassResult("canonicalize", threaded + sizes, tuple(did))


def _thread_inplace(gm: fx.GraphModule) -> int:
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    count = 0
    for m in list(gm.graph.nodes):
        if m.op != "call_method" or not m.args or not isinstance(m.args[0], fx.Node):
            continue
        if not in_place(m):
            continue
        a = m.args[0]
        for user in list(a.users):
            if user is not m and position[user] > position[m]:
                user.replace_input_with(a, m)
                count += 1
    return count


def _sizes(gm: fx.GraphModule) -> int:
    symbols = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("example_value", n.meta.get("val"))
            if hasattr(v, "node") and hasattr(v.node, "expr"):
                symbols.setdefault(v.node.expr, n)
    count = 0
    for n in list(gm.graph.nodes):
        src = _size_read(n)
        if src is None:
            continue
        value = _known(n.meta.get("example_value", n.meta.get("val")), symbols)
        if value is None:
            continue
        n.replace_all_uses_with(value)
        gm.graph.erase_node(n)
        count += 1
        if src.op == "call_method" and src.target == "size" and not src.users:
            gm.graph.erase_node(src)
    return count


def _size_read(n: fx.Node) -> fx.Node | None:
    """The ``size`` node an int read comes from (``v.size()[i]`` or ``v.size(i)``), or None."""
    if n.op == "call_function" and n.target is operator.getitem:
        base, i = n.args
        if isinstance(base, fx.Node) and base.op == "call_method" and base.target == "size" \
                and len(base.args) == 1 and not base.kwargs and isinstance(i, int):  # fmt: skip
            return base
    if n.op == "call_method" and n.target == "size" and len(n.args) == 2 and not n.kwargs:
        return n
    return None


def _known(value: Any, symbols: dict) -> Any:
    """A static int, the placeholder holding the same symbol, or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    node = getattr(value, "node", None)
    if node is None:
        return None
    static = node.maybe_as_int() if hasattr(node, "maybe_as_int") else None
    if static is not None:
        return int(static)
    return symbols.get(getattr(node, "expr", None))
