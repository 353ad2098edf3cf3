"""Native embedding kernels: every bad input is rejected in Python before the C call, and the C
side writes only inside its output (results against the reference are test_kernels.py's).

The kernels are called directly (not through `refcore.run`, whose reference check would reject
the input first), with the C entry points replaced by a function that fails the test if reached.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import refcore_native
from refcore_native import _build, _runtime

import refcore
from refcore import cpu
from refcore.registry import EXCEPTIONS, default_registry
from refcore.sampling import error_args
from refcore.tensors import BFLOAT16, dtype_name

REG = default_registry()
OPS = ("embedding", "embedding_bag")
F = np.float32


def _kernels(op: str, args: dict) -> list:
    """The op's kernels that declare the table's dtype (all of them for another dtype)."""
    ks = [k for k in refcore_native.make_provider().kernels if k.op == op]
    name = dtype_name(args["weight"])
    return [k for k in ks if name in k.dtypes] or ks


@pytest.fixture
def no_c(monkeypatch):
    def reached(name: str):
        raise AssertionError(f"C function {name} reached with bad input")

    monkeypatch.setattr(_runtime, "c_function", reached)


SPEC_CASES = [(op, i) for op in OPS for i in range(len(REG.op(op).errors))]


@pytest.mark.parametrize(("op", "index"), SPEC_CASES, ids=[f"{o}-{i}" for o, i in SPEC_CASES])
def test_spec_error_cases_rejected_before_c(no_c, op: str, index: int) -> None:
    """The spec's bad inputs (checked by the reference in `refcore.run`) also stop a direct call."""
    case = REG.op(op).errors[index]
    args = error_args(case)
    for k in _kernels(op, args):
        with pytest.raises(EXCEPTIONS[case.raises], match=re.escape(case.match)):
            k.fn(**args)


I64 = np.int64
W = np.zeros((4, 3), F)
BAD_CALLS = [
    # classes the spec's error list does not cover (a direct call sees raw arrays)
    (
        "embedding",
        dict(input=np.array([0, -3], I64), weight=W),
        IndexError,
        "'input' expected indices in [0, 4)",
    ),
    (
        "embedding",
        dict(input=np.array([0, 1], np.int16), weight=W),
        TypeError,
        "'input' expected dtype int32 or int64",
    ),
    (
        "embedding",
        dict(input=np.zeros((2, 4), I64)[:, ::2], weight=W),
        ValueError,
        "'input' expected a C-contiguous",
    ),
    (
        "embedding",
        dict(input=np.zeros(2, I64), weight=W.T.copy().T),
        ValueError,
        "'weight' expected a C-contiguous",
    ),
    (
        "embedding_bag",
        dict(input=np.array([0, 4], np.int32), weight=W, offsets=np.array([0], I64)),
        IndexError,
        "got range [0, 4]",
    ),
    (
        "embedding_bag",
        dict(input=np.array([-1, 2], I64), weight=W, offsets=np.array([0], I64)),
        IndexError,
        "got range [-1, 2]",
    ),
    (
        "embedding_bag",
        dict(input=np.zeros(3, I64), weight=W, offsets=np.array([0, 2, 1], I64)),
        ValueError,
        "non-decreasing values; got 2 then 1 at 1",
    ),
    (
        "embedding_bag",
        dict(input=np.zeros(3, I64), weight=W, offsets=np.array([0.0, 1.0])),
        TypeError,
        "'offsets' expected an int32 or int64",
    ),
    (
        "embedding_bag",
        dict(
            input=np.zeros(3, I64),
            weight=W,
            offsets=np.array([0, 3, 5], np.int32),
            include_last_offset=True,
        ),
        ValueError,
        "values <= len(input) = 3",
    ),
    (
        "embedding_bag",
        dict(
            input=np.zeros(3, I64),
            weight=W,
            offsets=np.array([0], I64),
            mode="sum",
            per_sample_weights=np.zeros(3, BFLOAT16),
        ),
        TypeError,
        "dtype float32",
    ),
    (
        "embedding_bag",
        dict(
            input=np.zeros((2, 2), I64),
            weight=W,
            mode="sum",
            per_sample_weights=np.zeros((2, 4), F)[:, ::2],
        ),
        ValueError,
        "C-contiguous",
    ),
    (
        "embedding_bag",
        dict(input=np.zeros(3, I64), weight=W.astype(np.float64), offsets=np.array([0], I64)),
        TypeError,
        "'weight' expected dtype",
    ),
]


