"""Native scaled_dot_product_attention: what the generic suites cannot reach.

The kernel suite (tests/test_kernels.py) checks every variant against the reference on the
spec's samples, serially. Here: the AMX variant in a fresh process (no torch, so no oneDNN has
asked for tile permission: only refcore.cpu's request makes it legal), C writes confined to the
output at every level, both thread splits (one task per head / per query block), and the
decode path's key splits (one query row, partials merged).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import refcore_native
from refcore_native import _build, _runtime

from refcore import cpu
from refcore.registry import default_registry, resolve
from refcore.tensors import BFLOAT16, round_to
from refcore.testing import assert_close

OP = "scaled_dot_product_attention"
LEVELS = [("portable", "f32"), ("portable", "bf16"), ("avx2", "f32"), ("avx2", "bf16")]
LEVELS += [("avx512", "f32"), ("avx512", "bf16")]
LEVELS += [("avx512_bf16", "bf16"), ("amx", "bf16")]


def _library() -> _build.Library:
    try:
        return _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")


def _kernels() -> list:
    return [k for k in refcore_native.make_provider().kernels if k.op == OP]


def test_amx_kernel_in_a_fresh_process_without_torch() -> None:
    if not cpu.has("amx"):
        pytest.skip("CPU (or REFCORE_CPU_CAPABILITY) does not allow amx")
    _library()
    code = """
        import sys, numpy as np, refcore
        import contextlib, refcore_native
        from refcore.provider import using_providers
        # only native: discovering every provider would load onednn's, which imports torch
        scope = contextlib.ExitStack()  # kept: a dropped scope would end at once
        scope.enter_context(using_providers(refcore_native.make_provider()))
        from refcore.ops.attention import scaled_dot_product_attention as ref
        from refcore.tensors import round_to
        assert "torch" not in sys.modules
        rng = np.random.default_rng(0)
        q, k, v = (round_to(rng.normal(size=(2, 3, 70, 64)), "bfloat16") for _ in range(3))
        got = refcore.run("scaled_dot_product_attention", q, k, v, is_causal=True,
                          provider="native")
        want = ref(q, k, v, is_causal=True)
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert (err <= 1e-3 + 1.6e-2 * np.abs(want.astype(np.float64))).all(), err.max()
        assert "torch" not in sys.modules
        print(refcore.explain("scaled_dot_product_attention", q, k, v, is_causal=True))
    """
    env = {k: v for k, v in os.environ.items() if k != cpu.ENV_CAP}
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "scaled_dot_product_attention_amx" in res.stdout


@pytest.mark.parametrize("L", [19, 1], ids=["flash", "decode"])
@pytest.mark.parametrize(("level", "tag"), LEVELS, ids=[f"{a}-{b}" for a, b in LEVELS])
def test_c_writes_only_inside_its_output(level: str, tag: str, L: int) -> None:
    if not cpu.has(level):
        pytest.skip(f"CPU (or REFCORE_CPU_CAPABILITY) does not allow {level}")
    lib = _library()
    dt = np.dtype(np.float32) if tag == "f32" else BFLOAT16
    rng = np.random.default_rng(0)
    nb, S, E, Ev, guard = 2, 70, 37, 67, 64  # sizes that fill no tile, block or vector
    q, k = rng.normal(size=(nb, L, E)).astype(dt), rng.normal(size=(nb, S, E)).astype(dt)
    v = rng.normal(size=(nb, S, Ev)).astype(dt)
    mask = rng.normal(size=(L, S)).astype(dt)
    offs = np.array([[0, L * E], [0, S * E], [0, S * Ev], [0, 0], [0, L * Ev]], np.int64)
    st = np.array([E, 1, E, 1, Ev, 1, S, 1, Ev, 1], np.int64)
    buf = np.empty(nb * L * Ev + 2 * guard, dt)
    buf.view(np.uint8)[:] = 0xA5
    before = buf.copy()
    y = buf[guard:-guard]
    p = lib.ffi.from_buffer
    fn = getattr(lib.lib, f"rc_{OP}_{tag}_{level}")
    rc = fn(p(q), p(k), p(v), p(mask), p(y), p(offs), p(st), nb, L, S, E, Ev, 2, 0, 0.3, 1)
    assert rc == 0
    assert (buf[:guard].view(np.uint8) == before[:guard].view(np.uint8)).all()
    assert (buf[-guard:].view(np.uint8) == before[-guard:].view(np.uint8)).all()
    want = resolve(default_registry().op(OP).reference)(q, k, v, mask, scale=0.3)
    assert_close(y.reshape(nb, L, Ev), want, default_registry().op(OP).tolerance_for(
        "float32" if tag == "f32" else "bfloat16"), f"{level} {tag}")  # fmt: skip


@pytest.mark.parametrize("heads", [1, 3, 40])
def test_thread_splits_match_the_reference(monkeypatch, heads: int) -> None:
    """1 and 3 heads: heads packed once, tasks per query block; 40: a task per head."""
    _library()
    monkeypatch.setattr(_runtime, "PARALLEL_MIN_BYTES", 0)
    spec = default_registry().op(OP)
    rng = np.random.default_rng(heads)
    for kern in _kernels():
        for dname in sorted(kern.dtypes):
            # (B, L, H, E) memory read as (B, H, L, E): the transposed heads of a model
            q, k, v = (
                round_to(rng.normal(size=(1, 150, heads, 64)), dname).transpose(0, 2, 1, 3)
                for _ in range(3)
            )
            for causal in (False, True):
                got = kern.fn(q, k, v, is_causal=causal)
                want = resolve(spec.reference)(q, k, v, is_causal=causal)
                assert_close(got, want, spec.tolerance_for(dname), f"{kern.name} {dname}")


@pytest.mark.parametrize("heads", [1, 3])
def test_decode_key_splits_match_the_reference(monkeypatch, heads: int) -> None:
    """One or three query rows, fewer than 2 per thread: each head's keys split over the threads
    (the merge of partials), also with whole splits masked off (-inf) or causal."""
    _library()
    monkeypatch.setattr(_runtime, "PARALLEL_MIN_BYTES", 0)
    spec = default_registry().op(OP)
    rng = np.random.default_rng(heads)
    S = 1100
    for kern in _kernels():
        for dname in sorted(kern.dtypes):
            for L in (1, 3):
                q, k, v = (round_to(rng.normal(size=(1, heads, n, 64)), dname) for n in (L, S, S))
                mask = round_to(rng.normal(size=(1, heads, L, S)), dname)
                mask[..., : S // 2] = -np.inf
                for m, causal in ((None, False), (None, True), (mask, False)):
                    got = kern.fn(q, k, v, m, is_causal=causal)
                    want = resolve(spec.reference)(q, k, v, m, is_causal=causal)
                    assert_close(got, want, spec.tolerance_for(dname), f"{kern.name} {dname}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_heads_split_from_rows_give_an_output_in_row_order(dtype: str) -> None:
    """q/k/v of shape (B, H, L, E) viewed from (B, L, H, E) memory, as transformers splits a
    projection into heads: the output is (B, L, H, Ev) memory (as torch's flash attention), so
    transpose(1, 2) of it is contiguous, and its values match the reference."""
    torch = pytest.importorskip("torch")
    import refcore

    tdt = getattr(torch, dtype)
    B, L, H, E = 2, 37, 3, 16
    q, k, v = (torch.randn(B, L, H * E).to(tdt).view(B, L, H, E).transpose(1, 2)
               for _ in range(3))  # fmt: skip
    got = refcore.run(OP, q, k, v, provider="native")  # the best level; CI caps the others
    assert got.shape == (B, H, L, E) and got.transpose(1, 2).is_contiguous()
    want = resolve(default_registry().op(OP).reference)(*(t.float().numpy() for t in (q, k, v)))
    assert_close(
        got.float().numpy(),
        want.astype(np.float32),
        default_registry().op(OP).tolerance_for(dtype),
        f"{cpu.level()} {dtype}",
    )


def test_scores_past_2_31_keep_every_row() -> None:
    """The spec's sample of scores past 2^31 (fp32 ulps past 2^8), drawn 24 times per kernel: a
    flash kernel that shifted the exact products of raw scores by their rounded max overflowed
    the row sums on about a third of such calls (AMX; found by refcore.fuzz at queries ~1e18),
    too rarely for the derandomized suite's few draws of this one case to meet."""
    from refcore.sampling import RandomDraw, draw_case
    from refcore.testing import check_kernel

    _library()
    spec = default_registry().op(OP)
    case = next(i for i, c in enumerate(spec.samples) if "scores past 2^31" in (c.note or ""))
    for kern in _kernels():
        for dname in sorted(kern.dtypes):
            ran = sum(check_kernel(kern, spec, draw_case(spec, case, dname, RandomDraw(s)))
                      for s in range(24))  # fmt: skip
            assert ran == 24, f"{kern.name} {dname} declined {24 - ran} of 24 calls"
