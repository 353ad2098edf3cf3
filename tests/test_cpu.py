"""CPU features and the ISA cap that lets tests force every fallback level."""

from __future__ import annotations

import re

import pytest

from refcore import cpu


def test_features_are_known_names() -> None:
    assert cpu.features() <= cpu.KNOWN
    assert cpu.level() in cpu.LEVELS


@pytest.mark.parametrize("cap", list(cpu.LEVELS))
def test_cap_limits_level_and_features(monkeypatch, cap: str) -> None:
    monkeypatch.setenv(cpu.ENV_CAP, cap)
    names = list(cpu.LEVELS)
    assert names.index(cpu.level()) <= names.index(cap)
    allowed = set().union(*(cpu.LEVELS[n] for n in names[: names.index(cpu.level()) + 1]))
    assert cpu.features() - {"avx512_fp16"} <= allowed
    assert cpu.has("portable")
    if cap == "portable":
        assert cpu.features() == frozenset() and not cpu.has("avx2")
    assert cap in cpu.describe()


def test_bad_cap_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv(cpu.ENV_CAP, "avx9000")
    with pytest.raises(
        ValueError, match="REFCORE_CPU_CAPABILITY='avx9000': expected one of portable"
    ):
        cpu.level()


def test_unknown_level_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown ISA level 'sse9'"):
        cpu.has("sse9")


def test_detection_matches_proc_cpuinfo() -> None:
    from pathlib import Path

    try:
        flags = next(
            ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")
        )
    except (OSError, StopIteration):
        pytest.fail("no /proc/cpuinfo flags line on this Linux machine")
    have = set(flags.split(":", 1)[1].split())
    assert cpu.detected() - {"amx_os_granted"} == frozenset(have & cpu.KNOWN)


def test_machine_names_what_a_figure_depends_on() -> None:
    m = cpu.machine()
    assert m["level"] == cpu.level() and m["cores"] >= 1
    assert set(m["features"]) <= cpu.KNOWN and set(cpu.features()) <= set(m["features"])
    assert all(k.startswith("L") for k in m["caches"])


def test_kind_is_a_file_name_ending_in_the_level() -> None:
    name = cpu.kind()
    assert re.fullmatch(r"[a-z0-9_-]+", name) and name.endswith(cpu.level()), name
