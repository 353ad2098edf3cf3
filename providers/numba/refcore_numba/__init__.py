"""refcore's Numba provider: JIT SIMD kernels for memory-bound, sparse and embedding ops.

Registered through the ``refcore.providers`` entry point as ``numba``. Kernel modules (one per
family, named as in ``specs/``) each export ``KERNELS``; they are imported when the provider is
first discovered (on the first `refcore.run`/`explain`), never at ``import refcore``, and their
functions compile on first call, cached on disk (``cache=True``).
"""

from __future__ import annotations

import importlib

from refcore.provider import Provider

FAMILIES = (
    "elementwise", "norm", "reduction", "sparse", "embedding", "dlrm", "fused", "int8", "optim",
)  # fmt: skip


def _load() -> tuple[tuple, str]:
    try:
        import numba
    except Exception as e:  # numba missing or broken (llvmlite mismatch): report, do not raise
        return (), f"numba does not import: {e!r}"
    kernels = []
    for family in FAMILIES:
        try:
            mod = importlib.import_module(f"refcore_numba.{family}")
        except ModuleNotFoundError as e:
            if e.name != f"refcore_numba.{family}":
                raise
            continue  # a family without kernels yet
        kernels.extend(mod.KERNELS)
    layer = numba.config.THREADING_LAYER
    return tuple(kernels), f"numba {numba.__version__}, threading layer {layer}"


def make_provider() -> Provider:
    """The entry-point factory: import the kernel modules (numba), compile nothing."""
    try:
        kernels, reason = _load()
    except Exception as e:  # a broken kernel module must show as unavailable, not break refcore
        why = f"kernel modules fail to import: {e!r}"
        return Provider(name="numba", probe=lambda: (False, why))
    ok = bool(reason.startswith("numba "))
    return Provider(
        name="numba",
        kernels=kernels,
        priority=10,
        probe=lambda: (ok, reason),
        description="Numba JIT kernels (memory-bound, sparse, embedding ops)",
    )
