"""refcore's Numba provider: JIT SIMD kernels for memory-bound, sparse and embedding ops.

Registered through the ``refcore.providers`` entry point as ``numba``. Kernels arrive with the
numba provider issue; until then the provider reports itself and implements nothing.
"""

from __future__ import annotations

from refcore.provider import Provider


def _probe() -> tuple[bool, str]:
    try:
        import numba
    except Exception as e:  # numba missing or broken (llvmlite mismatch): report, do not raise
        return False, f"numba does not import: {e!r}"
    return True, f"numba {numba.__version__}"


def make_provider() -> Provider:
    """The entry-point factory; cheap: numba is imported only when availability is asked."""
    return Provider(
        name="numba",
        kernels=(),
        priority=10,
        probe=_probe,
        description="Numba JIT kernels (memory-bound, sparse, embedding ops)",
    )
