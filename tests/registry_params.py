"""Test parameters derived from the registry: adding a spec adds its tests."""

from __future__ import annotations

import pytest

from refcore.registry import default_registry
from refcore.sampling import cases


def op_dtypes(tier: str = "small") -> list:
    reg = default_registry()
    return [
        pytest.param(name, dt, id=f"{name}-{dt}")
        for name in sorted(reg.ops)
        for dt in reg.ops[name].dtypes
        if cases(reg.ops[name], dt, tier)
    ]


def error_cases() -> list:
    reg = default_registry()
    return [
        pytest.param(name, i, id=f"{name}-{i}")
        for name in sorted(reg.ops)
        for i, _ in enumerate(reg.ops[name].errors)
    ]
