"""Pass: remove inference dropouts (``F.dropout(x, p, training=False)``, ``nn.Dropout`` in eval).

An eval-mode dropout is the identity, but it sits between ops a fusion pattern would join (BERT's
``dense -> dropout -> add -> layer_norm``), so removing it lets ``fuse`` see the chain.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import fx, nn

_FUNCTIONS = (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout)
_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)


def _is_identity(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in _FUNCTIONS:
        # F.dropout(input, p=0.5, training=True, inplace=False): the default trains
        training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
        return training is False
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return isinstance(mod, _MODULES) and not mod.training
    return False


def drop_dropout(gm: fx.GraphModule) -> fx.GraphModule:
    """Replace every inference dropout by its input (in place on ``gm``; returns ``gm``)."""
    for node in list(gm.graph.nodes):
        if _is_identity(gm, node) and node.args and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return gm
