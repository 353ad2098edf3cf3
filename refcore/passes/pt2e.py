"""Pass: torchao's pt2e int8 graphs onto refcore's int8 ops.

A model quantized by torch's own int8 flow (``torch.export``, then torchao's ``prepare_pt2e`` /
``convert_pt2e`` with ``X86InductorQuantizer``) computes each linear layer as ``aten.linear`` of
``dequantize_per_tensor(quantize_per_tensor(x))`` and an int8 weight's
``dequantize_per_channel``: the quantized meaning, written in float (likewise ``aten.conv2d``).
The ``pt2e_qlinear`` / ``pt2e_qconv2d`` patterns of specs/fusions.yaml find those chains and
`qlinear_match` / `qconv2d_match` turn each into refcore's ``qlinear`` / ``qconv2d`` on the
quantized input (whose quantize becomes refcore's ``quantize_per_tensor``: the
same codes, bit for bit, per the specs), as ``torch.ops.refcore`` calls that run the optimized
model's provider. Where the values do not fit the ops (weight zero points not 0, another
quantized range), the chain stays as torch wrote it, with the reason in the notes.

The module's attributes name the torch ops the pattern's graph ops stand for (`GRAPH_OPS`):
torch's quantized_decomposed ops exist once ``torch.ao.quantization.fx._decomposed`` is imported.
"""

from __future__ import annotations

from typing import Any

from torch import fx

from refcore.passes import PassResult, eliminate_dead_code
from refcore.patterns import Match

_DECOMPOSED = {"quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel"}


def __getattr__(name: str) -> Any:
    import torch

    if name == "aten_linear":
        return torch.ops.aten.linear.default
    if name == "aten_conv2d":
        return torch.ops.aten.conv2d.default
    if name in _DECOMPOSED:
        import torch.ao.quantization.fx._decomposed  # registers the ops

        return getattr(torch.ops.quantized_decomposed, name).default
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _attr(gm: fx.GraphModule, node: fx.Node) -> Any:
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj


def qlinear_match(gm: fx.GraphModule, m: Match) -> fx.Node | str:
    """The rewrite of ``pt2e_qlinear``: qlinear(q, s, zp, w, weight scales, bias) for the
    linear, the quantize feeding it made refcore's."""
    return _rewrite(gm, m, "qlinear", ())


def qconv2d_match(gm: fx.GraphModule, m: Match) -> fx.Node | str:
    """The rewrite of ``pt2e_qconv2d``: qconv2d(q, s, zp, w, weight scales, bias, stride,
    padding, dilation, groups) for the conv, the quantize feeding it made refcore's."""
    c = m.captures
    return _rewrite(gm, m, "qconv2d", (c["stride"], c["padding"], c["dilation"], c["groups"]))


def _rewrite(gm: fx.GraphModule, m: Match, op: str, attrs: tuple) -> fx.Node | str:
    import torch

    from refcore.library import torch_op

    c = m.captures
    q = c["q"]
    if not (isinstance(q, fx.Node) and q.op == "call_function"):
        return "the dequantized input is not a quantize call"
    decomposed = __getattr__("quantize_per_tensor")
    qd = {decomposed: "decomposed", torch_op("quantize_per_tensor").default: "refcore"}
    kind = qd.get(q.target)
    if kind is None:
        return "the dequantized input is not a quantize_per_tensor call"
    qargs = q.args
    if len(qargs) != 6 or q.kwargs:
        return "the quantize's arguments are not the six positional ones pt2e writes"
    if tuple(qargs[1:5]) != (c["s"], c["zp"], 0, 255) or qargs[5] not in (torch.uint8, "uint8"):
        return "the quantized input is not uint8 over [0, 255] with the dequantize's scale"
    if c["wdt"] != torch.int8 or c["dqdt"] != torch.uint8:
        return "not a uint8 activation with an int8 weight"
    zps = _attr(gm, c["wzp"])
    if bool(torch.any(zps != 0)):
        return "weight zero points not 0 (qlinear's weight is symmetric)"
    scales = _attr(gm, c["ws"]).to(torch.float32)
    bias = c["bias"]
    if bias is not None and _attr(gm, bias).dtype != torch.float32:
        return "bias not float32"
    if kind == "decomposed":  # the same codes (specs/int8.yaml); refcore's kernel makes them
        q.target = torch_op("quantize_per_tensor").default
        q.args = (*qargs[:5], "uint8")
    i = 0
    while hasattr(gm, f"_refcore_qscales_{i}"):
        i += 1
    gm.register_buffer(f"_refcore_qscales_{i}", scales)
    g = gm.graph
    sn = g.get_attr(f"_refcore_qscales_{i}")
    return g.call_function(torch_op(op).default, (q, c["s"], c["zp"], c["w"], sn, bias, *attrs))


def pt2e_int8(gm: fx.GraphModule) -> PassResult:
    """Apply ``pt2e_qlinear`` and ``pt2e_qconv2d`` everywhere they fit (in place on ``gm``)."""
    from refcore.passes.fuse import rewrite

    notes: list[str] = []
    done = rewrite(gm, "int8", notes=notes)
    eliminate_dead_code(gm)
    gm.recompile()
    count = sum(done.values())
    per = ", ".join(f"{n} {name.removeprefix('pt2e_')}" for name, n in sorted(done.items()))
    did = (f"int8: pt2e int8 q/dq chains -> {per}",) if count else ()
    left = tuple(f"int8: {n}" for n in notes if " left " in n)
    return PassResult("int8", count, did, left)
