"""refcore's native provider: C kernels with runtime ISA dispatch, compiled and loaded via cffi.

Registered through the ``refcore.providers`` entry point as ``native``. Discovery
(`make_provider`) only builds Kernel objects: nothing is compiled at ``import refcore`` or when
providers are listed. The library is compiled on first use of the provider (its availability
probe, which dispatch runs before choosing a kernel) or ahead of time with `build`
(``python -m refcore build``), into a per-user cache (see `refcore_native._build`). No compiler,
or a failed build, leaves the provider unavailable with the reason and the path of the compiler
output.

Each kernel exists once per ISA level (``csrc/<family>_<level>.c``, compiled with that level's
flags) and is registered as its own `Kernel` with ``isa=`` and a priority rising with the level,
so dispatch runs the best variant `refcore.cpu` allows. Variants above the level allowed at
discovery (the CPU, capped by ``REFCORE_CPU_CAPABILITY``) are not registered, so the generic
suite run under a cap tests exactly the variants that can run.

Example:
    >>> import numpy as np, refcore
    >>> refcore.run("silu", np.float32([0.0, 1.0]), provider="native")  # doctest: +SKIP
    array([0.       , 0.7310586], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path

from refcore import cpu
from refcore.provider import Provider
from refcore_native._build import FAMILIES, BuildError

__all__ = ["BuildError", "build", "make_provider", "sanitize"]


def build(force: bool = False) -> Path:
    """Compile the native library into the cache unless a valid build is there (or ``force``);
    load it to check it works and return its path. Raises `BuildError` with the reason (the
    compiler output is in the file named by its ``log_path``).

    This is what ``python -m refcore build`` calls. A rebuild with ``force`` replaces the file
    atomically; a process that already loaded the library keeps its copy.
    """
    from refcore_native import _build

    return _build.load(force=force).path


#: the native kernel tests, from the project root: `sanitize` hands them to ``python -m refcore
#: sanitize``, which runs each selection as one pytest process under the sanitized build
SANITIZE_TESTS = (
    ("tests/test_kernels.py", "-k", "native"),
    ("tests/test_gemm.py", "tests/test_native_*.py"),
    ("tests/test_optim.py", "-k", "native"),
)


def sanitize() -> tuple[dict[str, str], tuple[tuple[str, ...], ...]]:
    """The environment of a sanitized run (``REFCORE_NATIVE_SANITIZE=1`` and the preloaded ASan /
    UBSan runtimes, see `refcore_native._build.sanitizer_env`) and the native kernel tests to run
    under it. Raises `BuildError` when the compiler has no sanitizer runtime.

    Example:
        >>> env, tests = sanitize()  # doctest: +SKIP
        >>> env["REFCORE_NATIVE_SANITIZE"], tests[0]  # doctest: +SKIP
        ('1', ('tests/test_kernels.py', '-k', 'native'))
    """
    from refcore_native import _build

    return _build.sanitizer_env(), SANITIZE_TESTS


def _probe() -> tuple[bool, str]:
    if os.name != "posix":  # the cache checks (owners, modes) and the build lock are POSIX
        return False, f"the native provider builds on POSIX systems only (os.name={os.name!r})"
    try:
        import cffi
    except Exception as e:  # cffi missing or broken: report, do not raise
        return False, f"cffi does not import: {e!r}"
    from refcore_native import _build

    try:
        lib = _build.library()
        cc = _build.recipe().cc_version
    except BuildError as e:
        return False, str(e)
    return True, f"cffi {cffi.__version__}, {cc}, ISA level {cpu.level()}; {lib.how}: {lib.path}"


def _kernels() -> tuple:
    """Every family's kernels; the portable C ones are correctness fallbacks (`Kernel.fallback`):
    plain loops without vector code never beat torch's kernels, so routing leaves such calls to
    torch (measured on an AVX2-only Zen 3: the demo ran at 0.27-0.49x eager with them chosen)."""
    out: list = []
    for family in FAMILIES:
        out.extend(importlib.import_module(f"refcore_native.{family}").kernels())
    return tuple(dataclasses.replace(k, fallback=True) if k.isa == "portable" else k for k in out)


def make_provider() -> Provider:
    """The entry-point factory: Kernel objects only; nothing is compiled until first use."""
    try:
        kernels = _kernels()
    except Exception as e:  # a broken kernel module must show as unavailable, not break refcore
        why = f"kernel modules fail to import: {e!r}"
        return Provider(name="native", probe=lambda: (False, why))
    return Provider(
        name="native",
        kernels=kernels,
        priority=20,
        probe=_probe,
        build=lambda force: f"kernels built: {build(force=force)}",
        sanitize=sanitize,
        description="C kernels (AVX2, AVX-512, AVX512-BF16, AMX) built via cffi",
    )
