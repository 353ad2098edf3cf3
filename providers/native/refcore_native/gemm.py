"""Native GEMM kernels for linear (M > 16), matmul and the fused linear ops (specs/fused.yaml).

C: ``csrc/gemm_<level>.c`` (helpers in ``csrc/rc_gemm.h``, ``csrc/rc_gemm_vnni.h``), all
computing y = act(x @ w.T + b) + residual with fp32 accumulation and one rounding:

- amx, bf16: AMX tiles (TDPBF16PS) on 32 x 32 output blocks, K whole up to 384 or in chunks of
  256 beyond, x read in place as A tiles (packed only for a partial last block or K not a
  multiple of 32), the epilogue of each block interleaved with the next block's tile
  instructions; the weight in the ``amx_bf16_vnni2`` layout (specs/layouts.yaml).
- avx512_bf16 / avx512, bf16: a 12 x 32 register block over the same layout (vdpbf16ps, or each
  bf16 pair widened to two FMAs), for CPUs without AMX.
- avx512, fp32: a 12 x 32 FMA register block over the ``avx512_f32_panel32`` layout.
- avx2 (no AVX-512, e.g. AMD Zen 3), fp32 and bf16: a 6 x 16 FMA block over fp32 panels (the
  ``avx512_f32_panel32`` layout read as two 16-column halves); bf16 weights (plain or
  ``amx_bf16_vnni2``) widened into an fp32 panel per call and x widened once: exact, so bf16
  is rounded once, at the end.
- portable: plain loops, plain weights only.

**Weights.** A plain (N, K) weight is packed per call, panel by panel inside the kernel (AVX-512
16 x 16 transposes, ~140 cycles per 1 KB tile). On AMX a panel is packed once per call into a
buffer the threads share, and with M < N the roles swap (y.T = W @ x.T: the weight's rows are
read in place as A tiles and only x is transposed): at M = 128, N = K = 768, one thread, plain
97 us against 92 us prepacked (166 us before the swap). The other levels transpose the panel
into a per-thread buffer (2-7% of an fp32 call). A
`refcore.PackedWeight` in the kernel's layout is read as is: ``refcore.pack`` or the prepack
pass (refcore/passes/prepack.py) packs it once. matmul's ``other`` (K, N) is always packed per
call (it is an activation as often as a weight).

**Declined classes**: bf16 GEMMs above ``BF16_MAX_OUTPUTS`` outputs at the AMX level (measured
on an Intel AMX Xeon: torch's oneDNN is as fast there); the functions still run them when
called directly (tests/test_gemm.py does). Every fp32 GEMM is accepted at every level and
measured against torch's sgemm where routing meets it (refcore/choice.py): MKL wins on the Xeon
at large M and loses on AMD Zen 4, and on Zen 3 it depends on the shape, so no size bound holds
on every CPU (see the comment above BF16_MAX_OUTPUTS).

**Overflow.** A sum that comes out inf or NaN in fp32 (products overflowing to +inf and -inf
meet in some partial sum: NaN, where the exact sum overflows to one infinity) is recomputed in
float64 from its operands at every level (csrc/rc_gemm_fix.h; the AMX tiles' blocks too, since
refcore.fuzz found NaN there, and relu 0 for a sum the reference has at 3e37).

**Subnormals.** vdpbf16ps and AMX tiles read bf16 subnormals as 0; calls where that could
matter run at the avx512 level (`refcore_native._runtime.bf16_dots_exact`).

`linear` with a plain weight and M <= 16 is left to the small-M kernel (``linalg.py``); a packed
weight runs here at any M. Decode with packed weights (what ``optimize`` gives): below 5 rows
the AMX level runs the vdpbf16ps driver instead of tiles (a tile product would use 1 of 16
rows), and the fp32 kernel walks each panel's K in 2-4 parts with software prefetch: both
stream the weight at memory speed (see gemm_amx.c, gemm_avx512.c). linear_add reads a full
(M, N) residual (a broadcast one is declined); matmul declines 1-D operands and batch dims that
broadcast only partly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.packed import PackedWeight
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt
from refcore_native.linalg import MAX_M

BF16 = ("bfloat16", "amx_bf16_vnni2")
F32 = ("float32", "avx512_f32_panel32")
#: ISA level -> (dtype, layout it reads) of that level's GEMM kernels (C: rc_gemm_<tag>_<level>)
LEVELS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "amx": (BF16,),
    "avx512_bf16": (BF16,),
    "avx512": (BF16, F32),
    "avx2": (BF16, F32),
    "portable": (("bfloat16", None), ("float32", None)),  # plain weights only
}
#: act codes of csrc/rc_gemm.h
ACT = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


def _gelu(approximate: str = "none", **_: object) -> int:
    return ACT["gelu_tanh" if approximate == "tanh" else "gelu"]


#: op -> activation code from its attributes
OPS: dict[str, Callable[..., int]] = {
    "linear": lambda **_: ACT["none"],
    "linear_relu": lambda **_: ACT["relu"],
    "linear_gelu": _gelu,
    "linear_silu": lambda **_: ACT["silu"],
    "linear_add": lambda **_: ACT["none"],
}


def _rows(x: np.ndarray) -> int:
    return math.prod(x.shape[:-1])


# fp32: no static size bound at any level; measured choice (refcore/choice.py) decides per shape
# class on the CPU at hand. Bounds once here were each right on one CPU only. One (every fp32
# GEMM above 2^21 multiply-adds to torch), measured on an Intel AMX Xeon, was wrong on AMD: on
# Zen 4 (f25 m17, `python -m refcore bench ops`, 2 threads, medians of 5 interleaved rounds
# through refcore.run) this kernel ran 1.11-1.31x torch's MKL sgemm at M = 128 and 1024 (K, N
# 384 / 768 / 1536 / 3072; linear_gelu 1.39-1.40x). On the Xeon: 2 threads, wall clock, medians
# of interleaved rounds: the kernel function measured 0.87-1.01x MKL at M 512..4096 (N and K 768
# / 3072, plain or prepacked) and 1.02-1.19x at M 64..256, but through refcore.run (~90 us of
# bind/select/wrap around a cache-cold kernel) M = 128 measured 0.80-1.00x. The other (avx2: K >
# 1024 or M > 256 to torch), measured on an AMD Zen 3 at 1 thread (1024 x 384 x {384, 1536}
# 0.87-0.98x, 1024 x 1536 x 384 0.66-0.80x), sent winners to torch at 2 threads: Zen 3, 2
# threads, unpacked weight through refcore.run, medians of 7 interleaved rounds (2026-12-07):
# 1024 x 384 x 1536 1.08x, 1024 x 768 x 3072 1.42x, 1024 x 3072 x 768 1.04x, 128 x 768 x 3072
# 1.56x, 128 x 3072 x 768 1.10x, against 1024 x 384 x 384 0.81x and 1024 x 1536 x 384 0.86x
# (which measured choice leaves to torch). The kernel streams its K x 32 panel from L2 with no
# K blocking.


#: bf16 GEMMs with more outputs (M x N) than this are left to torch by the AMX kernel (the only
#: level it was measured for; below AMX measured choice decides: on AMD Zen 4 (f25 m17, 2
#: threads, kernel function against F.linear, medians of 15 interleaved rounds, prepacked) the
#: vdpbf16ps kernel ran 1.07-1.14x oneDNN at 1024 x 384 x 1536 / 1024 x 1536 x 384 and 1.11x at
#: 2048 x 768 x 3072, where this bound sent all three to torch). 1 thread, prepacked, with
#: bias, process_time medians of interleaved rounds (torch addmm in the same process), after x
#: was read in place and the epilogue overlapped with the tiles: at 1.5 x 2^20 outputs this kernel
#: measured 1.17-1.38x (1024x1536x384, 2048x768x768, 512x3072x768, 512x768x3072, 2048x384x1536;
#: linear_gelu 1024x1536x384 1.54x), and 1.1-1.6x at M = 512-1024 below it; beyond, 0.6-0.7x
#: (2048x1536x384, 2048x3072x768), 0.84-1.1x (1024x3072x768), 0.92-1.07x (4096x768x768).
#: Two threads could not be measured on the shared machine (load ~9 on 2 cores: every call
#: waited ~35 ms for a core); earlier 2-thread runs of the previous kernel measured parity at
#: best beyond 2^20 outputs.
BF16_MAX_OUTPUTS = 3 << 19


#: bf16 at avx2 is never declined: torch has no bf16 dot product there (5-6x slower than this
#: kernel on an AMD Zen 3).


def _slower_than_torch(dtype: str, m: int, n: int, k: int, level: str) -> str | None:
    """Why torch is measured faster for this GEMM class at ISA ``level``, or None (see
    BF16_MAX_OUTPUTS); a class it lets through is still measured against torch by routing."""
    if dtype == "bfloat16" and level == "amx" and m * n > BF16_MAX_OUTPUTS:
        return (f"bf16 GEMM M*N = {m * n} outputs > {BF16_MAX_OUTPUTS}: torch's oneDNN "
                "measured as fast or faster (ours 0.6-1.1x at 1 thread, M 1024..4096)")  # fmt: skip
    return None


def _rule(level: str) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        a = call.arguments
        m = _rows(a["input"])
        if call.op.name == "linear" and m <= MAX_M and not isinstance(a["weight"], PackedWeight):
            return no(f"M = {m} rows <= {MAX_M}: the small-M (decode) kernel's case")
        k = a["input"].shape[-1]
        slower = _slower_than_torch(call.dtype, m, a["weight"].shape[0], k, level)
        if slower:
            return no(slower)
        other = a.get("other")
        if other is not None:
            out = (*a["input"].shape[:-1], a["weight"].shape[0])
            if tuple(other.shape) != out:
                return no(f"other has shape {other.shape}; reads a full residual of shape {out}")
        return YES

    return rule


def _weight(op: str, w: object, dt: np.dtype, k: int, layout: str | None) -> tuple:
    """(array handed to C, packed flag, N) after checking the weight against K and the layout."""
    if isinstance(w, PackedWeight):
        if layout is None:
            rt.fail(op, "weight", "a plain (N, K) weight (this level reads no packed layout)", w)
        if w.layout != layout or w.dtype != dt or len(w.shape) != 2 or w.shape[1] != k:
            rt.fail(op, "weight", f"a ({'N'}, {k}) {rt.dtype_name(dt)} weight in layout "
                    f"{layout}", repr(w))  # fmt: skip
        want = _packed_shape(layout)(w.shape[0], k)
        rt.array(op, "weight", w.data, dt, want)
        return w.data, 1, w.shape[0]
    a = rt.array(op, "weight", w, dt)
    if a.ndim != 2 or a.shape[1] != k:
        rt.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])", a.shape)
    return a, 0, a.shape[0]


def _packed_shape(layout: str) -> Callable[[int, int], tuple[int, ...]]:
    if layout == "amx_bf16_vnni2":
        return lambda n, k: (-(-n // 16), -(-k // 32), 16, 16, 2)
    return lambda n, k: (-(-n // 32), k, 32)


def _np(dtype: str) -> np.dtype:
    return rt.BFLOAT16 if dtype == "bfloat16" else rt.F32


def _kernel_fn(op: str, level: str) -> Callable[..., np.ndarray]:
    variants = {_np(d): (f"rc_gemm_{rt.TAGS[_np(d)]}_{level}", lay) for d, lay in LEVELS[level]}
    act_of = OPS[op]

    def gemm(input, weight, bias=None, other=None, **attrs) -> np.ndarray:
        dt = rt.float_dtype(op, "input", input, variants)
        name, layout = variants[dt]
        x = rt.array(op, "input", input, dt)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        k = x.shape[-1]
        w, packed, n = _weight(op, weight, dt, k, layout)
        b = None if bias is None else rt.array(op, "bias", bias, dt, (n,))
        res = None if other is None else rt.array(op, "other", other, dt, (*x.shape[:-1], n))
        m = _rows(x)
        out = buffers.empty((*x.shape[:-1], n), dt)
        if out.size:
            if dt == rt.BFLOAT16 and level in rt.FLUSHES_BF16 and not rt.bf16_dots_exact(
                    x, w, k, weight.held if packed else None):  # fmt: skip
                name = "rc_gemm_bf16_avx512"  # subnormals that matter: exact products
            c = rt.c_function(name)
            nt = rt.threads(2 * m * n * k)
            rc = c.fn(c.ptr(x), c.ptr(w), c.opt(b), c.opt(res), c.ptr(out), m, n, k, packed,
                      act_of(**attrs), nt)  # fmt: skip
            if rc != 0:
                raise MemoryError(f"{op} (native): no memory for the GEMM scratch buffers")
        return out

    gemm.__name__ = op
    return gemm


def _matmul_rule(level: str) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        x, w = call.arguments["input"], call.arguments["other"]
        if x.ndim < 2 or w.ndim < 2:
            return no("a 1-D operand (a matrix-vector or dot product) is not a GEMM")
        full = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
        for name, a in (("input", x), ("other", w)):
            if a.shape[:-2] != full and math.prod(a.shape[:-2]) != 1:
                return no(f"{name}'s batch dims {a.shape[:-2]} broadcast partly to {full}")
        m = math.prod(full) * x.shape[-2]  # the same microkernels: the batch counts as rows
        slower = _slower_than_torch(call.dtype, m, w.shape[-1], x.shape[-1], level)
        return no(slower) if slower else YES

    return rule


def _matmul_fn(level: str) -> Callable[..., np.ndarray]:
    names = {_np(d): f"rc_matmul_{rt.TAGS[_np(d)]}_{level}" for d, _ in LEVELS[level]}

    def matmul(input, other) -> np.ndarray:
        op = "matmul"
        dt = rt.float_dtype(op, "input", input, names)
        name = names[dt]
        x, w = rt.array(op, "input", input, dt), rt.array(op, "other", other, dt)
        if x.ndim < 2 or w.ndim < 2 or x.shape[-1] != w.shape[-2]:
            rt.fail(op, "other", f"a (..., {x.shape[-1]}, N) operand for input {x.shape}", w.shape)
        if not _batches_fit(x, w):
            rt.fail(op, "other", f"batch dims that broadcast whole with {x.shape[:-2]}", w.shape)
        full = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
        (m, k), n = x.shape[-2:], w.shape[-1]
        batch, xb, wb = math.prod(full), math.prod(x.shape[:-2]), math.prod(w.shape[:-2])
        if wb == 1 and xb == batch:  # one weight: the batch folds into M, one GEMM
            m, batch, xb = m * batch, 1, 1
        out = buffers.empty((*full, x.shape[-2], n), dt)
        if out.size:
            if dt == rt.BFLOAT16 and level in rt.FLUSHES_BF16 and not rt.bf16_dots_exact(x, w, k):
                name = "rc_matmul_bf16_avx512"  # subnormals that matter: exact products
            c = rt.c_function(name)
            xs, ws = (m * k if xb > 1 else 0), (k * n if wb > 1 else 0)
            rc = c.fn(c.ptr(x), c.ptr(w), c.ptr(out), batch, xs, ws, m, n, k,
                      rt.threads(2 * batch * m * n * k))  # fmt: skip
            if rc != 0:
                raise MemoryError(f"{op} (native): no memory for the GEMM scratch buffers")
        return out

    return matmul


def _batches_fit(x: np.ndarray, w: np.ndarray) -> bool:
    full = np.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    return all(a.shape[:-2] == full or math.prod(a.shape[:-2]) == 1 for a in (x, w))


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op x ISA level the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    out = []
    for lvl, variants in LEVELS.items():
        if not cpu.has(lvl):
            continue
        dts = frozenset(d for d, _ in variants)
        lays = frozenset({"contiguous", *(lay for _, lay in variants if lay)})
        out.extend(
            Kernel(op=op, name=f"{op}_gemm_{lvl}", fn=_kernel_fn(op, lvl), dtypes=dts,
                   layouts=lays, isa=lvl, priority=rt.priority(lvl), rule=_rule(lvl))
            for op in OPS
        )  # fmt: skip
        out.append(
            Kernel(op="matmul", name=f"matmul_gemm_{lvl}", fn=_matmul_fn(lvl), dtypes=dts,
                   layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
                   rule=_matmul_rule(lvl))
        )  # fmt: skip
    return tuple(out)
