"""Native kernels for the int8 family (specs/int8.yaml): quantize_per_tensor,
dequantize_per_tensor and qlinear.

C: ``csrc/int8_<level>.c``, AVX2 only. There is no portable tier: plain C loops would not beat
torch's own quantize ops or its oneDNN int8 linear (a portable kernel is a correctness fallback
that routing never picks), and the reference already is the fallback. There is no AVX-512 tier
yet: it could not be run on the AVX2-only machine these kernels were measured on.

Every float step is the reference's (refcore/ops/int8.py): quantize multiplies by
``float32(1 / scale)`` (computed here, as the reference does), rounds half to even and clamps;
qlinear sums ``(x - zp) * w`` exactly in int32 with vpmaddwd (not vpmaddubsw, which saturates
at int16: torch's own int8 path on AVX2 does, see the qlinear doc in specs/int8.yaml), then
``fma(float32(acc), float32(xs * ws[n]), b[n])``. Above M = 16 qlinear packs the weight per call,
16 rows at a time into an int16 panel per thread (the scratch comes from `refcore.buffers`, so a
repeated call reuses mapped memory); up to M = 16 it reads the weight in place (see
csrc/int8_avx2.c).

Measured on an AMD EPYC Zen 3 (AVX2, no VNNI), 2 threads, medians against torch in the same
process: quantize_per_tensor 4.6-6.8x torch's quantized_decomposed op (128 x 768 and
1024 x 1536, fp32 and bf16), dequantize 1.8-3.1x; qlinear 1.5-2.8x oneDNN's int8 linear at
M = 1-8, 1.2-1.5x at M = 16-32, ~parity at M = 64, 0.7-0.9x from M = 128 on (where oneDNN's
AVX2 sums saturate: see the measurements below), and 1.4-2.8x torch's fp32 F.linear at every M.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt

_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
#: qlinear's int32 sums are exact up to this K (|x - zp| <= 255, |w| <= 128)
MAX_K = 65536
#: qlinear reads the weight in place up to this M (csrc/int8_avx2.c's SMALL_M), else packs it
SMALL_M = 16
# Against torch's own int8 path (oneDNN qlinear_pointwise, the weight prepacked), AMD EPYC Zen 3,
# 2 threads, medians interleaved in one process (ours / oneDNN ms; K x N = 384 x 1536,
# 1536 x 384, 768 x 3072): M = 32: 0.56 / 0.74, 0.47 / 0.67, 1.89 / 2.19; M = 64: 0.94 / 1.09,
# 0.73 / 0.72, 2.67 / 2.60; M = 128: 1.37 / 1.25, 1.30 / 1.09, 4.85 / 3.78; M = 1024:
# 8.5 / 6.2, 6.7 / 5.3, 24.0 / 16.9. Without VNNI oneDNN sums u8 x s8 pairs with vpmaddubsw +
# vpmaddwd + vpaddd (3 instructions per 32 products, saturating at int16: wrong on full-range
# codes), ours exactly with vpmaddwd + vpaddd (4 per 32). It is not the op there, so the kernel
# runs at every M: what runs instead of it is the op's exact torch composition (a float64
# matmul), several times slower.
U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)
F32 = rt.F32


def _qparams(op: str, scale: float, zero_point: int, quant_min: int, quant_max: int,
             dtype: str) -> None:  # fmt: skip
    """The affine parameters' checks (as the reference's, in the native error format)."""
    if dtype not in _RANGES:
        rt.fail(op, "dtype", "'uint8' or 'int8'", repr(dtype))
    lo, hi = _RANGES[dtype]
    if not lo <= quant_min <= quant_max <= hi:
        rt.fail(op, "quant_min, quant_max", f"{lo} <= quant_min <= quant_max <= {hi}",
                (quant_min, quant_max))  # fmt: skip
    if not quant_min <= zero_point <= quant_max:
        rt.fail(op, "zero_point", f"in [quant_min, quant_max] = [{quant_min}, {quant_max}]",
                zero_point)  # fmt: skip
    if not (math.isfinite(scale) and np.float32(scale) > 0):
        rt.fail(op, "scale", "a finite float > 0 (as float32)", scale)


def _quantize(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("quantize_per_tensor", level, dtypes)

    def quantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                            quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
        op = "quantize_per_tensor"
        x = rt.operand(op, "input", input, names)
        _qparams(op, scale, zero_point, quant_min, quant_max, dtype)
        inv = np.float32(1.0 / scale)  # the reference's expression: the same float32
        out = buffers.empty(x.shape, dtype)
        if out.size:
            c = rt.c_function(names[x.dtype])
            c.fn(c.ptr(x), c.ptr(out), x.size, float(inv), zero_point, quant_min, quant_max,
                 int(dtype == "int8"), rt.threads(x.nbytes + out.nbytes))  # fmt: skip
        return out

    return quantize_per_tensor


def _dequantize(level: str) -> Callable[..., np.ndarray]:
    name = f"rc_dequantize_per_tensor_f32_{level}"

    def dequantize_per_tensor(input: np.ndarray, scale: float, zero_point: int, quant_min: int,
                              quant_max: int, dtype: str) -> np.ndarray:  # fmt: skip
        op = "dequantize_per_tensor"
        _qparams(op, scale, zero_point, quant_min, quant_max, dtype)
        q = rt.array(op, "input", input, np.dtype(dtype))
        out = buffers.empty(q.shape, F32)
        if out.size:
            c = rt.c_function(name)
            c.fn(c.ptr(q), c.ptr(out), q.size, float(np.float32(scale)), zero_point,
                 int(dtype == "int8"), rt.threads(q.nbytes + out.nbytes))  # fmt: skip
        return out

    return dequantize_per_tensor


def _qlinear(level: str) -> Callable[..., np.ndarray]:
    name, scratch = f"rc_qlinear_f32_{level}", f"rc_qlinear_scratch_f32_{level}"

    def qlinear(input: np.ndarray, input_scale: float, input_zero_point: int,
                weight: np.ndarray, weight_scales: np.ndarray,
                bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        op = "qlinear"
        x = rt.array(op, "input", input, U8)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        _qparams(op, input_scale, input_zero_point, 0, 255, "uint8")
        k = x.shape[-1]
        if k > MAX_K:
            rt.fail(op, "input", f"in_features <= {MAX_K} (int32 sums stay exact)", k)
        w = rt.array(op, "weight", weight, I8)
        if w.ndim != 2 or w.shape[1] != k:
            rt.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])", w.shape)
        n, m = w.shape[0], math.prod(x.shape[:-1])
        ws = rt.array(op, "weight_scales", weight_scales, F32, (n,))
        b = None if bias is None else rt.array(op, "bias", bias, F32, (n,))
        out = buffers.empty((*x.shape[:-1], n), F32)
        if out.size:
            c = rt.c_function(name)
            nt = rt.threads(w.nbytes + m * n * k // 4)  # ~1 M multiply-adds: worth 2 threads
            buf = buffers.empty((rt.c_function(scratch).fn(m, n, k, nt),), U8)
            c.fn(c.ptr(x), c.ptr(w), c.ptr(ws), c.opt(b), c.ptr(out), c.ptr(buf), m, n, k,
                 float(np.float32(input_scale)), input_zero_point, nt)  # fmt: skip
        return out

    return qlinear


def _qlinear_rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    m = math.prod(x.shape[:-1])
    if m > SMALL_M and "avx512_vnni" in cpu.detected():
        return no(
            f"M = {m} rows > {SMALL_M} on a VNNI CPU: the op's torch function runs oneDNN's "
            "vpdpbusd GEMM there (exact, several times this AVX2 kernel's rate)"
        )
    return YES


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    made = []
    f32 = frozenset({"float32"})
    for lvl, dts in rt.variants("int8"):
        if cpu.has(lvl):
            made += [
                Kernel(op="quantize_per_tensor", name=f"quantize_per_tensor_{lvl}",
                       fn=_quantize(lvl, dts), dtypes=dts, layouts=rt.CONTIGUOUS, isa=lvl,
                       priority=rt.priority(lvl)),
                Kernel(op="dequantize_per_tensor", name=f"dequantize_per_tensor_{lvl}",
                       fn=_dequantize(lvl), dtypes=f32, layouts=rt.CONTIGUOUS, isa=lvl,
                       priority=rt.priority(lvl)),
                Kernel(op="qlinear", name=f"qlinear_{lvl}", fn=_qlinear(lvl), dtypes=f32,
                       layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
                       rule=_qlinear_rule),
            ]  # fmt: skip
    return tuple(made)
