"""What every kernel wrapper uses: argument checks, buffer pointers, thread count, C names.

The C side trusts its preconditions, so each wrapper checks, in Python and before the call, every
array it hands over: a NumPy array of the expected dtype, C-contiguous and aligned, of the expected
shape. The check raises with the op, the argument, what was expected and what was given (dispatch
declines non-contiguous layouts first, so on the `refcore.run` path these checks never fire; they
guard direct calls). Buffers reach C zero-copy as ``ffi.from_buffer`` pointers (measured ~0.5 us
each, against ~4.5 us for ``ndarray.ctypes.data`` or ``__array_interface__``).

Example:
    >>> import numpy as np
    >>> array("relu", "input", np.zeros(3, np.float32), F32).shape
    (3,)
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from refcore import cpu
from refcore.tensors import BFLOAT16, dtype_name
from refcore_native import _build

F32 = np.dtype(np.float32)
BOTH = frozenset({"float32", "bfloat16"})
#: (ISA level, dtypes) of each kernel's variants. The avx512_bf16 level is the AVX-512 code
#: compiled again with -mavx512bf16 (one-instruction bf16 stores), so it has bf16 kernels only.
#: A family has the levels it has C files for (`variants`).
VARIANTS = (
    ("portable", BOTH),
    ("avx2", BOTH),
    ("avx512", BOTH),
    ("avx512_bf16", frozenset({"bfloat16"})),
)
CONTIGUOUS = frozenset({"contiguous"})
#: C name tag per dtype: rc_<op>_<tag>_<level>
TAGS = {F32: "f32", BFLOAT16: "bf16"}
#: below this many bytes touched, one thread: a parallel region's wake-up costs more than it saves
PARALLEL_MIN_BYTES = 1 << 18


def variants(family: str, levels: tuple = VARIANTS) -> tuple[tuple[str, frozenset[str]], ...]:
    """The (level, dtypes) of ``levels`` that ``family`` has a ``csrc/<family>_<level>.c`` for."""
    return tuple((lvl, dts) for lvl, dts in levels if (_build.CSRC / f"{family}_{lvl}.c").exists())


def priority(level: str) -> int:
    """Kernel priority by ISA level: the best level the CPU (and the cap) allows runs first."""
    return 10 * list(cpu.LEVELS).index(level)


def symbols(op: str, level: str, dtypes: frozenset[str]) -> dict[np.dtype, str]:
    """C function names of ``op`` at ``level`` per dtype (``rc_gelu_f32_avx512``)."""
    return {dt: f"rc_{op}_{tag}_{level}" for dt, tag in TAGS.items() if dtype_name(dt) in dtypes}


def threads(nbytes: int) -> int:
    """Threads for a call touching ``nbytes``: torch's setting (one pool with it), 1 when small.

    0 tells C to use OpenMP's default (``OMP_NUM_THREADS``) when torch is not loaded.
    """
    if nbytes < PARALLEL_MIN_BYTES:
        return 1
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 0


def fail(op: str, arg: str, expected: str, got: Any, exc: type[Exception] = ValueError) -> None:
    raise exc(f"{op} (native): argument {arg!r} expected {expected}; got {got}")


def float_dtype(op: str, arg: str, a: Any, names: dict[np.dtype, str]) -> np.dtype:
    """The dtype of the array that fixes the op's dtype, one this variant has (``names``)."""
    if not isinstance(a, np.ndarray):
        fail(op, arg, "a NumPy array", type(a).__name__, TypeError)
    if a.dtype not in names:
        want = " or ".join(dtype_name(d) for d in names)
        fail(op, arg, f"dtype {want}", f"dtype {dtype_name(a)}", TypeError)
    return a.dtype


