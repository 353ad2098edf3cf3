"""Native kernels for the int8 family (specs/int8.yaml): quantize_per_tensor,
dequantize_per_tensor, qlinear, dynamic_qlinear and qconv2d; and the fused int8 ops of
specs/fused.yaml: qlinear_relu, qlinear_gelu, qconv2d_relu, qconv2d_add_relu, and the
requantizing qlinear_relu_quantize, qlinear_gelu_quantize, qconv2d_relu_quantize.

C: ``csrc/int8_<level>.c`` at three levels (`LEVELS`): avx2; avx512_bf16, the AVX-512 VNNI code
(int8_avx512_bf16.c, see "The VNNI and AMX levels" below); amx, that file compiled again with
AMX (int8_amx.c), qlinear's GEMM on tiles. Each level is complete (every op of the family).
AVX-512 without VNNI (the avx512 cap, Skylake-SP) runs the AVX2 kernels. There is no portable
tier: plain C loops would not beat torch's own quantize ops or its oneDNN int8 linear (a portable
kernel is a correctness fallback that routing never picks), and the reference already is the
fallback.

Every float step is the reference's (refcore/ops/int8.py): quantize multiplies by
``float32(1 / scale)`` (computed here, as the reference does), rounds half to even and clamps;
qlinear sums ``(x - zp) * w`` exactly in int32, then ``float32(acc) * float32(xs * ws[n]) +
b[n]`` in the reference's two roundings (not an FMA: at overflow it gave inf where the reference
gives NaN). Above M = 16 qlinear packs the weight per call, 16 rows at a time into a panel per
thread (the scratch comes from `refcore.buffers`, so a repeated call reuses mapped memory); up to
M = 16 it reads the weight in place (see csrc/int8_avx2.c).

**Two exact GEMM paths, chosen per call from the data** (qlinear above M = 16, qconv2d, and
their fused forms; the same int32 sums either way, so the result never depends on the path):

- uint8, when every weight is in [-64, 64] (the 7-bit weights of x86_static_int8_w7: a pair
  of products is at most 255 * 64 * 2 = 32640 in magnitude, whatever the codes), or every
  activation code is <= 127 (a reduced-range activation, as torch's x86 backend quantizes on
  CPUs without VNNI: at most 127 * 128 * 2 = 32512) and, for a padded qconv2d, the zero point
  too (it is the padding): vpmaddubsw on u8 codes x s8 weights packed in k quads, + vpmaddwd
  with ones + vpaddd, 3 ops per 32 products, exact. The zero point comes off after the loop:
  ``acc - zp * colsum[n]``. Scans decide, each stopping at its first hit: of the weight (N x K
  bytes), then of x (its first 64 KB before the GEMM, the rest inside its parallel region).
- int16, for any codes (and always for dynamic_qlinear, whose codes span 0..255): ``x - zp``
  widened to int16, vpmaddwd + vpaddd twice per 32 products. vpmaddubsw is not exact there:
  255 * -128 * 2 < -32768 saturates (torch's own int8 path on AVX2 does, see the qlinear doc in
  specs/int8.yaml).

dynamic_qlinear (fp32 or bf16 input) quantizes each row in C with the reference's float32 steps
(min / max with 0, scale = max((hi - lo) / 255, FLT_EPSILON), zp = clamp(-rint(lo / scale)),
codes rint(x * float32(1 / scale)) + zp clamped, half to even), so its codes, scales and zero
points are the reference's bit for bit; then qlinear's GEMM with the row's scale, the result
rounded once to bf16 (to nearest even) for a bf16 input; a row holding inf or NaN gives NaN.

qconv2d is an implicit GEMM on qlinear's 6 x 16 tiles: bands of a few output rows, their padded
input in NHWC per thread (uint8 codes padded with the zero point, or int16 x - zp padded with 0),
each tile row reading its window in place (a kernel row is one run of kW x C values when groups
= 1 and dilation is 1 along W), against the OHWI weight packed per call into 16-channel panels. It
reads any input layout: channels_last (NHWC memory) and contiguous NCHW in place, other strides
through one NHWC copy; an OHWI (channels_last) weight in place, any other through one copy (a
512 x 512 x 3 x 3 weight: ~1.1 ms). **Output**: channels_last (NHWC memory, the NCHW-shaped view
of it), as the native fp32 conv2d and torch for channels-last input. Groups and dilation run
(per group panels of min(16, O / groups) columns): depthwise uses 1 of 16 lanes and is slow
(256 channels, 28^2, batch 4: 24 ms, 0.24x torch's fp32 depthwise F.conv2d) but runs, being
11x the op's torch function (a float64 F.conv2d, 266 ms): the exact path that exists.

Measured on an AMD EPYC Zen 3 (AVX2, no VNNI), 2 threads, medians against torch in the same
process (a shared host, another process busy on the cores: ratios, not times): quantize_per_tensor
4.6-6.8x torch's quantized_decomposed op (128 x 768 and 1024 x 1536, fp32 and bf16), dequantize
1.8-3.1x; qlinear 1.5-2.8x oneDNN's int8 linear at M = 1-8, 1.2-1.5x at M = 16-32, ~parity at
M = 64, 0.7-0.9x from M = 128 on with full-range codes (the int16 path; where oneDNN's AVX2 sums
saturate: see the measurements below), and 1.4-5.4x torch's fp32 F.linear at every M.
dynamic_qlinear against torch's fp32 F.linear on MiniLM's (K, N) = (384, 1536), (1536, 384):
M = 1 1.7x / 2.3x (fp32 input), M = 8 3.6x / 2.4x, M = 128 3.7x / 4.3x, M = 1024 1.6x / 1.6x;
bf16 input 5-20% faster than fp32.
qconv2d at ResNet-50 layers, batch 4, channels_last (wall time, ours / torch fp32 F.conv2d /
oneDNN int8 qconv2d_pointwise with a prepacked weight, ms): 64->64 3x3 56^2 7.3 / 10.3 / 7.3,
256->64 1x1 56^2 3.6 / 6.2 / 2.9, 128->128 3x3 28^2 7.0 / 12.6 / 6.7, 512->512 3x3 7^2 7.9 /
17.3 / 7.0, stem 3->64 7x7 s2 224^2 8.2 / 18.4 / 11.7: 1.4-2.2x torch fp32 on each, 0.8-1.4x
oneDNN's int8 (inexact there: int16 saturation without VNNI).

The uint8 path against the int16 path, AMD EPYC Zen 3 (AVX2, no VNNI), 2 threads, 7-bit codes,
medians of 15 interleaved rounds in one process, another process busy on both cores (ratios):
qlinear at BERT shapes, (K, N) in (384, 1536), (1536, 384), (768, 768), (768, 3072),
(3072, 768): M = 128 1.04 / 1.31 / 1.15 / 1.27 / 1.26x (1.2-1.7x oneDNN's int8 linear), M = 1024
1.56 / 1.35 / 1.29 / 1.22 / 1.35x (1.0-1.3x oneDNN, where the int16 path is 0.8-0.9x), 2.2-3.1x
torch's fp32 F.linear. qconv2d on ResNet-50's 23 conv shapes (batch 4, channels_last): 3 x 3
1.4-1.8x, 1 x 1 1.2-2.1x (one noisy outlier), the stem (3 channels, 7 x 7) ~1.0x; the sum
weighted by each shape's count in the network 306 against 434 ms, 1.42x (oneDNN's int8
qconv2d_pointwise 259 ms: 0.85x it, the int16 path 0.60x; fp32 F.conv2d 488 ms).

**The VNNI and AMX levels** sum with vpdpbusd (u8 x s8, 4 products into an int32 lane: at most
4 * 255 * 128 in magnitude, no int16 step), exact for any codes and weights: one path, no scans
(the C calls report the uint8 path, 1, every time). The codes are multiplied raw and the zero
point comes off after the loop (``acc - zp * colsum[n]``, colsum from the packed panel; padding
holds the zero point). GEMM (qlinear and dynamic_qlinear above M = 16, qconv2d): panels of 32
columns in k quads (a zmm per 16 columns x 4 k) packed per call, 12 x 32 tiles (24
accumulators; the 8 x 32 tile measured 177 -> 253 GMAC/s single thread at M = 128, 384 x
1536). Up to M = 16 the weight is read in place: 4 x 4 row dots, each column's weight sum in
the same loop. At the amx level qlinear / dynamic_qlinear from M = 32 run 32 x 32 blocks on AMX
tiles (tdpbusd, exact as vpdpbusd) with B tiles straight from those panels, K in chunks of 1024
codes; qconv2d stays on the VNNI tiles there. The epilogue is the AVX2 file's steps in 16 lanes
(two roundings; gelu is rc_avx512.h's, as the native fp32 gelu kernel at avx512; bf16 rounded
in integer steps, as the reference, since vcvtneps2bf16 flushes fp32 denormals). The VNNI and
AMX qlinear kernels have no M rule: on a VNNI CPU whether they run instead of torch's oneDNN
int8 linear is the measured choice's (`refcore.choice`), not a threshold; the AVX2 kernel keeps
its decline of M > 16 there.

Measured on an Intel Xeon with AMX (AVX-512 VNNI, AMX-INT8), 1 thread, medians of 15 rounds
interleaved in one process (ours, torch, ...), full-range codes, another process busy on both
cores (load 3-5: every 2-thread parallel region, ours and torch's, then took ~8 ms, so 2-thread
ratios could not be measured; these are ratios, not times). torch's int8 path is oneDNN's
qlinear_pointwise on a prepacked weight (`refcore.oracles.onednn_qlinear`), which runs AMX here.
qlinear, ours / oneDNN int8 (and / torch fp32 F.linear), (K, N) = (384, 1536), (1536, 384),
(768, 3072), (3072, 768):
- M = 1 (VNNI, weight in place): 2.6x / 2.8x / 1.5x / 1.6x oneDNN (2.7-4.6x fp32).
- M = 8: 1.0x / 1.3x / 0.8x / 1.4x oneDNN (3.9-5.8x fp32): 4 x 4 row dots re-read each weight
  block per 4 rows; oneDNN's prepacked AMX GEMM at 768 x 3072 is faster.
- M = 128, amx: 0.9x / 1.2x / 0.9x / 1.0x oneDNN (3.8-5.6x fp32); VNNI tiles 0.6-0.7x.
- M = 1024, amx: 0.9x / 1.0x / 1.0x / 1.1x oneDNN (4.4-5.0x fp32); VNNI tiles 0.5-0.6x.
So the issue's targets hold at M = 1 and against fp32 at every shape on the level this CPU runs
(amx: >= 2.7x; the VNNI tiles alone 2.3-3.3x at M >= 128); from M = 8 on the kernels are at parity
with oneDNN's AMX GEMM, not 1.3x ahead (it packs the weight once, ours per call; our AMX blocks
reach ~400-550 GMAC/s a core, ~15% of the tiles' peak). dynamic_qlinear against fp32 F.linear (same
run conditions): M = 1 3.5-4.9x, M = 8 4.2-7.7x, M = 128 3.2-3.6x on VNNI tiles, 6.1-7.6x amx, M =
1024 2.8-2.9x VNNI, 5.7-8.1x amx. qconv2d (VNNI tiles), ResNet-50 layers, batch 4, channels_last,
ours / oneDNN qconv2d_pointwise (AMX) / fp32 F.conv2d: 64->64 3x3 56^2 0.40x / 3.6x, 256->64 1x1
56^2 0.42x / 3.3x, 128->128 3x3 28^2 0.34x / 3.7x, 512->512 3x3 7^2 0.41x / 3.8x, stem 3->64 7x7 s2
0.64x / 2.3x, 1024->256 1x1 14^2 0.32x / 3.8x: oneDNN's AMX convs are 2.5-3x ours; an AMX qconv2d is
the missing piece (measured choice runs torch there meanwhile).

The fused ops are qlinear's and qconv2d's kernels with a post-op code (`POST`, csrc/int8.h)
applied to the fp32 result in registers before its one store: relu, relu(y + other), gelu (erf
or tanh: the vector gelu of the native fp32 GEMM epilogue, within 0.05 of gelu's fp32 tolerance,
and qlinear_gelu's tolerance adds gelu's to qlinear's). They accept and decline exactly as their
unfused kernel, and qconv2d_add_relu also declines an ``other`` that is not a float32 tensor of
the output's shape, channels_last (read as NHWC, the output's own order) or contiguous (NCHW,
gathered per output row): a broadcast residual (O, 1, 1) or other strides go to the reference.
Measured (Zen 3, 2 threads, interleaved medians, three runs; the post-op costs ~nothing against
the unfused kernel alone): qconv2d_relu against qconv2d + torch.relu, ResNet-50 batch 4 56^2
channels_last, 64->64 3x3 1.07-1.17x, 256->64 1x1 1.18-1.21x; qlinear_gelu against qlinear +
F.gelu at 1024 x 384 x 1536, erf 1.21-1.26x, tanh 1.72-1.77x.

The requantizing ops (``*_quantize``) are the same kernels with a post-op whose store writes
quantize_per_tensor's 1-byte codes (uint8 or int8, output in the fp32 op's layout: channels_last
for qconv2d): y = float32(acc) * s + b in two roundings (as every epilogue: the relu forms are
declared bit-exact against the reference), relu or gelu, then the quantize kernel's steps with
``float32(1 / output_scale)``; relu keeps NaN and quantize maps it to quant_min, as the
reference. They accept and decline as their unfused kernel (qlinear's VNNI rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.ops.conv import pads, pair
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
# codes), ours exactly with vpmaddwd + vpaddd (4 per 32; those figures are full-range codes:
# with codes <= 127 or weights in [-64, 64] the kernel takes the exact vpmaddubsw path,
# 1.0-1.7x oneDNN at M = 128 and 1024, see the module doc). It is not the op there, so the
# kernel runs at every M: what runs instead of it is the op's exact torch composition (a
# float64 matmul), several times slower.
U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)
#: quantize is elementwise: a channels-last input is read in its own memory order
_DENSE = frozenset({"contiguous", "channels_last"})
#: qconv2d reads any strides: NHWC or NCHW memory in place, other strides through a copy
STRIDED = frozenset({"strided"})
F32 = rt.F32
#: post-op codes of csrc/int8.h
POST = {"none": 0, "relu": 1, "add_relu": 2, "gelu": 3, "gelu_tanh": 4,
        "relu_q": 5, "gelu_q": 6, "gelu_tanh_q": 7}  # fmt: skip
#: the post-op of qlinear's and qconv2d's ops (qlinear_gelu's depends on ``approximate``)
QLINEAR_POST = {"qlinear": "none", "qlinear_relu": "relu", "qlinear_gelu": "gelu"}
QCONV2D_POST = {"qconv2d": "none", "qconv2d_relu": "relu", "qconv2d_add_relu": "add_relu"}
#: the requantizing fused ops: the post-op, then quantize_per_tensor to 1-byte codes
QLINEAR_Q8_POST = {"qlinear_relu_quantize": "relu", "qlinear_gelu_quantize": "gelu"}
QCONV2D_Q8_POST = {"qconv2d_relu_quantize": "relu"}


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
        _qparams(op, scale, zero_point, quant_min, quant_max, dtype)
        if isinstance(input, np.ndarray) and input.ndim == 4 and not input.flags.c_contiguous:
            # channels-last (a conv's input): its NHWC memory, quantized element by element,
            # and the output in the same memory order
            dt = rt.float_dtype(op, "input", input, names)
            x = rt.array(op, "input", input.transpose(0, 2, 3, 1), dt)
            buf = buffers.empty(x.shape, dtype)
            out = buf.transpose(0, 3, 1, 2)
        else:
            x = rt.operand(op, "input", input, names)
            buf = out = buffers.empty(x.shape, dtype)
        inv = np.float32(1.0 / scale)  # the reference's expression: the same float32
        if out.size:
            c = rt.c_function(names[x.dtype])
            c.fn(c.ptr(x), c.ptr(buf), x.size, float(inv), zero_point, quant_min, quant_max,
                 int(dtype == "int8"), rt.threads(x.nbytes + buf.nbytes))  # fmt: skip
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


def _post_code(op: str, post: str, approximate: str) -> int:
    """The C post-op code of ``op`` (gelu: erf for approximate 'none', else tanh), checked."""
    return POST[_post_name(op, post, approximate)]


def _post_name(op: str, post: str, approximate: str) -> str:
    """``post``, gelu named by its formula (erf for approximate 'none', else tanh), checked."""
    if post != "gelu":
        return post
    if approximate not in ("none", "tanh"):
        rt.fail(op, "approximate", "'none' or 'tanh'", repr(approximate))
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def _qlinear(level: str, op: str = "qlinear") -> Callable[..., np.ndarray]:
    post = QLINEAR_POST[op]

    def qlinear(input: np.ndarray, input_scale: float, input_zero_point: int,
                weight: np.ndarray, weight_scales: np.ndarray, bias: np.ndarray | None = None,
                approximate: str = "none") -> np.ndarray:  # fmt: skip
        code = _post_code(op, post, approximate)
        return _run_qlinear(level, op, code, input, input_scale, input_zero_point, weight,
                            weight_scales, bias, None)  # fmt: skip

    qlinear.__name__ = op
    return qlinear


def _qlinear_quantize(level: str, op: str) -> Callable[..., np.ndarray]:
    """A requantizing fused op of qlinear: its post-op, then quantize_per_tensor's codes."""
    post = QLINEAR_Q8_POST[op]

    def qlinear_quantize(input: np.ndarray, input_scale: float, input_zero_point: int,
                         weight: np.ndarray, weight_scales: np.ndarray,
                         bias: np.ndarray | None, output_scale: float, output_zero_point: int,
                         quant_min: int, quant_max: int, dtype: str,
                         approximate: str = "none") -> np.ndarray:  # fmt: skip
        code = POST[_post_name(op, post, approximate) + "_q"]
        q = _out_qparams(op, output_scale, output_zero_point, quant_min, quant_max, dtype)
        return _run_qlinear(level, op, code, input, input_scale, input_zero_point, weight,
                            weight_scales, bias, q)  # fmt: skip

    qlinear_quantize.__name__ = op
    return qlinear_quantize


