"""Fused-op references: derived from each op's pattern in specs/fusions.yaml (`refcore.derive`).

``fused.<op>`` is the composition of the pattern's references and ``fused.check_<op>`` the
composition of their checks, so a fused op is declared once, by its pattern. Precision policy:
that of the composition, intermediates rounded to the input dtype as unfused torch rounds them,
unless the pattern says ``round: once`` (see `refcore.derive`). Fused kernels round their
intermediates the same way: kept in fp32 they differ by one rounding, which the tolerances allow
for most values but not near overflow (a bf16 sum just below FLT_MAX is inf once rounded, and its
silu NaN) nor where a residual cancels a large sum.

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
