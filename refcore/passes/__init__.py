"""Graph passes on torch models; see README.md in this folder and `refcore.pipeline` for the table
that orders them. `PassResult` is what a pass reports."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

_INPLACE_OPERATORS = (
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
    operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor,
    operator.ilshift, operator.irshift,
)  # fmt: skip


def in_place(node: Any) -> bool:
    """Whether an fx node writes to its first argument: an in-place method or function
    (``x.add_(1)``, ``torch.relu_``, ``operator.iadd``), ``inplace=True``, or a module whose
    ``inplace`` is set (``nn.ReLU(inplace=True)``)."""
    if node.op == "call_module":
        mod = node.graph.owning_module.get_submodule(node.target)
        return getattr(mod, "inplace", False) is True
    if node.op not in ("call_method", "call_function"):
        return False
    name = getattr(node.target, "__name__", node.target)
    if getattr(node.target, "__module__", None) in ("operator", "_operator"):
        # operator.and_ / or_ / not_ are named for the keyword, not in place: operator's in-place
        # functions are its i-forms (found: a 4-bit weight's `q & 15` marked the graph as
        # writing its input, so it was never timed against eager)
        return node.target in _INPLACE_OPERATORS
    return (
        (isinstance(name, str) and name.endswith("_") and not name.endswith("__"))
        or node.target in _INPLACE_OPERATORS
        or node.kwargs.get("inplace") is True
    )


#: ``node.meta`` key of the calls the captured code made for their effect (`mark_statements`)
STATEMENT = "refcore_statement"


def mark_statements(gm: Any) -> None:
    """Mark the calls whose result the captured code never used (``x.add_(1)``,
    ``cache.append(kv)``): it made them for their effect, so `eliminate_dead_code` keeps them.
    Run on a graph as captured, before any pass (`refcore.pipeline.run`)."""
    for node in gm.graph.nodes:
        if node.op in ("call_method", "call_function", "call_module") and not node.users:
            node.meta[STATEMENT] = True


def eliminate_dead_code(gm: Any) -> None:
    """fx's dead-code elimination, keeping in-place calls and the captured code's statements:
    fx counts a ``call_method`` such as ``x.add_(1)`` or ``state.append(1)`` whose result is
    unused as pure and drops it, and the model's write to its input or state with it (found: an
    optimized model lost ``x.add_(1.0)``)."""
    gm.graph.eliminate_dead_code(
        is_impure_node=lambda n: n.is_impure() or in_place(n) or n.meta.get(STATEMENT, False)
    )


@dataclass(frozen=True)
class PassResult:
    """What one pass did to one graph.

    ``changed`` counts its rewrites, ``did`` says what they were and ``left`` what it left as it
    was and why (one line each, as `refcore.optimize`'s ``notes`` show them); ``applied`` is
    False when the pass declined the whole graph (``left`` says why).

    Example:
        >>> PassResult("fold_bn", 1, ("fold_bn: 1 batch-norm(s) folded into conv/linear",)).notes
        ('fold_bn: 1 batch-norm(s) folded into conv/linear',)
    """

    name: str
    changed: int = 0
    did: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    applied: bool = True

    @property
    def notes(self) -> tuple[str, ...]:
        return (*self.did, *self.left)


#: methods and functions that return a view of their first argument (writes through them reach it)
_VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "expand", "expand_as",
    "unsqueeze", "squeeze", "flatten", "unflatten", "narrow", "select", "split", "chunk", "unbind",
    "contiguous", "detach", "as_strided", "movedim", "swapaxes", "getitem", "__getitem__", "T",
    "mT", "diagonal", "unfold", "to",
})  # fmt: skip


#: the start of the note a graph that `writes_inputs_or_state` leaves in ``optimize``'s notes
WRITES = "the graph writes to "


def writes_inputs_or_state(gm: Any) -> str:
    """What an fx graph writes in place that outlives a call: an input or a parameter / buffer,
    or a view of one (`in_place`); "" when nothing. Such a model is not run more
    than once per call, so it is not timed against its eager code."""
    aliases: set[Any] = set()
    for node in gm.graph.nodes:
        first = node.args[0] if node.args else None
        name = getattr(node.target, "__name__", node.target) if node.op != "call_module" else ""
        if node.op in ("placeholder", "get_attr") or (first in aliases and name in _VIEWS):
            aliases.add(node)
        elif first in aliases and in_place(node):
            return f"{first.name} in place ({node.format_node()})"
    return ""
