"""Pass: fold an inference batch-norm into the conv2d or linear that feeds it.

*What* (`fold_batch_norm`, pure tensor math, tested against torch's ``fuse_conv_bn_weights``) is
kept apart from *where*: the ``fold_batch_norm`` pattern of specs/fusions.yaml recognises
``F.conv2d``/``F.linear`` -> ``F.batch_norm`` chains whose parameters are graph attributes, and
`fold_match` rewrites a match (`fold_bn` applies the pattern).

The same for a per-channel affine of constants after a conv2d (`fold_channel_affine`, the
``fold_channel_affine`` pattern, `fold_affine` the pass): torchvision's ``FrozenBatchNorm2d``
computes ``x * scale + shift`` from its buffers, which fold_constants turns into two constants.
Without a conv before it, the ``channel_affine`` pattern fuses it into the ``channel_affine`` op
(stage fuse).
"""

from __future__ import annotations

import torch
from torch import fx

from refcore.passes import PassResult, eliminate_dead_code
from refcore.patterns import Match, op_calls, plays
from refcore.registry import default_registry


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


def fold_channel_affine(
    weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights of ``op(x, weight, bias) * scale + shift`` as one op (one scale and shift per
    output channel, dim 0 of ``weight``): weight' = weight * scale, bias' = bias * scale + shift.
    In float64, cast back once."""
    dt = weight.dtype
    s, t = scale.double().reshape(-1), shift.double().reshape(-1)
    b0 = bias.double() if bias is not None else torch.zeros_like(s)
    new_w = weight.double() * s.reshape(-1, *([1] * (weight.dim() - 1)))
    return new_w.to(dt), (b0 * s + t).to(dt)


def _tensor(gm: fx.GraphModule, node: object) -> torch.Tensor | None:
    if node is None:
        return None
    assert isinstance(node, fx.Node) and node.op == "get_attr"  # the pattern's where says so
    try:
        return gm.get_parameter(node.target)
    except AttributeError:
        return gm.get_buffer(node.target)


# the producers a fold rewrites (the patterns' producer ops), and the argument taking the
# per-channel factor: a float conv2d / linear its weight, an int8 qconv2d / qlinear its
# weight_scales (specs/int8.yaml); its position and bias's come from the op's signature
_FACTOR = {"conv2d": "weight", "linear": "weight", "qconv2d": "weight_scales",
           "qlinear": "weight_scales"}  # fmt: skip


def _slots(op: str) -> tuple[int, int]:
    names = [a.name for a in default_registry().op(op).signature.positional]
    return names.index(_FACTOR[op]), names.index("bias")


def fold_match(gm: fx.GraphModule, m: Match) -> fx.Node | str:
    """The rewrite of the ``fold_batch_norm`` / ``fold_batch_norm_int8`` /
    ``fold_channel_affine`` patterns (specs/fusions.yaml): the producer with its folded weight
    (or int8 weight scales) and bias as new buffers of ``gm``; it replaces the batch-norm (or the
    affine's add)."""
    producer, c = m.captures["producer"], m.captures
    if producer.kwargs:
        return "the producer takes keyword arguments"
    op = next(n for n in _FACTOR if plays(op_calls(n), producer))
    wi, bi = _slots(op)
    if len(producer.args) <= wi:
        return f"the {op} does not take its weight positionally"
    if "scale" in c:  # fold_channel_affine
        new_w, new_b = fold_channel_affine(_tensor(gm, c["conv_weight"]),
                                           _tensor(gm, c["conv_bias"]), _tensor(gm, c["scale"]),
                                           _tensor(gm, c["shift"]))  # fmt: skip
    else:
        new_w, new_b = fold_batch_norm(
            _tensor(gm, c["conv_weight"]), _tensor(gm, c["conv_bias"]),
            _tensor(gm, c["running_mean"]), _tensor(gm, c["running_var"]), c["eps"] or 1e-5,
            _tensor(gm, c["weight"]), _tensor(gm, c["bias"]),
        )  # fmt: skip
    i = 0
    while hasattr(gm, f"_refcore_folded_{i}_weight"):
        i += 1
    name = f"_refcore_folded_{i}"
    gm.register_buffer(f"{name}_weight", new_w)
    gm.register_buffer(f"{name}_bias", new_b)
    with gm.graph.inserting_before(producer):
        wn = gm.graph.get_attr(f"{name}_weight")
        bn = gm.graph.get_attr(f"{name}_bias")
    args = list(producer.args) + [None] * (bi + 1 - len(producer.args))
    args[wi], args[bi] = wn, bn
    producer.args = tuple(args)
    return producer


def fold_bn(gm: fx.GraphModule) -> PassResult:
    """Fold every eligible F.batch_norm into its producer (in place on ``gm``); say how many, and
    why the others stay (the ``fold_batch_norm`` pattern's declines)."""
    from refcore.passes.fuse import rewrite

    notes: list[str] = []
    done = rewrite(gm, "fold_bn", notes=notes)
    eliminate_dead_code(gm)
    gm.delete_all_unused_submodules()
    gm.recompile()
    count = sum(done.values())
    did = (f"fold_bn: {count} batch-norm(s) folded into conv/linear",) if count else ()
    kept = tuple(f"fold_bn: {n}" for n in notes if " left " in n)
    return PassResult("fold_bn", count, did, kept)


def fold_affine(gm: fx.GraphModule) -> PassResult:
    """Fold every per-channel affine of constants after a conv2d into it (in place on ``gm``)."""
    from refcore.passes.fuse import rewrite

    notes: list[str] = []
    count = sum(rewrite(gm, "fold_affine", notes=notes).values())
    eliminate_dead_code(gm)
    gm.delete_all_unused_submodules()
    gm.recompile()
    did = (f"fold_affine: {count} per-channel scale/shift(s) folded into conv2d",) if count else ()
    return PassResult(
        "fold_affine", count, did, tuple(f"fold_affine: {n}" for n in notes if " left " in n)
    )
