"""The standing fuzz suite (refcore.fuzz): bad and extreme inputs per kernel, in worker processes.

A short profile runs here: every native and numba kernel, a few calls each, must give no wrong
result, no crash and no hang. ``python -m refcore fuzz --profile fuzz`` runs 100,000 calls per
kernel. The harness itself is shown to fail: a wrong, an aborting and a hanging kernel in a scratch
provider (tests/fuzz_fakes.py) are reported as such.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from refcore import fuzz_run
from refcore.fuzz import draw_call, judge
from refcore.provider import Provider, installed, using_providers
from refcore.registry import default_registry

REG = default_registry()
HERE = Path(__file__).parent
FAKES = fuzz_run.Settings(
    timeout=5, wall_timeout=5, factory="fuzz_fakes:providers",
    env={"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])},
)  # fmt: skip
#: calls per kernel in the normal test run (REFCORE_FUZZ_CALLS overrides)
CALLS = int(os.environ.get("REFCORE_FUZZ_CALLS", "10"))


def _available() -> list[str]:
    return [p for p in ("native", "numba") if p in installed() and installed()[p].availability()]


def test_short_profile_every_kernel() -> None:
    kernels = fuzz_run.kernels_of(_available(), None)
    assert kernels, "no native or numba kernels installed"
    tallies = fuzz_run.fuzz(kernels, CALLS, jobs=2, cfg=fuzz_run.Settings(seed=1, batch=CALLS))
    bad = [f"{t.name}: {f}" for t in tallies for f in t.failures]
    assert not bad, "\n".join(bad)
    assert all(t.calls == CALLS for t in tallies)
    assert sum(t.ok for t in tallies) > 0 and sum(sum(t.raised.values()) for t in tallies) > 0


def test_harness_reports_wrong_crash_and_hang() -> None:
    kinds = [("toy", "relu", k) for k in ("right", "off_by_1pct", "aborts", "hangs")]
    tallies = {t.kernel: t for t in fuzz_run.fuzz(kinds, 30, jobs=2, cfg=FAKES)}
    assert tallies["right"].wrong == tallies["right"].crash == tallies["right"].hang == 0
    assert tallies["off_by_1pct"].wrong > 0
    assert "differ beyond" in tallies["off_by_1pct"].failures[0]["detail"]
    aborts, hangs = tallies["aborts"], tallies["hangs"]
    assert aborts.crash > 0 and "Aborted" in aborts.failures[0]["detail"]
    assert aborts.ok > 0, "the worker restarted after each crash and went on"
    assert hangs.hang > 0 and hangs.calls == 30
    f = aborts.failures[0]
    assert f["call"].startswith("relu seed ") and f["seed"] is not None


def test_failures_replay_in_a_fresh_worker() -> None:
    tallies = fuzz_run.fuzz([("toy", "relu", "off_by_1pct")], 30, cfg=FAKES)
    fuzz_run.replay_failures(tallies, FAKES, most=1)
    assert tallies[0].failures[0]["history_dependent"] is False


def test_calls_are_reproducible_and_mutated() -> None:
    for op in sorted(REG.ops):
        a, b = draw_call(REG.op(op), 12345), draw_call(REG.op(op), 12345)
        assert a.describe() == b.describe()
    muts = {m.split(" ")[1] if " " in m else m for s in range(300)
            for m in draw_call(REG.op("embedding_bag"), s).mutations}  # fmt: skip
    assert len(muts) > 5, muts


def test_judge_in_process() -> None:
    from fuzz_fakes import providers

    right = next(k for k in providers()[0].kernels if k.name == "right")
    with using_providers(Provider(name="toy", kernels=(right,))):
        fc = draw_call(REG.op("relu"), 3)
        fc.args = {"input": np.float32([1.0, -2.0, np.nan])}
        fc.mutations = []
        assert judge(fc, "toy")[0] == "ok"
        fc.args = {"input": np.int64([1])}
        assert judge(fc, "toy") == ("raised:TypeError", "")


def test_judge_asks_torch_when_the_kernel_is_off_the_reference() -> None:
    """Off the reference where torch agrees with it: wrong. Off where torch is off as much (a sum
    that cancels far below its terms: the reference sums in float64, torch and the kernel in
    fp32): disputed, counted apart. Off by more than 4x torch: wrong again."""
    from refcore.provider import Kernel

    def fp32_sum(input, weight, offsets, **_):  # torch's order and precision
        return weight[input].cumsum(0, dtype=np.float32)[-1:].reshape(1, -1)

    answers = {"fp32_sum": fp32_sum, "off_by_50": lambda **kw: fp32_sum(**kw) + np.float32(50),
               "off_by_1e5": lambda **kw: fp32_sum(**kw) + np.float32(1e5)}  # fmt: skip
    fc = draw_call(REG.op("embedding_bag"), 3)
    fc.mutations, fc.scale = [], 1.0
    fc.args = {"input": np.int64([0, 1, 2]), "weight": np.float32([[1e10], [1], [-1e10]]),
               "offsets": np.int64([0]), "mode": "sum"}  # fmt: skip
    verdicts = {}
    for name, fn in answers.items():
        kernel = Kernel(op="embedding_bag", name=name, fn=fn, dtypes=frozenset({"float32"}))
        with using_providers(Provider(name="toy", kernels=(kernel,))):
            verdicts[name] = judge(fc, "toy")
            fc.args["weight"] = np.float32([[1.0], [1], [-1.0]])  # well conditioned: torch agrees
            verdicts[name + " well"] = judge(fc, "toy")
            fc.args["weight"] = np.float32([[1e10], [1], [-1e10]])
    assert verdicts["fp32_sum"][0] == "disputed", verdicts
    assert "torch gives 0.0" in verdicts["fp32_sum"][1]
    assert verdicts["fp32_sum well"] == ("ok", "")
    # 50 off a sum of terms of 1e10 (fp32 ulp 1024) that cancels to 1: more than torch, but
    # within what rounding the inputs to fp32 moves the exact answer; 1e5 off is not
    assert verdicts["off_by_50"][0] == "disputed", verdicts
    assert "within what rounding the inputs" in verdicts["off_by_50"][1]
    assert verdicts["off_by_1e5"][0] == "wrong" and "off too, by less" in verdicts["off_by_1e5"][1]
    for name in ("off_by_50 well", "off_by_1e5 well"):  # well conditioned: wrong
        assert verdicts[name][0] == "wrong" and "torch agrees" in verdicts[name][1], verdicts


def test_a_sum_whose_huge_terms_cancel_exactly_is_disputed_not_wrong() -> None:
    """0.5 x 3e38 and 0.5 x -3e38 cancel exactly, and the float64 reference loses the -3e19 term
    beside them, as torch does: 0.0. A kernel that keeps it (the exact sum) is disputed on every
    seed: the input moves of `_input_rounding` must not leave the two huge terms equal."""
    from refcore.provider import Kernel

    def exact(input, other, **_):
        return np.float32([[math.fsum(float(a) * float(b) for a, b in zip(input[0], other[:, 0]))]])

    kernel = Kernel(op="matmul", name="exact", fn=exact, dtypes=frozenset({"float32"}))
    for seed in range(12):
        fc = draw_call(REG.op("matmul"), seed)
        fc.mutations, fc.scale = [], 1.0
        fc.args = {"input": np.float32([[0.5, -0.3, 0.5]]),
                   "other": np.float32([[3e38], [1e20], [-3e38]])}  # fmt: skip
        with using_providers(Provider(name="toy", kernels=(kernel,))):
            verdict = judge(fc, "toy")
        assert verdict[0] == "disputed", (seed, verdict)


@pytest.mark.parametrize("op", sorted(REG.ops))
def test_every_op_draws_bad_calls(op: str) -> None:
    """The generator works for every op's spec (no generator error on any sample case)."""
    for s in range(40):
        draw_call(REG.op(op), s)


