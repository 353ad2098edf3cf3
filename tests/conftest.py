"""Hypothesis profiles and a count of property examples run.

Profiles: ``ci`` (thorough, derandomized so a CI result is reproducible), ``dev`` (quick, the
default for local runs), ``sanitize`` (few examples, derandomized: ``python -m refcore sanitize``
runs the native kernels under ASan, ~3x slower). Choose with ``REFCORE_HYPOTHESIS_PROFILE``;
``.ci/run`` sets ``ci``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("ci", max_examples=200, derandomize=True, **_common)
settings.register_profile("dev", max_examples=15, **_common)
settings.register_profile("sanitize", max_examples=6, derandomize=True, **_common)
settings.load_profile(os.environ.get("REFCORE_HYPOTHESIS_PROFILE", "dev"))

# Routing tests check what ran, which must not hinge on this machine's load: kernels are chosen by
# rule (the first that accepts), not by timing them against torch. tests/test_choice.py covers the
# measured choice with kernels whose speed is not in doubt.
os.environ.setdefault("REFCORE_CHOICE", "rules")

_EXAMPLES = {"count": 0}


def count_example() -> None:
    _EXAMPLES["count"] += 1


def pytest_sessionfinish(session) -> None:
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the count to the controller
        session.config.workeroutput["refcore_examples"] = _EXAMPLES["count"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    # a worker that died (a crash in native code) hands nothing over: let xdist report the crash
    _EXAMPLES["count"] += getattr(node, "workeroutput", {}).get("refcore_examples", 0)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(
        f"refcore: {_EXAMPLES['count']} property-test examples run "
        f"(hypothesis profile {settings._current_profile})"
    )