def array(
    op: str, arg: str, a: Any, dtype: np.dtype, shape: tuple[int, ...] | None = None
) -> np.ndarray:
    """``a`` itself, after checking it is a C-contiguous aligned ``dtype`` array of ``shape``."""
    if not isinstance(a, np.ndarray):
        fail(op, arg, "a NumPy array", type(a).__name__, TypeError)
    if a.dtype != dtype:
        fail(op, arg, f"dtype {dtype_name(dtype)}", f"dtype {dtype_name(a)}", TypeError)
    flags = a.flags  # one flags object: each ``a.flags`` builds a new one
    if not (flags.c_contiguous and flags.aligned):
        fail(op, arg, "a C-contiguous, aligned array", f"strides {a.strides} for shape {a.shape}")
    if shape is not None and a.shape != shape:
        fail(op, arg, f"shape {shape}", f"shape {a.shape}")
    return a


def operand(op: str, arg: str, a: Any, names: dict[np.dtype, str]) -> np.ndarray:
    """`float_dtype` and `array` in one call, for the operand that fixes the op's dtype.

    A wrapper's checks are a good part of its cost on small inputs (~0.1-0.2 us per Python
    call here), so the first operand is checked once, not by both functions.
    """
    if not isinstance(a, np.ndarray):
        fail(op, arg, "a NumPy array", type(a).__name__, TypeError)
    if a.dtype not in names:
        want = " or ".join(dtype_name(d) for d in names)
        fail(op, arg, f"dtype {want}", f"dtype {dtype_name(a)}", TypeError)
    flags = a.flags
    if not (flags.c_contiguous and flags.aligned):
        fail(op, arg, "a C-contiguous, aligned array", f"strides {a.strides} for shape {a.shape}")
    return a


class Call(NamedTuple):
    """The loaded library's C function ``name``, a pointer maker, and NULL (see `c_function`)."""

    fn: Any
    ptr: Callable[[np.ndarray], Any]
    null: Any

    def opt(self, a: np.ndarray | None) -> Any:
        """A pointer to ``a``, or NULL when the optional argument is absent."""
        return self.null if a is None else self.ptr(a)


@functools.cache
def c_function(name: str) -> Call:
    """`Call` for C function ``name``; loads (building if needed) the library on first use.

    Cached per name: a kernel call pays one dict lookup, not the library attribute lookups.
    """
    lib = _build.library()
    return Call(getattr(lib.lib, name), lib.ffi.from_buffer, lib.ffi.NULL)


#: ISA levels whose bf16 dot products (vdpbf16ps, AMX tiles) read subnormal inputs as 0
FLUSHES_BF16 = frozenset({"avx512_bf16", "amx"})


def bf16_dots_exact(x: np.ndarray, w: np.ndarray, k: int, held: dict | None = None) -> bool:
    """Whether bf16 dot products of length ``k`` between ``x`` and ``w`` that read subnormal
    inputs as 0 (the `FLUSHES_BF16` levels) stay within 2^-24 of the exact products' sum.

    One clean operand is enough (`csrc/linalg.h`: no subnormal, Inf or NaN, max <= 2^102 / k):
    each product it is part of then loses under 2^-24 / k, and it has no subnormal to lose. A
    subnormal weight of ~1e-38 times an input of 3e38 is a product of ~3 that the hardware
    dropped (refcore.fuzz on AMX: linear_gelu 1.40 where the reference gives 3.20), and Inf
    times a flushed subnormal is NaN where the reference has Inf. Calls that fail this run at
    the avx512 level instead (fp32 FMAs on widened bf16: exact products).

    ``held``: a packed weight's cache (`refcore.PackedWeight.held`): its verdict is kept, so a
    clean packed weight costs nothing per call. Otherwise the smaller operand is scanned first
    (the input, for decode), the other only if that one is not clean. Real models' values are
    clean; the scan is one pass over min(M, N) x K values."""
    clean = c_function("rc_bf16_dot_clean_avx2")

    def scan(a: np.ndarray) -> bool:
        return bool(clean.fn(clean.ptr(a), a.size, k, threads(a.nbytes)))

    if held is not None:
        got = held.get("bf16_dot_clean")
        if got is None:
            got = held["bf16_dot_clean"] = scan(w)
        return got or scan(x)
    first, second = (x, w) if x.size <= w.size else (w, x)
    return scan(first) or scan(second)