@pytest.mark.parametrize(
    ("op", "args", "exc", "match"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_input_rejected_before_c(no_c, op, args, exc, match) -> None:
    for k in _kernels(op, args):
        with pytest.raises(exc, match=f"^{op} \\(native\\): argument .*" + re.escape(match)):
            k.fn(**args)


GUARD = 64


# every (level, dtype) the native variants have (avx512_bf16 is bf16 only)
VARIANTS = [
    pytest.param(lvl, dt, id=f"{lvl}-{dtype_name(dt)}")
    for lvl, names in _runtime.VARIANTS
    for dt in (np.dtype(F), BFLOAT16)
    if dtype_name(dt) in names
]


@pytest.mark.parametrize(("level", "dt"), VARIANTS)
@pytest.mark.parametrize("idx64", [0, 1])
def test_c_writes_only_inside_its_output(level: str, dt: np.dtype, idx64: int) -> None:
    if not cpu.has(level):
        pytest.skip(f"this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level {level}")
    try:
        lib = _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")
    rng = np.random.default_rng(0)
    v, d, bags = 11, 150, 5  # 150 columns: one full 128-wide block and a masked tail
    w = rng.normal(size=(v, d)).astype(dt)
    idx = rng.integers(0, v, 13).astype(np.int64 if idx64 else np.int32)
    psw = rng.normal(size=13).astype(dt)
    bounds = np.array([0, 3, 3, 9, 12, 13], np.int64)  # an empty bag included
    tag = "f32" if dt == np.float32 else "bf16"
    p = lib.ffi.from_buffer
    calls = [
        (f"rc_embedding_bag_{tag}_{level}", bags * d,
         lambda y, mode, s: (p(w), d, p(idx), idx64, p(bounds), bags, s, mode, p(y), 2, 1))
    ]  # fmt: skip
    if level == "portable":
        calls.append(
            ("rc_embedding_rows_portable", idx.size * d,
             lambda y, mode, s: (p(w), d * w.itemsize, p(idx), idx64, idx.size, p(y), 2, 1))
        )  # fmt: skip
    for name, size, args in calls:
        for mode, weights in ((0, p(psw)), (0, lib.ffi.NULL), (1, lib.ffi.NULL), (2, lib.ffi.NULL)):
            buf = np.empty(size + 2 * GUARD, dt)
            buf.view(np.uint8)[:] = 0xA5
            y = buf[GUARD : GUARD + size]
            getattr(lib.lib, name)(*args(y, mode, weights))
            assert (buf[:GUARD].view(np.uint8) == 0xA5).all(), name
            assert (buf[-GUARD:].view(np.uint8) == 0xA5).all(), name
            assert not (y.view(np.uint8) == 0xA5).all(), f"{name} wrote nothing"


@pytest.mark.parametrize("op", OPS)
def test_one_row_table_with_a_long_stride(op: str) -> None:
    """NumPy calls a (1, D) array C-contiguous whatever its row stride: rows are D elements."""
    w = np.arange(8, dtype=F).reshape(2, 4)[::2, :3]
    w = np.lib.stride_tricks.as_strided(w, (1, 3), (64, 4))  # a row stride far past the data
    assert w.flags.c_contiguous
    idx = np.zeros(3, np.int64)
    args = (
        dict(input=idx, weight=w)
        if op == "embedding"
        else dict(input=idx, weight=w, offsets=np.array([0, 1], np.int64), mode="sum")
    )
    want = refcore.run(op, provider="reference", **args)
    for k in _kernels(op, args):
        np.testing.assert_array_equal(k.fn(**args), want, err_msg=k.name)


@pytest.mark.parametrize("dt", [np.dtype(F), BFLOAT16], ids=["float32", "bfloat16"])
def test_max_propagates_nan_wherever_it_is(dt: np.dtype) -> None:
    """As the reference (np.max): a NaN in any row of a bag makes that column NaN. (No spec
    sample has it: torch 2.13's max depends on the order of the rows there.)"""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 40)).astype(dt)
    w[1, :20] = np.nan  # first in one bag, last or middle in others
    idx = np.array([1, 0, 2, 3, 4, 1, 5, 1, 0], np.int64)
    args = dict(input=idx, weight=w, offsets=np.array([0, 3, 6], np.int64), mode="max")
    want = refcore.run("embedding_bag", provider="reference", **args)
    assert np.isnan(want[:, :20].astype(F)).all()
    for k in _kernels("embedding_bag", args):
        got = k.fn(**args)
        np.testing.assert_array_equal(got.astype(F), want.astype(F), err_msg=k.name)
