"""Pass: channels-last (NHWC) weights for 2-D convolutions.

oneDNN's CPU convolutions run NHWC natively; torch picks channels-last for a conv whose input or
weight is channels-last and keeps that layout through the following convs, pointwise ops and
batch-norms. Converting the conv weights therefore moves the whole conv stack to NHWC without
touching the model's inputs. Only strides change, never values, so the function is the same.

It works on the module (the weights) rather than on a graph, so it applies both to fx graphs and
to models captured by dynamo, whose parameters are graph inputs.
"""

from __future__ import annotations

import torch
from torch import nn


def channels_last(module: nn.Module) -> int:
    """Make every ``nn.Conv2d`` weight of ``module`` channels-last (in place); return how many."""
    count = 0
    for mod in module.modules():
        if isinstance(mod, nn.Conv2d) and mod.weight.dim() == 4:
            w = mod.weight
            if not w.is_contiguous(memory_format=torch.channels_last):
                with torch.no_grad():
                    mod.weight = nn.Parameter(
                        w.contiguous(memory_format=torch.channels_last), w.requires_grad
                    )
            count += 1
    return count


def channels_last_graph(gm: torch.fx.GraphModule) -> int:
    """Make the weight of every ``F.conv2d`` call in ``gm`` channels-last; return how many.

    For graphs whose convs were functionalized (and perhaps batch-norm folded into new buffers).
    """
    import torch.nn.functional as F

    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not F.conv2d or len(node.args) < 2:
            continue
        w = node.args[1]
        if not isinstance(w, torch.fx.Node) or w.op != "get_attr":
            continue
        owner_name, _, attr = w.target.rpartition(".")
        owner = gm.get_submodule(owner_name) if owner_name else gm
        t = getattr(owner, attr)
        if t.dim() != 4:
            continue
        if not t.is_contiguous(memory_format=torch.channels_last):
            new = t.detach().contiguous(memory_format=torch.channels_last)
            if isinstance(t, nn.Parameter):
                setattr(owner, attr, nn.Parameter(new, t.requires_grad))
            else:
                owner.register_buffer(attr, new)
        count += 1
    return count
