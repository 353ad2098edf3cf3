"""Pass: the attention pattern ``softmax(q @ k^T * scale + mask) @ v`` -> one
``F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)`` call.

Models written with eager attention (transformers' ``attn_implementation="eager"``, older
models, hand-written blocks) spell attention out as a small graph, not a chain, so this pattern
lives here rather than in ``specs/fusions.yaml`` (whose patterns are chains). The replacement is
torch's own SDPA call, so it needs no provider kernel: it routes to one when a provider has it,
and torch's fused kernel runs otherwise. Variants matched: scale by ``mul`` or ``div`` or none,
additive mask or none, an inference dropout between softmax and the second matmul (only when
``drop_dropout`` removed it first), k transposed by ``transpose(-2, -1)`` or ``mT``-like dims.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

# each role: the function targets and method names that play it
MATMUL = ({torch.matmul, operator.matmul}, {"matmul", "__matmul__"})
MUL = ({torch.mul, operator.mul}, {"mul", "__mul__"})
DIV = ({torch.div, operator.truediv}, {"div", "__truediv__"})
ADD = ({torch.add, operator.add}, {"add", "__add__"})
SOFTMAX = ({F.softmax, torch.softmax}, {"softmax"})
TRANSPOSE = ({torch.transpose}, {"transpose"})


def _plays(node: Any, role: tuple[set, set]) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in role[0]
    return node.op == "call_method" and node.target in role[1]


def _sole_user(node: fx.Node) -> bool:
    return len(node.users) == 1


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


def _meta(node: Any) -> tuple[int | None, Any]:
    """(ndim, dtype) from dynamo's example value or fx ShapeProp's tensor_meta; None if unknown.

    The mask's dtype must be known: an additive bool mask means the opposite of SDPA's bool mask.
    """
    if not isinstance(node, fx.Node):
        return None, None
    val = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(val, torch.Tensor):
        return val.dim(), val.dtype
    tm = node.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "dtype"):
        return len(tm.shape), tm.dtype
    return None, None


def _ndim(node: Any) -> int | None:
    return _meta(node)[0]


def _dtype(node: Any) -> Any:
    return _meta(node)[1]


def _untransposed(kt: Any) -> Any:
    """k if ``kt`` is k with its last two dims swapped, else None."""
    if not _plays(kt, TRANSPOSE) or len(kt.args) != 3 or kt.kwargs:
        return None
    d0, d1 = sorted(kt.args[1:])
    nd = _ndim(kt.args[0])
    if (d0, d1) == (-2, -1) or (nd is not None and (d0, d1) == (nd - 2, nd - 1)):
        return kt.args[0]
    return None


def _softmax_dim_is_last(sm: fx.Node) -> bool:
    dim = _arg(sm, 1, "dim")
    if sm.kwargs.get("dtype") is not None or (sm.op == "call_function" and len(sm.args) > 3):
        return False
    return dim == -1 or (dim is not None and dim == (_ndim(sm.args[0]) or 0) - 1)


def _match(out: fx.Node) -> dict[str, Any] | None:
    """The SDPA arguments if ``out`` ends the attention pattern."""
    if not _plays(out, MATMUL) or len(out.args) != 2 or out.kwargs:
        return None
    probs, v = out.args
    if not _plays(probs, SOFTMAX) or not _sole_user(probs) or not _softmax_dim_is_last(probs):
        return None
    node, found = probs.args[0], {"mask": None, "scale": 1.0, "scale_div": None}
    if _plays(node, ADD) and _sole_user(node) and len(node.args) == 2 and not node.kwargs:
        scores, mask = node.args
        if not isinstance(mask, fx.Node) or _dtype(mask) is None or _dtype(mask) != _dtype(out):
            return None  # a float mask of the attention's dtype only (SDPA's rule)
        found["mask"], node = mask, scores
    if _plays(node, MUL) and _sole_user(node) and len(node.args) == 2 and not node.kwargs:
        found["scale"], node = node.args[1], node.args[0]
    elif _plays(node, DIV) and _sole_user(node) and len(node.args) == 2 and not node.kwargs:
        found["scale_div"], node = node.args[1], node.args[0]
    if isinstance(found["scale"], fx.Node) and _ndim(found["scale"]) is not None:
        return None  # a tensor scale: SDPA takes a number
    if not _plays(node, MATMUL) or not _sole_user(node) or len(node.args) != 2 or node.kwargs:
        return None
    q, kt = node.args
    k = _untransposed(kt)
    if k is None:
        return None
    return {"q": q, "k": k, "v": v, **found, "chain": [node, probs, out]}


def fuse_attention(gm: fx.GraphModule) -> fx.GraphModule:
    """Rewrite every attention pattern as an SDPA call (in place; returns ``gm``)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.graph is not gm.graph:
            continue
        found = _match(node)
        if found is None:
            continue
        with gm.graph.inserting_before(node):
            scale = found["scale"]
            if found["scale_div"] is not None:
                scale = gm.graph.call_function(operator.truediv, (1.0, found["scale_div"]))
            new = gm.graph.call_function(
                F.scaled_dot_product_attention,
                (found["q"], found["k"], found["v"]),
                {"attn_mask": found["mask"], "scale": scale},
            )
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        count += 1
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    gm.refcore_attention = count  # type: ignore[attr-defined]
    return gm
