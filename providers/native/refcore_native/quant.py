"""Native kernels for the quant family (specs/quant.yaml): woq_linear and woq_int4_linear for
small M (decode).

C: ``csrc/quant_<level>.c``. The int8 weight (N, K) is streamed once and widened to fp32 in
registers (a quarter of an fp32 weight's bytes: decode is bandwidth-bound); per-channel scales
and the bias are applied to the fp32 sums, per-group scales (groups of a multiple of 8 values)
to each widened weight vector. M (the product of the input's leading dims) above
``MAX_M`` is declined: that is the prefill (GEMM) case, which torch's fp32 GEMM on the weight
dequantized once per call does better. woq_int4_linear's 4-bit codes are widened the same way
(an eighth of the fp32 bytes), each group's sum scaled once and its min applied to the group's
sum of x; groups of a multiple of 16 values (8 bytes, one vector step of both nibbles).

AVX-512 (``csrc/quant_avx512.c``, fp32 and bf16 inputs): 16-lane widening, blocks of 4 weight
rows x 4 rows of x, prefetch in the row and at the same place in the next block (decode rows
are 1-5 KB, too short for the hardware prefetcher); the 4-bit codes go through a per-group fp32
table (vpermps: q * scale + min rounded once, as the oracle dequantizes). No avx512_bf16 level:
a vdpbf16ps int4 kernel measured no faster (vdpbf16ps issues once per cycle here, fma twice).

Measured on the Intel Xeon (AMX) machine, torch 2.13, weights cold (>= 520 MB of copies
rotated), one process, interleaved, medians; ratios are torch bf16 ``F.linear`` time / ours:

=====================  ==  ===========  ===========  ===========  ==========  ==========
N x K (337M Llama)     M   threads      int8 / chan  int8 / g64   int4 / g32  torch int4
=====================  ==  ===========  ===========  ===========  ==========  ==========
5632 x 2048 (up)       1   2            2.30x        2.31x        2.75x       2.70x
2048 x 5632 (down)     1   2            1.97x        1.94x        2.38x       2.46x
5632 x 2048            1   1            2.45x        2.44x        2.90x       2.59x
5632 x 2048            4   1            1.89x        1.70x        2.06x       1.52x
5632 x 2048            16  1            0.57x        0.49x        0.55x       0.41x
=====================  ==  ===========  ===========  ===========  ==========  ==========

(fp32 x; bf16 x within a few percent; torch int4: ``_weight_int4pack_mm_for_cpu``, bf16 x.)
M = 1 with 2 threads, int8 streams ~24 GB/s (near DRAM), int4 ~14 GB/s: the 4-bit decoding
(vpmovzxbd, 2 vpermps, a table fma per group) bounds it, at parity with torch's int4 kernel.
At M = 16, torch's oneDNN AMX bf16 GEMM is ~2x faster than these fp32-FMA kernels (still
1.3x faster than torch's int8 and int4 weight-only kernels). Whole model, zoo.llama(hidden=2048,
layers=4) (337M), 2 threads, decode: eager bf16 39.4 ms/token, woq_int8 20.1-20.3 (1.94-1.96x),
woq_int4 19.2 (fp32 x) / 22.7 (bf16 x) (1.73-2.05x); per call, refcore's routing of a quantized
layer costs ~100 us of Python on top of the kernel (SmolLM2-135M decode, 1 thread, cProfile).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt

MAX_M = 16


def _rule(call: Call) -> Verdict:
    x, s = call.arguments["input"], call.arguments["scales"]
    m = math.prod(x.shape[:-1])
    if m > MAX_M:
        return no(f"M = {m} rows (input {x.shape}) > {MAX_M}: this is the small-M (decode) path")
    if s.ndim == 2 and s.shape[1] > 1 and (x.shape[-1] // s.shape[1]) % 8:
        size = x.shape[-1] // s.shape[1]
        return no(f"groups of {size} values along K: the kernel steps 8 values in one group")
    return YES


def _small_m(op: str, name: str, x: np.ndarray, weights: tuple[np.ndarray, ...],
             bias: np.ndarray | None, n: int, g: int) -> np.ndarray:  # fmt: skip
    """The C call both ops make: ``name(x, *weights, bias, y, m, n, k, g, threads)`` for the
    checked arrays, after the bias and M checks; y (*, N) in x's dtype."""
    b = None if bias is None else rt.array(op, "bias", bias, x.dtype, (n,))
    m = math.prod(x.shape[:-1])
    if m > MAX_M:
        rt.fail(op, "input", f"at most {MAX_M} rows (M) for the small-M kernel", f"M = {m}")
    out = buffers.empty((*x.shape[:-1], n), x.dtype)
    if out.size:
        c = rt.c_function(name)
        nt = rt.threads(weights[0].nbytes)
        c.fn(c.ptr(x), *map(c.ptr, weights), c.opt(b), c.ptr(out), m, n, x.shape[-1], g, nt)
    return out


