"""Native fused kernels (add + activation, add + layer_norm): bad input is rejected in Python
before the C call, broadcasts the kernels do not take are declined with a reason, and the C side
writes only inside its output (results against the reference are test_kernels.py's).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import refcore_native
from refcore_native import _build, _runtime

import refcore
from refcore import cpu
from refcore.tensors import BFLOAT16, dtype_name

F = np.float32
OPS = ("add_relu", "add_gelu", "add_silu", "add_layer_norm")


def _kernels(op: str) -> list:
    return [
        k for k in refcore_native.make_provider().kernels if k.op == op and "float32" in k.dtypes
    ]


@pytest.fixture
def no_c(monkeypatch):
    def reached(name: str):
        raise AssertionError(f"C function {name} reached with bad input")

    monkeypatch.setattr(_runtime, "c_function", reached)


X = np.zeros((2, 3), F)
LN = dict(normalized_shape=(3,))
BAD_CALLS = [
    (
        "add_relu",
        dict(input=X, other=X.astype(BFLOAT16)),
        TypeError,
        "'other' expected dtype float32",
    ),
    ("add_relu", dict(input=X.astype(np.float64), other=X), TypeError, "'input' expected dtype"),
    ("add_silu", dict(input=X.T, other=X.T), ValueError, "'input' expected a C-contiguous"),
    (
        "add_silu",
        dict(input=X, other=np.zeros((2, 1), F)),
        ValueError,
        "'other' expected a shape equal",
    ),
    ("add_gelu", dict(input=X, other=np.zeros(4, F)), ValueError, "do not broadcast"),
    (
        "add_gelu",
        dict(input=X, other=X, approximate="exact"),
        ValueError,
        "'approximate' expected one of",
    ),
    (
        "add_layer_norm",
        dict(input=X, other=X, normalized_shape=(2,)),
        ValueError,
        "'normalized_shape' expected the trailing dims",
    ),
    (
        "add_layer_norm",
        dict(input=X, other=X, weight=np.zeros(2, F), **LN),
        ValueError,
        "'weight' expected shape (3,)",
    ),
    (
        "add_layer_norm",
        dict(input=X, other=X, bias=np.zeros(3, BFLOAT16), **LN),
        TypeError,
        "'bias' expected dtype float32",
    ),
    (
        "add_layer_norm",
        dict(input=X, other=X, eps=-1.0, **LN),
        ValueError,
        "'eps' expected a non-negative value",
    ),
    (
        "add_layer_norm",
        dict(input=X, other=np.zeros((2, 1), F), **LN),
        ValueError,
        "'other' expected a shape equal",
    ),
    (
        "add_layer_norm",
        dict(input=np.zeros((2, 2, 3), F), other=np.zeros((2, 3), F), **LN),
        ValueError,
        "repeats every 6 elements",
    ),
]


@pytest.mark.parametrize(
    ("op", "args", "exc", "match"), BAD_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_input_rejected_before_c(no_c, op, args, exc, match) -> None:
    for k in _kernels(op):
        with pytest.raises(exc, match=f"^{op} \\(native\\): argument .*" + re.escape(match)):
            k.fn(**args)


def test_unsupported_broadcast_is_declined_with_reason() -> None:
    x, other = np.ones((2, 2, 3), F), np.ones((2, 3), F)
    why = str(refcore.explain("add_layer_norm", x, other, (3,), provider="native"))
    assert "declined: the broadcast operand repeats every 6 elements" in why
    assert refcore.run("add_layer_norm", x, other, (3,)).shape == (2, 2, 3)  # another provider
    why = str(
        refcore.explain("add_relu", np.ones((2, 3), F), np.ones((2, 1), F), provider="native")
    )
    assert "declined: input (2, 3) and other (2, 1) both broadcast, or along a non-trailing" in why


GUARD = 64


# every (level, dtype) the native variants have (avx512_bf16 is bf16 only)
VARIANTS = [
    pytest.param(lvl, dt, id=f"{lvl}-{dtype_name(dt)}")
    for lvl, names in _runtime.VARIANTS
    for dt in (np.dtype(F), BFLOAT16)
    if dtype_name(dt) in names
]


@pytest.mark.parametrize(("level", "dt"), VARIANTS)
def test_c_writes_only_inside_its_output(level: str, dt: np.dtype) -> None:
    if not cpu.has(level):
        pytest.skip(f"this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level {level}")
    try:
        lib = _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")
    rng = np.random.default_rng(0)
    rows, d = 3, 37  # fills no vector exactly
    a = rng.normal(size=rows * d).astype(dt)
    b = rng.normal(size=rows * d).astype(dt)
    tag = "f32" if dt == np.float32 else "bf16"
    p, null = lib.ffi.from_buffer, lib.ffi.NULL
    calls = []
    for stem in ("add_relu", "add_gelu", "add_gelu_tanh", "add_silu"):
        for a_rs, b_rs in ((d, d), (d, 0), (0, d)):
            calls.append(
                (
                    f"rc_{stem}_{tag}_{level}",
                    lambda y, s=(a_rs, b_rs): (p(a), p(b), p(y), rows, d, *s, 1),
                )
            )
    for wb in ((p(b), p(b)), (null, null)):
        calls.append(
            (f"rc_add_layer_norm_{tag}_{level}",
             lambda y, wb=wb: (p(a), p(b), *wb, p(y), rows, d, d, 0, 1e-5, 1))
        )  # fmt: skip
    for name, args in calls:
        buf = np.empty(rows * d + 2 * GUARD, dt)
        buf.view(np.uint8)[:] = 0xA5
        y = buf[GUARD : GUARD + rows * d]
        getattr(lib.lib, name)(*args(y))
        assert (buf[:GUARD].view(np.uint8) == 0xA5).all(), name
        assert (buf[-GUARD:].view(np.uint8) == 0xA5).all(), name
        sentinel = np.full(dt.itemsize, 0xA5, np.uint8).view(f"u{dt.itemsize}")
        unwritten = y.view(sentinel.dtype) == sentinel[0]
        assert not unwritten.any(), f"{name} left {unwritten.sum()} elements unwritten"
