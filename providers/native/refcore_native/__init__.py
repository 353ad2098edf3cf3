"""refcore's native provider: C kernels with runtime ISA dispatch, compiled and loaded via cffi.

Registered through the ``refcore.providers`` entry point as ``native``. Kernels arrive with the
native provider issue; until then the provider reports whether it could build here (cffi and a C
compiler present) and implements nothing.
"""

from __future__ import annotations

import os
import shutil

from refcore import cpu
from refcore.provider import Provider


def _probe() -> tuple[bool, str]:
    try:
        import cffi
    except Exception as e:
        return False, f"cffi does not import: {e!r}"
    cc = os.environ.get("CC", "cc")
    path = shutil.which(cc) or shutil.which("gcc")
    if path is None:
        return False, f"no C compiler found (looked for {cc!r} and 'gcc' on PATH)"
    return True, f"cffi {cffi.__version__}, compiler {path}, ISA level {cpu.level()}"


def make_provider() -> Provider:
    """The entry-point factory; cheap: nothing is compiled until a kernel is first used."""
    return Provider(
        name="native",
        kernels=(),
        priority=20,
        probe=_probe,
        description="C kernels (AVX-512, AVX512-BF16, VNNI, AMX) via cffi",
    )