def test_offsets_already_at_the_int64_maximum_still_draw_a_last_past_total() -> None:
    """A row of offsets that an earlier mutation ended at 2**63 - 1 moves its last entry to the
    maximum, not past it (top + 1 overflowed int64: a generator error, spmm_reduce seed 27484)."""
    from refcore import fuzz

    class Always:  # picks "last past total" on the offsets row
        def integer(self, lo: int, hi: int) -> int:
            return lo

        def choice(self, options):
            return "last past total" if "last past total" in options else options[0]

    top = np.iinfo(np.int64).max
    args = {"crow": np.array([0, 2, top, 5], dtype=np.int64)}
    what = fuzz._indices(args, "crow", "crow", Always(), lambda: np.random.default_rng(0))
    assert what == "crow last past total"
    assert args["crow"][-1] == top


def test_replay_names_the_kernels_when_given_an_unknown_one() -> None:
    from refcore.__main__ import _fuzz_replay

    prov = next(iter(installed()))
    with pytest.raises(SystemExit, match=f"{prov} has no kernel 'no_such_kernel'; its kernels: "):
        _fuzz_replay(f"{prov}/no_such_kernel@1")
    with pytest.raises(SystemExit, match="expected provider/kernel@seed"):
        _fuzz_replay("no_such_provider/relu@1")
