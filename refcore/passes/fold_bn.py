"""Pass: fold an inference batch-norm into the conv2d or linear that feeds it.

*What* (`fold_batch_norm`, pure tensor math, tested against torch's ``fuse_conv_bn_weights``) is
kept apart from *where* (`fold_bn`, the graph rewrite over ``F.conv2d``/``F.linear`` ->
``F.batch_norm`` chains whose parameters are graph attributes).
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
from torch import fx

from refcore.passes import PassResult


def fold_batch_norm(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    eps: float,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights of ``bn(op(x, weight, bias))`` as one op: scale per output channel (dim 0).

    scale = gamma / sqrt(var + eps); weight' = weight * scale; bias' = (bias - mean) * scale + beta.
    Computed in float64 and cast back, so folding adds no rounding beyond the final cast.
    """
    dt = weight.dtype
    w, m, v = weight.double(), mean.double(), var.double()
    g = gamma.double() if gamma is not None else torch.ones_like(m)
    b0 = bias.double() if bias is not None else torch.zeros_like(m)
    beta64 = beta.double() if beta is not None else torch.zeros_like(m)
    scale = g / torch.sqrt(v + eps)
    new_w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    return new_w.to(dt), ((b0 - m) * scale + beta64).to(dt)


def _attr(gm: fx.GraphModule, node: object) -> torch.Tensor | None:
    if node is None:
        return None
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        raise LookupError
    return (
        gm.get_parameter(node.target) if _is_param(gm, node.target) else gm.get_buffer(node.target)
    )


def _is_param(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
        return True
    except AttributeError:
        return False


def fold_bn(gm: fx.GraphModule) -> PassResult:
    """Fold every eligible F.batch_norm into its producer (in place on ``gm``); say how many, and
    why the others stay."""
    count, left = 0, collections.Counter()
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target is not F.batch_norm or bn.kwargs:
            continue
        args = list(bn.args) + [None] * (8 - len(bn.args))
        x, mean, var, gamma, beta, training, _momentum, eps = args
        op = x
        if training:
            left["in training mode"] += 1
            continue
        producer = isinstance(op, fx.Node) and op.op == "call_function"
        if not producer or op.target not in (F.conv2d, F.linear):
            left["its input is no conv2d/linear call"] += 1
            continue
        if len(op.users) != 1 or op.kwargs:
            left["its conv2d/linear has other users or keyword arguments"] += 1
            continue
        try:
            w, b = _attr(gm, op.args[1]), _attr(gm, op.args[2] if len(op.args) > 2 else None)
            stats = [_attr(gm, n) for n in (mean, var, gamma, beta)]
        except LookupError:
            left["its weights or statistics are no module attributes"] += 1
            continue
        new_w, new_b = fold_batch_norm(w, b, stats[0], stats[1], eps or 1e-5, stats[2], stats[3])
        name = f"_refcore_folded_{count}"
        count += 1
        gm.register_buffer(f"{name}_weight", new_w)
        gm.register_buffer(f"{name}_bias", new_b)
        with gm.graph.inserting_before(op):
            wn = gm.graph.get_attr(f"{name}_weight")
            bnode = gm.graph.get_attr(f"{name}_bias")
        op.args = (op.args[0], wn, bnode, *op.args[3:])
        bn.replace_all_uses_with(op)
        gm.graph.erase_node(bn)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    did = (f"fold_bn: {count} batch-norm(s) folded into conv/linear",) if count else ()
    kept = tuple(f"fold_bn: {n} batch-norm(s) left ({why})" for why, n in left.items())
    return PassResult("fold_bn", count, did, kept)
