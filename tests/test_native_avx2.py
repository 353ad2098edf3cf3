"""Native AVX2 row and flat kernels (norm, elementwise, reduction): what the generic suite cannot
reach. Its samples are small, so every call runs on one thread; here each C function runs on
rows of every tail length (1..40 columns: full vectors, partial tails, both), three or more
parallel chunks long, with a guard zone around its output, on one thread and on two: it must
write only inside its output and give the same bits on both thread counts (rows and chunks are
independent). Results against the reference are test_kernels.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
from refcore_native import _build

from refcore import cpu
from refcore.tensors import BFLOAT16, dtype_name

GUARD = 64
DTYPES = [np.dtype(np.float32), BFLOAT16]
CHUNK_BYTES = 65536  # rc_rows_per_chunk's ~64 KB of input (and 16384-element flat chunks)


def _call(name: str, lib, x, w, b, y, rows: int, d: int, nt: int) -> None:
    p = lib.ffi.from_buffer
    fn = getattr(lib.lib, name)
    if name.startswith("rc_layer_norm"):
        fn(p(x), p(w), p(b), p(y), rows, d, 1e-5, nt)
    elif name.startswith("rc_rms_norm"):
        fn(p(x), p(w), p(y), rows, d, 1e-6, nt)
    elif name.startswith(("rc_softmax", "rc_log_softmax")):
        fn(p(x), p(y), rows, d, nt)
    elif name.startswith("rc_add_row"):
        fn(p(x), p(w), p(y), rows, d, 0.5, 0, nt)
    elif name.startswith("rc_add"):
        fn(p(x), p(b.repeat(rows)), p(y), rows * d, 0.5, nt)
    else:  # unary activations: flat
        fn(p(x), p(y), rows * d, nt)


NAMES = [
    f"rc_{op}_{tag}_avx2"
    for op in ("layer_norm", "rms_norm", "softmax", "log_softmax", "gelu", "gelu_tanh", "silu",
               "add", "add_row")
    for tag in ("f32", "bf16")
]  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_avx2_writes_only_inside_its_output_on_any_thread_count(name: str) -> None:
    if not cpu.has("avx2"):
        pytest.skip("this CPU (or REFCORE_CPU_CAPABILITY) does not allow ISA level avx2")
    try:
        lib = _build.library()
    except _build.BuildError as e:
        pytest.skip(f"native library unavailable here: {e}")
    dt = DTYPES[name.split("_")[-2] == "bf16"]
    rng = np.random.default_rng(0)
    for d in range(1, 41):
        rows = 3 * CHUNK_BYTES // (d * dt.itemsize) + 1  # three chunks or more: both threads work
        x = (rng.normal(size=(rows, d)) * 3).astype(dt)
        w, b = rng.normal(size=d).astype(dt), rng.normal(size=d).astype(dt)
        outs = []
        for nt in (1, 2):
            buf = np.empty(rows * d + 2 * GUARD, dt)
            buf.view(np.uint8)[:] = 0xA5
            y = buf[GUARD : GUARD + rows * d]
            _call(name, lib, x, w, b, y, rows, d, nt)
            assert (buf[:GUARD].view(np.uint8) == 0xA5).all(), f"{name} d={d} nt={nt}: before"
            assert (buf[-GUARD:].view(np.uint8) == 0xA5).all(), f"{name} d={d} nt={nt}: after"
            outs.append(y.view(np.uint16 if dt == BFLOAT16 else np.uint32).copy())
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=f"{name} {dtype_name(dt)} d={d}")
