"""Graph passes on torch models; see README.md in this folder and `refcore.pipeline` for the table
that orders them. `PassResult` is what a pass reports."""

from __future__ import annotations

from dataclasses import dataclass


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