def _out_qparams(op: str, scale: float, zero_point: int, quant_min: int, quant_max: int,
                 dtype: str) -> tuple:  # fmt: skip
    """The output codes' parameters as the C call takes them (inv, zp, qmin, qmax, sgn),
    checked; inv = float32(1 / scale), the quantize reference's expression."""
    _qparams(op, scale, zero_point, quant_min, quant_max, dtype)
    inv = float(np.float32(1.0 / scale))
    return dtype, (inv, zero_point, quant_min, quant_max, int(dtype == "int8"))


def _run_qlinear(level: str, op: str, code: int, input: np.ndarray, input_scale: float,
                 input_zero_point: int, weight: np.ndarray, weight_scales: np.ndarray,
                 bias: np.ndarray | None, q: tuple | None) -> np.ndarray:  # fmt: skip
    """qlinear's C call with post-op ``code``: fp32 output, or codes of q = (dtype, C args)."""
    x = rt.array(op, "input", input, U8)
    if x.ndim < 1:
        rt.fail(op, "input", "a 1-D or more tensor", "0-D")
    _qparams(op, input_scale, input_zero_point, 0, 255, "uint8")
    w, ws, b = _int8_linear_args(op, x, weight, weight_scales, bias)
    n, m, k = w.shape[0], math.prod(x.shape[:-1]), x.shape[-1]
    out = buffers.empty((*x.shape[:-1], n), F32 if q is None else q[0])
    if out.size:
        c = rt.c_function(f"rc_qlinear_{'f32' if q is None else 'q8'}_{level}")
        nt = rt.threads(w.nbytes + m * n * k // 4)  # ~1 M multiply-adds: worth 2 threads
        buf = buffers.empty((rt.c_function(f"rc_qlinear_scratch_f32_{level}").fn(m, n, k, nt),), U8)
        c.fn(c.ptr(x), c.ptr(w), c.ptr(ws), c.opt(b), c.ptr(out), c.ptr(buf), m, n, k,
             float(np.float32(input_scale)), input_zero_point, code,
             *(() if q is None else q[1]), nt)  # fmt: skip
    return out


def _int8_linear_args(op: str, x: np.ndarray, weight: np.ndarray, weight_scales: np.ndarray,
                      bias: np.ndarray | None) -> tuple:  # fmt: skip
    """An int8 linear's weight (N, K) int8, scales (N,) and bias (N,) float32, checked against
    x (*, K) as the C call needs them."""
    k = x.shape[-1]
    if k > MAX_K:
        rt.fail(op, "input", f"in_features <= {MAX_K} (int32 sums stay exact)", k)
    w = rt.array(op, "weight", weight, I8)
    if w.ndim != 2 or w.shape[1] != k:
        rt.fail(op, "weight", f"shape (N, {k}) (in_features = input.shape[-1])", w.shape)
    n = w.shape[0]
    ws = rt.array(op, "weight_scales", weight_scales, F32, (n,))
    b = None if bias is None else rt.array(op, "bias", bias, F32, (n,))
    return w, ws, b


def _dynamic_qlinear(level: str) -> Callable[..., np.ndarray]:
    names = rt.symbols("dynamic_qlinear", level, rt.BOTH)
    scratch = f"rc_qlinear_scratch_f32_{level}"

    def dynamic_qlinear(input: np.ndarray, weight: np.ndarray, weight_scales: np.ndarray,
                        bias: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        op = "dynamic_qlinear"
        x = rt.operand(op, "input", input, names)
        if x.ndim < 1:
            rt.fail(op, "input", "a 1-D or more tensor", "0-D")
        w, ws, b = _int8_linear_args(op, x, weight, weight_scales, bias)
        n, m, k = w.shape[0], math.prod(x.shape[:-1]), x.shape[-1]
        out = buffers.empty((*x.shape[:-1], n), x.dtype)
        if out.size:
            c = rt.c_function(names[x.dtype])
            nt = rt.threads(w.nbytes + m * n * k // 4)  # as qlinear
            buf = buffers.empty((rt.c_function(scratch).fn(m, n, k, nt),), U8)
            c.fn(c.ptr(x), c.ptr(w), c.ptr(ws), c.opt(b), c.ptr(out), c.ptr(buf), m, n, k, nt)
        return out

    return dynamic_qlinear


#: sizes the C side indexes with int64 but assumes far from overflow (each dim, and elements)
MAX_DIM = 1 << 31
MAX_ELEMENTS = 1 << 40


def _conv_geo_unchecked(x: np.ndarray, weight: np.ndarray, stride, padding, dilation,
                        groups: int) -> tuple[int, ...]:  # fmt: skip
    """_conv_geo's sizes for a call the spec's check accepted, without the C side's limits."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    (top, bottom), (left, right) = pads(padding, weight, (dh, dw))
    hp, wp = h + top + bottom, w + left + right
    ho, wo = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    return (n, h, w, c, o, groups, kh, kw, sh, sw, dh, dw, top, left, ho, wo, hp, wp)


def _conv_geo(op: str, x: np.ndarray, weight: np.ndarray, stride, padding, dilation,
              groups: int) -> tuple[int, ...]:  # fmt: skip
    """qconv2d's sizes in the C order (csrc/int8.h, without the layout flag), checked."""
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    if not isinstance(groups, (int, np.integer)) or groups < 1 or c % groups or o % groups:
        rt.fail(op, "groups", f"a positive divisor of C = {c} and O = {o}", groups)
    if cg * groups != c:
        rt.fail(op, "weight", f"shape (O, {c // groups}, kH, kW) (C / groups)", weight.shape)
    if cg * kh * kw > MAX_K:
        rt.fail(op, "weight", f"C / groups * kH * kW <= {MAX_K} (int32 sums stay exact)",
                weight.shape)  # fmt: skip
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    if min(sh, sw, dh, dw) < 1:
        rt.fail(op, "stride, dilation", "positive values", ((sh, sw), (dh, dw)))
    if isinstance(padding, str) and (padding not in ("same", "valid") or
                                     (padding == "same" and (sh, sw) != (1, 1))):  # fmt: skip
        rt.fail(op, "padding", "'valid', 'same' (stride 1) or an int pair", repr(padding))
    (top, bottom), (left, right) = pads(padding, weight, (dh, dw))
    if min(top, bottom, left, right) < 0:
        rt.fail(op, "padding", "non-negative values", padding)
    hp, wp = h + top + bottom, w + left + right
    ho, wo = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    if ho < 1 or wo < 1:
        rt.fail(op, "input", "an output of at least 1 x 1 (the kernel fits the padded input)",
                f"{ho} x {wo}")  # fmt: skip
    geo = (n, h, w, c, o, groups, kh, kw, sh, sw, dh, dw, top, left, ho, wo, hp, wp)
    if _too_large(geo):  # the kernels' rule declines these first (_qconv2d_rule)
        rt.fail(op, "input", "every size < 2**31 and tensors < 2**40 elements", geo)
    return geo


def _too_large(geo: tuple[int, ...]) -> bool:
    """Sizes the C side cannot take (it reads each as an int64 product of ints)."""
    n, c, o, ho, wo, hp, wp = geo[0], geo[3], geo[4], geo[14], geo[15], geo[16], geo[17]
    return max(geo) >= MAX_DIM or max(n * hp * wp * c, n * ho * wo * o) >= MAX_ELEMENTS


def _qconv2d_rule(call: Call) -> Verdict:
    """qconv2d and its fused forms decline a size, stride, padding or dilation of 2**31 or more
    (or a tensor of 2**40 elements): the spec accepts them (a huge stride gives a 1 x 1
    output), the C side takes ints."""
    a = call.arguments
    geo = _conv_geo_unchecked(a["input"], a["weight"], a["stride"], a["padding"],
                              a["dilation"], a["groups"])  # fmt: skip
    if _too_large(geo):
        return no(f"sizes {geo} (N H W C O G kH kW strides dilations pads oH oW padded): the C "
                  "kernel takes each < 2**31 and tensors < 2**40 elements")  # fmt: skip
    return YES


def _qconv2d(level: str, op: str = "qconv2d") -> Callable[..., np.ndarray]:
    """qconv2d's kernel function, or a fused op's: ``other`` is keyword-only (the kernels are
    called by name) and read by qconv2d_add_relu only."""
    code = POST[QCONV2D_POST[op]]

    def qconv2d(input: np.ndarray, input_scale: float, input_zero_point: int,
                weight: np.ndarray, weight_scales: np.ndarray, bias: np.ndarray | None = None,
                stride=1, padding=0, dilation=1, groups: int = 1, *,
                other: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        return _run_qconv2d(level, op, code, input, input_scale, input_zero_point, weight,
                            weight_scales, bias, (stride, padding, dilation, groups), other,
                            None)  # fmt: skip

    qconv2d.__name__ = op
    return qconv2d


def _qconv2d_quantize(level: str, op: str) -> Callable[..., np.ndarray]:
    """A requantizing fused op of qconv2d: its post-op, then quantize_per_tensor's codes."""
    code = POST[QCONV2D_Q8_POST[op] + "_q"]

    def qconv2d_quantize(input: np.ndarray, input_scale: float, input_zero_point: int,
                         weight: np.ndarray, weight_scales: np.ndarray,
                         bias: np.ndarray | None, output_scale: float, output_zero_point: int,
                         quant_min: int, quant_max: int, dtype: str, stride=1, padding=0,
                         dilation=1, groups: int = 1) -> np.ndarray:  # fmt: skip
        q = _out_qparams(op, output_scale, output_zero_point, quant_min, quant_max, dtype)
        return _run_qconv2d(level, op, code, input, input_scale, input_zero_point, weight,
                            weight_scales, bias, (stride, padding, dilation, groups), None,
                            q)  # fmt: skip

    qconv2d_quantize.__name__ = op
    return qconv2d_quantize


def _run_qconv2d(level: str, op: str, code: int, input: np.ndarray, input_scale: float,
                 input_zero_point: int, weight: np.ndarray, weight_scales: np.ndarray,
                 bias: np.ndarray | None, attrs: tuple, other: np.ndarray | None,
                 q: tuple | None) -> np.ndarray:  # fmt: skip
    """qconv2d's C call with post-op ``code`` and attrs (stride, padding, dilation, groups):
    an fp32 output, or codes of q = (dtype, C args); channels_last either way."""
    for arg, a, dt in (("input", input, U8), ("weight", weight, I8)):
        if not isinstance(a, np.ndarray) or a.dtype != dt or a.ndim != 4:
            rt.fail(op, arg, f"a 4-D {dt} array",
                    f"{type(a).__name__} {getattr(a, 'dtype', '')} "
                    f"{getattr(a, 'shape', '')}", TypeError)  # fmt: skip
    _qparams(op, input_scale, input_zero_point, 0, 255, "uint8")
    geo = _conv_geo(op, input, weight, *attrs)
    o = weight.shape[0]
    ws = rt.array(op, "weight_scales", _dense(weight_scales), F32, (o,))
    b = None if bias is None else rt.array(op, "bias", _dense(bias), F32, (o,))
    # the input as NHWC memory (a view of channels_last) or NCHW (a view of contiguous), any
    # other strides copied to NHWC; the weight as OHWI (a view of a channels_last weight)
    nhwc = input.transpose(0, 2, 3, 1)
    nchw = not nhwc.flags.c_contiguous and input.flags.c_contiguous
    x = input if nchw else np.ascontiguousarray(nhwc)
    wt = np.ascontiguousarray(weight.transpose(0, 2, 3, 1))
    n, ho, wo = geo[0], geo[14], geo[15]
    reads_other = code == POST["add_relu"]
    if other is not None and not reads_other:
        rt.fail(op, "other", "None (only qconv2d_add_relu reads a residual)", "an array")
    res, res_nchw = _other(op, other, (n, o, ho, wo)) if reads_other else (None, False)
    buf = buffers.empty((n, ho, wo, o), F32 if q is None else q[0])
    if buf.size:
        g = np.array((*geo, int(nchw)), np.int64)
        nt = rt.threads(buf.size * weight[0].size // 4)  # as qlinear: M N K / 4
        scratch = rt.c_function(f"rc_qconv2d_scratch_f32_{level}")
        tmp = buffers.empty((scratch.fn(scratch.ptr(g), nt),), U8)
        xs = float(np.float32(input_scale))
        if q is None:
            c = rt.c_function(f"rc_qconv2d_f32_{level}")
            c.fn(c.ptr(x), c.ptr(wt), c.ptr(ws), c.opt(b), c.opt(res), c.ptr(buf), c.ptr(tmp),
                 c.ptr(g), xs, input_zero_point, code, int(res_nchw), nt)  # fmt: skip
        else:
            c = rt.c_function(f"rc_qconv2d_q8_{level}")
            c.fn(c.ptr(x), c.ptr(wt), c.ptr(ws), c.opt(b), c.ptr(buf), c.ptr(tmp), c.ptr(g), xs,
                 input_zero_point, code, *q[1], nt)  # fmt: skip
    return buf.transpose(0, 3, 1, 2)


def _other(op: str, other: np.ndarray, out: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """qconv2d_add_relu's residual as the C call reads it: (NHWC memory of a channels-last
    ``other``, False), else (a contiguous NCHW ``other``, True); checked against the output's
    shape ``out`` (N, O, Ho, Wo)."""
    if not isinstance(other, np.ndarray) or other.shape != out:
        rt.fail(op, "other", f"an array of the output's shape {out} (no broadcasting)",
                getattr(other, "shape", type(other).__name__))  # fmt: skip
    nhwc = other.transpose(0, 2, 3, 1)
    if nhwc.flags.c_contiguous:  # channels_last (or both: N, O or Ho x Wo of 1)
        return rt.array(op, "other", nhwc, F32), False
    return rt.array(op, "other", other, F32), True


def _dense(a: np.ndarray) -> np.ndarray:
    """A C-contiguous aligned copy of a strided or unaligned array (weight_scales, bias: O
    values), else ``a``; dtype and shape are checked after."""
    if isinstance(a, np.ndarray) and not (a.flags.c_contiguous and a.flags.aligned):
        return np.require(a, requirements=("C", "A"))
    return a


def _conv_out(a: dict) -> tuple[int, int, int, int]:
    """The output shape (N, O, Ho, Wo) of a checked qconv2d call's arguments ``a``."""
    x, w = a["input"], a["weight"]
    (sh, sw), (dh, dw) = pair(a["stride"]), pair(a["dilation"])
    (top, bottom), (left, right) = pads(a["padding"], w, (dh, dw))
    kh, kw = w.shape[2:]
    ho = (x.shape[2] + top + bottom - dh * (kh - 1) - 1) // sh + 1
    wo = (x.shape[3] + left + right - dw * (kw - 1) - 1) // sw + 1
    return x.shape[0], w.shape[0], ho, wo


def _qconv2d_add_rule(call: Call) -> Verdict:
    """qconv2d_add_relu reads ``other`` as a float32 tensor of the output's shape in NHWC
    (channels_last) or NCHW (contiguous) memory: no broadcasting, no other strides; and
    `_qconv2d_rule`'s sizes."""
    sizes = _qconv2d_rule(call)
    if not sizes:
        return sizes
    other, out = call.arguments["other"], _conv_out(call.arguments)
    if tuple(other.shape) != out:
        return no(f"other has shape {tuple(other.shape)}; reads a full residual of the output's "
                  f"shape {out} (no broadcasting)")  # fmt: skip
    if other.dtype != F32:
        return no(f"other has dtype {other.dtype}; reads float32")
    lay = call.layout("other")
    if lay not in _DENSE:
        return no(f"other is {lay} (strides {other.strides}); reads a channels_last or "
                  "contiguous residual")  # fmt: skip
    return YES


def _qlinear_rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    m = math.prod(x.shape[:-1])
    if m > SMALL_M and "avx512_vnni" in cpu.detected():
        return no(
            f"M = {m} rows > {SMALL_M} on a VNNI CPU: the op's torch function runs oneDNN's "
            "vpdpbusd GEMM there (exact, several times this AVX2 kernel's rate)"
        )
    return YES


#: the family's ISA levels: `rt.VARIANTS` and amx (int8_amx.c: the VNNI code with qlinear's GEMM
#: on AMX tiles); a level exists when its csrc/int8_<level>.c does (`rt.variants`)
LEVELS = tuple(lvl for lvl, _ in rt.variants("int8", (*rt.VARIANTS, ("amx", rt.BOTH))))
#: the rule of qlinear's kernels (and its fused forms) per level: the AVX2 kernel leaves M > 16
#: to torch on a VNNI CPU; the VNNI kernel takes every M (measured choice decides against torch)
QLINEAR_RULES: dict[str, Callable[[Call], Verdict] | None] = {"avx2": _qlinear_rule}


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op and ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows.

    Every int8 C file defines the float32 and bfloat16 forms of quantize_per_tensor and
    dynamic_qlinear, so the kernels declare both whatever dtypes `rt.VARIANTS` gives the level
    (it gives avx512_bf16 bfloat16 only: the other families' fp32 code there is avx512's)."""
    made = []
    f32 = frozenset({"float32"})
    for lvl in LEVELS:
        if cpu.has(lvl):
            qrule = QLINEAR_RULES.get(lvl)
            made += [
                Kernel(op="quantize_per_tensor", name=f"quantize_per_tensor_{lvl}",
                       fn=_quantize(lvl, rt.BOTH), dtypes=rt.BOTH, layouts=_DENSE, isa=lvl,
                       priority=rt.priority(lvl)),
                Kernel(op="dequantize_per_tensor", name=f"dequantize_per_tensor_{lvl}",
                       fn=_dequantize(lvl), dtypes=f32, layouts=rt.CONTIGUOUS, isa=lvl,
                       priority=rt.priority(lvl)),
                *(Kernel(op=op, name=f"{op}_{lvl}", fn=_qlinear(lvl, op), dtypes=f32,
                         layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
                         rule=qrule) for op in QLINEAR_POST),
                Kernel(op="dynamic_qlinear", name=f"dynamic_qlinear_{lvl}",
                       fn=_dynamic_qlinear(lvl), dtypes=rt.BOTH, layouts=rt.CONTIGUOUS, isa=lvl,
                       priority=rt.priority(lvl)),
                *(Kernel(op=op, name=f"{op}_{lvl}", fn=_qconv2d(lvl, op), dtypes=f32,
                         layouts=STRIDED, isa=lvl, priority=rt.priority(lvl),
                         rule=_qconv2d_add_rule if op == "qconv2d_add_relu" else _qconv2d_rule)
                  for op in QCONV2D_POST),
                *(Kernel(op=op, name=f"{op}_{lvl}", fn=_qlinear_quantize(lvl, op), dtypes=f32,
                         layouts=rt.CONTIGUOUS, isa=lvl, priority=rt.priority(lvl),
                         rule=qrule) for op in QLINEAR_Q8_POST),
                *(Kernel(op=op, name=f"{op}_{lvl}", fn=_qconv2d_quantize(lvl, op), dtypes=f32,
                         layouts=STRIDED, isa=lvl, priority=rt.priority(lvl),
                         rule=_qconv2d_rule)
                  for op in QCONV2D_Q8_POST),
            ]  # fmt: skip
    return tuple(made)
