"""refcore's oneDNN provider: torch's own oneDNN kernels, reached through ``torch.ops.mkldnn``.

Registered through the ``refcore.providers`` entry point as ``onednn``. What inductor does with
freezing, as kernels: the conv weight reordered once into oneDNN's blocked format for the conv
(the ``onednn_conv`` layout of specs/layouts.yaml, which `refcore.optimize`'s prepack pass gives
conv weights) and the ReLU / residual add fused as oneDNN post-ops. Routing measures these kernels
against torch's eager call like any other provider's (`refcore.choice`).

Available when ``torch.backends.mkldnn.is_available()``. Kernel modules (one per family, named as
in ``specs/``) each export ``kernels()``; they import torch (refcore's own dependency) and build
Kernel objects only.

Example:
    >>> import numpy as np, refcore
    >>> x = np.ones((1, 2, 3, 3), np.float32); w = np.ones((1, 2, 1, 1), np.float32)
    >>> refcore.run("conv2d_relu", x, w, provider="onednn")[0, 0, 0]  # doctest: +SKIP
    array([2., 2., 2.], dtype=float32)
"""

from __future__ import annotations

import importlib

from refcore.provider import Provider

FAMILIES = ("conv",)


def _probe() -> tuple[bool, str]:
    try:
        import torch
    except Exception as e:  # torch missing or broken: report, do not raise
        return False, f"torch does not import: {e!r}"
    if not torch.backends.mkldnn.is_available():
        return False, f"torch {torch.__version__} is built without oneDNN (mkldnn)"
    bf16 = "with" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "without"
    return True, f"torch {torch.__version__} oneDNN, {bf16} a bf16 path on this CPU"


def make_provider() -> Provider:
    """The entry-point factory: Kernel objects only; torch's oneDNN runs on the first call."""
    try:
        kernels = tuple(
            k for f in FAMILIES for k in importlib.import_module(f"refcore_onednn.{f}").kernels()
        )
    except Exception as e:  # a broken kernel module must show as unavailable, not break refcore
        why = f"kernel modules fail to import: {e!r}"
        return Provider(name="onednn", probe=lambda: (False, why))
    return Provider(
        name="onednn",
        kernels=kernels,
        priority=5,
        probe=_probe,
        description="torch's oneDNN kernels: prepacked conv weights, fused post-ops",
    )
