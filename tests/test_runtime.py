"""refcore.runtime: one thread count for torch, the native and the numba provider."""

from __future__ import annotations

import numpy as np
import pytest

import refcore
from refcore import runtime

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_sets_torch_and_restores_it_also_on_error():
    before = refcore.get_num_threads()
    with refcore.threads(1) as n:
        assert n == 1 == torch.get_num_threads() == refcore.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError), refcore.threads(3):
        assert torch.get_num_threads() == 3
        raise KeyError("the body fails")
    assert torch.get_num_threads() == before


def test_native_kernels_take_the_count():
    if not refcore.providers()["native"].available:
        pytest.skip(f"native provider: {refcore.providers()['native'].reason}")
    from refcore_native import _runtime

    big = 4 * _runtime.PARALLEL_MIN_BYTES
    for n in (1, 3):
        with refcore.threads(n):
            assert _runtime.threads(big) == n
            assert _runtime.threads(1) == 1  # small work stays on one thread


def test_numba_pool_takes_the_count():
    numba = pytest.importorskip("numba")
    if not refcore.providers()["numba"].available:
        pytest.skip(f"numba provider: {refcore.providers()['numba'].reason}")
    x = np.ones((512, 512), np.float32)
    with refcore.threads(1):
        assert numba.get_num_threads() == 1  # set at once, before any numba call
        np.testing.assert_array_equal(refcore.run("relu", x, provider="numba"), x)
        assert numba.get_num_threads() == 1
    want = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    refcore.run("relu", x, provider="numba")
    assert numba.get_num_threads() == want


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True, None])
def test_bad_counts_are_refused_and_change_nothing(bad):
    before = torch.get_num_threads()
    with pytest.raises((TypeError, ValueError), match=r"set_num_threads: argument 'n' expected"):
        runtime.set_num_threads(bad)
    with pytest.raises((TypeError, ValueError), match=r"set_num_threads: argument 'n'"):
        with refcore.threads(bad):
            pass
    assert torch.get_num_threads() == before


def test_a_first_numba_kernel_keeps_the_users_torch_thread_count():
    """numba's pool start (once per process) set OpenMP's count, which torch reads, back to 2."""
    pytest.importorskip("numba")
    import subprocess
    import sys

    code = (
        "import numpy as np, torch, refcore\n"
        "torch.set_num_threads(1)\n"
        "refcore.run('relu', np.ones((512, 512), np.float32), provider='numba')\n"
        "print(torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if "numba" in out.stderr and "ProviderUnavailableError" in out.stderr:
        pytest.skip(out.stderr.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
