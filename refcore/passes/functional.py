"""Pass: turn calls of known ``nn`` modules into the torch functions the specs name.

Fusion and folding patterns are written over functions (the specs' ``torch.function``), so a graph
first gets its ``nn.Linear``/``nn.GELU``/... calls rewritten as ``F.linear``/``F.gelu``/... with the
module's parameters as ``get_attr`` nodes. Modules it does not know, or whose configuration the
function form would change (a conv with non-zero padding mode, a batch-norm in training mode), are
left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from refcore.passes import eliminate_dead_code

# module type -> (function, args builder: (module, input node, attr) -> (args, kwargs)) or None
Rewrite = Callable[[nn.Module, fx.Node, Callable[[str], fx.Node]], tuple[tuple, dict] | None]


def _linear(m, x, attr):
    return (x, attr("weight"), attr("bias") if m.bias is not None else None), {}


def _conv2d(m, x, attr):
    if m.padding_mode != "zeros":
        return None
    bias = attr("bias") if m.bias is not None else None
    return (x, attr("weight"), bias, m.stride, m.padding, m.dilation, m.groups), {}


def _batch_norm(m, x, attr):
    if m.training or not m.track_running_stats:
        return None
    w = attr("weight") if m.affine else None
    b = attr("bias") if m.affine else None
    return (x, attr("running_mean"), attr("running_var"), w, b, False, 0.0, m.eps), {}


def _layer_norm(m, x, attr):
    w = attr("weight") if m.weight is not None else None
    b = attr("bias") if m.bias is not None else None
    return (x, tuple(m.normalized_shape), w, b, m.eps), {}


def _group_norm(m, x, attr):
    w = attr("weight") if m.affine else None
    b = attr("bias") if m.affine else None
    return (x, m.num_groups, w, b, m.eps), {}


REWRITES: dict[type, tuple[Callable[..., Any], Rewrite]] = {
    nn.Linear: (F.linear, _linear),
    nn.Conv2d: (F.conv2d, _conv2d),
    nn.BatchNorm1d: (F.batch_norm, _batch_norm),
    nn.BatchNorm2d: (F.batch_norm, _batch_norm),
    nn.LayerNorm: (F.layer_norm, _layer_norm),
    nn.GroupNorm: (F.group_norm, _group_norm),
    nn.GELU: (F.gelu, lambda m, x, attr: ((x,), {"approximate": m.approximate})),
    nn.ReLU: (F.relu, lambda m, x, attr: ((x,), {})),
    nn.SiLU: (F.silu, lambda m, x, attr: ((x,), {})),
    nn.Sigmoid: (torch.sigmoid, lambda m, x, attr: ((x,), {})),
    nn.Softmax: (F.softmax, lambda m, x, attr: ((x, m.dim), {})),
}


def functionalize(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite known module calls as function calls (in place on ``gm``'s graph; returns ``gm``)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or len(node.args) != 1 or node.kwargs:
            continue
        mod = gm.get_submodule(node.target)
        entry = REWRITES.get(type(mod))
        if entry is None:
            continue
        fn, build = entry
        with gm.graph.inserting_before(node):

            def attr(name: str, _t=node.target) -> fx.Node:
                return gm.graph.get_attr(f"{_t}.{name}")

            built = build(mod, node.args[0], attr)
            if built is None:
                continue
            new = gm.graph.call_function(fn, *built)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    eliminate_dead_code(gm)
    gm.recompile()
    return gm
