"""CPU feature detection with an environment cap, so tests can force every fallback path.

ISA levels are ordered (`LEVELS`); ``REFCORE_CPU_CAPABILITY=<level>`` caps what `features()` and
`level()` report, the way IPEX's ``ATEN_CPU_CAPABILITY`` does. Detection reads ``/proc/cpuinfo``
on Linux; other systems report no x86 features (the portable level). AMX counts only when the OS
grants the tile data state to this process (``arch_prctl(ARCH_REQ_XCOMP_PERM)``).

Example:
    >>> level() in LEVELS
    True
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

ENV_CAP = "REFCORE_CPU_CAPABILITY"

#: ordered ISA levels, each with the features it requires on top of the previous one.
LEVELS: dict[str, frozenset[str]] = {
    "portable": frozenset(),
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "avx512_bf16": frozenset({"avx512_bf16", "avx512_vnni"}),
    "amx": frozenset({"amx_tile", "amx_bf16", "amx_int8", "amx_os_granted"}),
}

#: feature names refcore reports (the /proc/cpuinfo spelling).
KNOWN = frozenset().union(*LEVELS.values(), {"avx512_fp16"})

_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64 syscall number


@functools.cache
def detected() -> frozenset[str]:
    """Features the hardware and OS offer, uncapped (computed once per process)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    found = set(flags & KNOWN)
    if {"amx_tile"} <= found and _request_amx():
        found.add("amx_os_granted")
    return frozenset(found)


def _request_amx() -> bool:
    """Ask Linux for AMX tile state for this process; True when granted (idempotent)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        return False
    return rc == 0


def _cap() -> str:
    cap = os.environ.get(ENV_CAP, "").strip().lower()
    if cap and cap not in LEVELS:
        raise ValueError(f"{ENV_CAP}={cap!r}: expected one of {', '.join(LEVELS)}")
    return cap or list(LEVELS)[-1]


def level() -> str:
    """The highest ISA level both the machine and the cap allow."""
    return _level(os.environ.get(ENV_CAP))  # the cap is read on every call: tests change it


@functools.cache
def _level(raw_cap: str | None) -> str:
    have, best = detected(), "portable"
    cap = _cap()
    for name, needs in LEVELS.items():
        if not needs <= have:
            break
        best = name
        if name == cap:
            break
    return best


def features() -> frozenset[str]:
    """Detected features, less those above the capped level (see `level`)."""
    allowed: set[str] = set()
    for name, needs in LEVELS.items():
        allowed |= needs
        if name == level():
            break
    extra = {"avx512_fp16"} if level() in ("avx512_bf16", "amx") else set()
    return frozenset(detected() & (allowed | extra))


def has(isa_level: str) -> bool:
    """True when ``isa_level`` is at or below the current `level()`."""
    names = list(LEVELS)
    if isa_level not in LEVELS:
        raise ValueError(f"unknown ISA level {isa_level!r}; expected one of {', '.join(names)}")
    return names.index(isa_level) <= names.index(level())


def describe() -> str:
    """One line for humans: CPU model, level, features, and the cap when set."""
    cap = os.environ.get(ENV_CAP)
    model = _model_name()
    feats = " ".join(sorted(features())) or "none"
    capped = f" (capped by {ENV_CAP}={cap})" if cap else ""
    return f"{model}: level {level()}{capped}; features: {feats}"


def machine() -> dict[str, object]:
    """What a benchmark figure depends on: CPU model, ISA level, features (detected, uncapped),
    cores, and the data cache sizes per level (Linux sysfs; empty elsewhere)."""
    caches: dict[str, str] = {}
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (d / "type").read_text().strip()
            if kind != "Instruction":
                caches[f"L{(d / 'level').read_text().strip()}"] = (d / "size").read_text().strip()
        except OSError:
            continue
    return {
        "model": _model_name(),
        "family_model": _cpuinfo_field("cpu family") + "/" + _cpuinfo_field("model"),
        "level": level(),
        "features": sorted(detected()),
        "cores": os.cpu_count(),
        "caches": caches,
    }


def kind() -> str:
    """A file-name-safe name for this kind of CPU (model, family/model, ISA level): benchmark
    results are stored per kind, since the CPU under the project changes between machines.

    Example:
        >>> kind().endswith(level())
        True
    """
    raw = f"{_model_name()} f{_cpuinfo_field('cpu family')}m{_cpuinfo_field('model')} {level()}"
    return "-".join("".join(c if c.isalnum() or c == "_" else " " for c in raw.lower()).split())


def _cpuinfo_field(name: str) -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == name:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def _model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