def _woq_linear(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("woq_linear", level, dtypes)

    def woq_linear(input: np.ndarray, weight: np.ndarray, scales: np.ndarray,
                   bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        op = "woq_linear"
        dt = rt.float_dtype(op, "input", input, names)
        x = rt.array(op, "input", input, dt)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        k = x.shape[-1]
        w = rt.array(op, "weight", weight, np.dtype(np.int8))
        if w.ndim != 2 or w.shape[1] != k:
            rt.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])", w.shape)
        n = w.shape[0]
        g = scales.shape[1] if getattr(scales, "ndim", 1) == 2 else 1
        s = rt.array(
            op, "scales", scales, np.dtype(np.float32), (n, g) if scales.ndim == 2 else (n,)
        )
        if k % g or (g > 1 and (k // g) % 8):
            rt.fail(op, "scales", f"groups of a multiple of 8 of in_features {k}", f"{g} groups")
        return _small_m(op, names[dt], x, (w, s), bias, n, g)

    return woq_linear


def _rule4(call: Call) -> Verdict:
    x, s = call.arguments["input"], call.arguments["scales"]
    m = math.prod(x.shape[:-1])
    if m > MAX_M:
        return no(f"M = {m} rows (input {x.shape}) > {MAX_M}: this is the small-M (decode) path")
    if s.shape[1] == 0:
        return no("no groups (in_features 0): nothing to dequantize (the answer is the bias)")
    if (x.shape[-1] // s.shape[1]) % 16:
        size = x.shape[-1] // s.shape[1]
        return no(f"groups of {size} values along K: the kernel steps 16 values (8 bytes) in one")
    return YES


def _woq_int4_linear(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("woq_int4_linear", level, dtypes)

    def woq_int4_linear(
        input: np.ndarray,
        weight: np.ndarray,
        scales: np.ndarray,
        mins: np.ndarray,
        bias: np.ndarray | None = None,
    ) -> np.ndarray:
        op = "woq_int4_linear"
        dt = rt.float_dtype(op, "input", input, names)
        x = rt.array(op, "input", input, dt)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        k = x.shape[-1]
        w = rt.array(op, "weight", weight, np.dtype(np.uint8))
        if w.ndim != 2 or 2 * w.shape[1] != k:
            rt.fail(op, "weight", f"shape (N, {k // 2}) (in_features / 2 bytes)", w.shape)
        n = w.shape[0]
        g = scales.shape[1] if getattr(scales, "ndim", 0) == 2 else 0
        s = rt.array(op, "scales", scales, np.dtype(np.float32), (n, g))
        mn = rt.array(op, "mins", mins, np.dtype(np.float32), (n, g))
        if g == 0 or k % g or (k // g) % 16:
            rt.fail(op, "scales", f"groups of a multiple of 16 of in_features {k}", f"{g} groups")
        return _small_m(op, names[dt], x, (w, s, mn), bias, n, g)

    return woq_int4_linear


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    made = []
    for lvl, dts in rt.variants("quant"):
        if cpu.has(lvl):
            made += [
                Kernel(op="woq_linear", name=f"woq_linear_{lvl}", fn=_woq_linear(lvl, dts),
                       dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
                       rule=_rule),
                Kernel(op="woq_int4_linear", name=f"woq_int4_linear_{lvl}",
                       fn=_woq_int4_linear(lvl, dts), dtypes=dts, layouts=rt.CONTIGUOUS,
                       isa=lvl, priority=rt.priority(lvl), rule=_rule4),
            ]  # fmt: skip
    return tuple(made)
