"""Pass: give every call of a spec'd torch function its own routing node (`RoutedOp`).

*Where*: a ``call_function`` node whose target is a torch function an op spec stands for
(``F.layer_norm``, ``operator.add``...), or a ``call_method`` node whose ``torch.Tensor`` method
is one (``x.add(y)``). *What*: the node's target becomes a `RoutedOp` for that function, which
runs the provider's kernel when one accepts the call and torch's function otherwise, recording
which in the routing report, exactly as `refcore.enable` would. The graph then routes without a
torch function mode around it, so its other torch calls (views, reshapes...) run at torch's
speed. A graph that still calls submodules (their code is not in the graph) is left as it is and
keeps running under the mode; the result's ``applied`` says which.

Example:
    >>> import torch, refcore
    >>> gm = torch.fx.symbolic_trace(lambda x: torch.nn.functional.gelu(x) + x)
    >>> route(gm, "reference").applied
    True
"""

from __future__ import annotations

import torch
from torch import fx

from refcore.dispatch import AUTO
from refcore.passes import PassResult


def route(gm: fx.GraphModule, provider: str = AUTO) -> PassResult:
    """Make every spec'd torch call of ``gm`` a `RoutedOp` node (in place); ``applied`` is False
    when the graph calls submodules and so must run under the routing mode."""
    from refcore.integration import RoutedOp, routable

    modules = sum(n.op == "call_module" for n in gm.graph.nodes)
    if modules:  # submodules' own torch calls need the mode
        why = f"route: the graph calls {modules} submodule(s); it runs under the routing mode"
        return PassResult("route", 0, (), (why,), applied=False)
    ops: dict[object, RoutedOp] = {}
    count = 0
    for node in gm.graph.nodes:
        func = node.target
        if node.op == "call_method":
            func = getattr(torch.Tensor, node.target, None)
        elif node.op != "call_function":
            continue
        if func is None or not routable(func):
            continue
        if func not in ops:
            ops[func] = RoutedOp(func, provider)
        node.op, node.target = "call_function", ops[func]
        count += 1
    gm.graph.lint()
    gm.recompile()
    did = (f"route: {count} spec'd torch call(s) route themselves (no routing mode)",)
    return PassResult("route", count, did if count else ())
