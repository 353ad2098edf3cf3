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


class _Probe(torch.nn.Module):
    """A per-sample model that also records, per call, the thread count and cores it ran on."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.seen = []

    def forward(self, x, scale=None, *, as_dict=False):
        import os

        self.seen.append((torch.get_num_threads(), tuple(sorted(os.sched_getaffinity(0)))))
        y = torch.relu(self.lin(x))
        if scale is not None:
            y = y * scale
        return {"y": y, "pair": (y, y.sum(1))} if as_dict else y


def _cores():
    import os

    return sorted(os.sched_getaffinity(0))


def test_multistream_agrees_with_the_model_and_splits_the_batch():
    model = _Probe()
    streams = min(2, len(_cores()))
    x = torch.randn(5, 6)
    scale = torch.rand(5, 1)
    with runtime.MultiStream(model, streams=streams) as ms:
        torch.testing.assert_close(ms(x, scale), model(x, scale))
        out = ms(x, scale=scale, as_dict=True)
        want = model(x, scale=scale, as_dict=True)
        torch.testing.assert_close(out["y"], want["y"])
        torch.testing.assert_close(out["pair"][1], want["pair"][1])
        assert isinstance(out["pair"], tuple)
        per = len(_cores()) // streams
        assert [len(c) for c in ms.cores] == [per] * streams
        assert sorted(sum(ms.cores, ())) == _cores()[: per * streams]  # disjoint, the allowed ones
    if streams > 1:
        in_streams = [s for s in model.seen if s[1] in ms.cores]
        assert len(in_streams) == 2 * streams  # two calls, each split over every stream
        assert all(threads == len(cores) for threads, cores in in_streams)


def test_multistream_gives_the_callers_thread_count_back():
    """torch's count is process-wide: open, the streams' count; closed, the caller's again."""
    before = torch.get_num_threads()
    streams = min(2, len(_cores()))
    with runtime.MultiStream(_Probe(), streams=streams) as ms:
        ms(torch.randn(4, 6))
        assert torch.get_num_threads() == len(_cores()) // streams
    assert torch.get_num_threads() == before
    ms.close()  # again: nothing more happens
    assert torch.get_num_threads() == before


def test_multistream_keeps_the_callers_grad_mode_and_raises_the_models_errors():
    model = _Probe()
    streams = min(2, len(_cores()))
    x = torch.randn(4, 6)
    with runtime.MultiStream(model, streams=streams) as ms:
        assert ms(x).requires_grad
        with torch.no_grad():
            assert not ms(x).requires_grad
        with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
            ms(torch.randn(4, 7))
        torch.testing.assert_close(ms(torch.randn(1, 6)).shape, torch.Size([1, 4]))  # one stream
    with pytest.raises(RuntimeError, match="called after close"):
        ms(x)


def test_multistream_bad_arguments():
    with pytest.raises(ValueError, match=r"MultiStream: argument 'streams' expected an int >= 1"):
        runtime.MultiStream(_Probe(), streams=0)
    with pytest.raises(ValueError, match=r"'streams' expected at most 1 \(one core each"):
        runtime.MultiStream(_Probe(), streams=2, cores=[_cores()[0]])
    if len(_cores()) >= 2:
        with (
            runtime.MultiStream(lambda x: x.sum(), streams=2) as ms,
            pytest.raises(TypeError, match="0-dim"),
        ):
            ms(torch.ones(4, 3))
