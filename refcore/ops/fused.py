"""Fused-op references: derived from each op's pattern in specs/fusions.yaml (`refcore.derive`).

``fused.<op>`` is the composition of the pattern's references and ``fused.check_<op>`` the
composition of their checks, so a fused op is declared once, by its pattern. Precision policy:
that of the composition, intermediates rounded to the input dtype as unfused torch rounds them,
unless the pattern says ``round: once`` (see `refcore.derive`). A fused kernel that keeps the
intermediate in fp32 differs by at most that rounding, which the spec tolerances allow.

Example:
    >>> import numpy as np
    >>> from refcore.ops import fused
    >>> fused.linear_relu(np.float32([[1.0, -1.0]]), np.float32([[1.0, 0.0], [0.0, 1.0]]))
    array([[1., 0.]], dtype=float32)
"""

from __future__ import annotations

from refcore import derive


def __getattr__(name: str) -> derive.Derived:
    return derive.lookup(name, "reference")
