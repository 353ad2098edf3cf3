"""Native conv2d on channels-last (NHWC) activations, and the fused conv2d_relu / conv2d_add_relu.

C: ``csrc/conv_<level>.c`` (helpers in ``csrc/rc_conv.h``), all computing
y = act(conv2d(x, w) + b + other) with fp32 accumulation and one rounding, as implicit GEMMs
(rows = output pixels, columns = output channels, K = kh x kw x C):

- amx, bf16: AMX tiles read straight from the NHWC input (1x1 stride 1), from a zero-padded
  NHWC copy (stride 1, padding) or from per-thread im2col rows (stride > 1); see conv_amx.c.
- avx512, fp32: a 6 x 64 FMA register block (12 x 32 on a last odd panel) over the padded
  NHWC input in place, each tap an offset; see conv_avx512.c.
- avx2, fp32 and bf16: a 6 x 16 FMA register block over the padded NHWC input (bf16 widened
  once to fp32, exactly), a kernel row one run of kw C floats, 16-column weight panels in
  L2-sized groups; see conv_avx2.c.
- portable: plain loops.

The weight is read as OHWI memory (torch's channels-last weight, what ``refcore.optimize``'s
channels_last pass gives): a weight in another layout is copied to OHWI first (one copy of the
weight per call). It is packed per call into the level's tile / panel layout inside the kernel.

**Declined** (with the reason, shown by ``refcore.explain``): input not channels-last (dense
NHWC memory), groups > 1, dilation > 1, ``other`` not a channels-last tensor of the output's
shape (conv2d_add_relu), a size, stride or padding of 2**31 or more (the C side takes ints).
The output is channels-last, as torch's for channels-last input.

**Measured** (ResNet-50 layers at batch 4, 1 thread, CPU time, kernel function / torch's oneDNN
on the same channels-last tensors, one run, noise about +-0.05): bf16 0.81-1.18x on the 1x1
layers, 0.86-1.07x on the stride-1 3x3, 1.05-1.44x at 7x7 (512 / 2048 channels), 0.75x on the
stride-2 3x3, 0.54x on the 7x7 stem (im2col-bound); fp32 0.84-1.17x on 1x1, 0.79-0.87x on 3x3
(torch runs at the FMA peak there), 0.85-0.87x strided and stem. ``refcore.run`` adds ~50-100
us per call.

**Measured on AMD EPYC Zen 3 (AVX2 + FMA only)**, avx2 level, the 23 ResNet-50 conv shapes at
batch 4, 2 threads, ``refcore.run`` against ``F.conv2d`` on the same channels-last tensors,
interleaved medians, shared machine (noise about +-0.15): bf16 2.4-11x on every shape (oneDNN
has no fast bf16 path without AVX512-BF16); fp32 1.4-1.7x on the 7x7 stem, 0.84-1.56x on the
rest (parity within noise), 0.75-0.93x on the C = 64 layers: declined (AVX2_F32_SLOW_C).
ResNet-50 bf16 end to end, ``refcore.optimize``: 7.0x eager (native and auto).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refcore import cpu, tensors
from refcore.call import Call
from refcore.ops.conv import pads, pair
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt

#: ISA level -> dtypes of that level's conv kernels (C: rc_conv2d_<tag>_<level>)
LEVELS: dict[str, frozenset[str]] = {
    "amx": frozenset({"bfloat16"}),
    "avx512": frozenset({"float32"}),
    "avx2": rt.BOTH,
    "portable": rt.BOTH,
}
#: op -> (act code of csrc/rc_gemm.h, reads ``other``)
OPS: dict[str, tuple[int, bool]] = {
    "conv2d": (0, False),
    "conv2d_relu": (1, False),
    "conv2d_add_relu": (1, True),
}
LAYOUTS = frozenset({"contiguous", "channels_last"})
#: sizes the C side indexes with int64 but assumes far from overflow (each dim, and elements)
MAX_DIM = 1 << 31
MAX_ELEMENTS = 1 << 40


def _channels_last(a: np.ndarray) -> bool:
    """Dense NHWC memory (C innermost, pixels packed), whatever ``layout_of`` calls it."""
    t = a.transpose(0, 2, 3, 1)
    return t.flags.c_contiguous and t.flags.aligned


def _geometry(input: np.ndarray, weight: np.ndarray, stride, padding, dilation):
    """(ph, pw, ho, wo): top / left padding and output size (bottom / right implied)."""
    (top, bottom), (left, right) = pads(padding, weight, dilation)
    kh, kw = weight.shape[2:]
    sh, sw = pair(stride)
    ho = (input.shape[2] + top + bottom - kh) // sh + 1
    wo = (input.shape[3] + left + right - kw) // sw + 1
    return top, left, ho, wo


def _sizes(input: np.ndarray, weight: np.ndarray, stride, padding, dilation) -> tuple:
    """(every size the C kernel takes, the element counts of input, output and weight)."""
    n, c, h, w = input.shape
    o, _, kh, kw = weight.shape
    ph, pw, ho, wo = _geometry(input, weight, stride, padding, dilation)
    sizes = (n, h, w, c, o, kh, kw, ho, wo, *pair(stride), ph, pw)
    return sizes, (input.size, n * ho * wo * o, o * kh * kw * c)


def _out_shape(a: dict) -> tuple[int, ...]:
    x, w = a["input"], a["weight"]
    _, _, ho, wo = _geometry(x, w, a["stride"], a["padding"], a["dilation"])
    return (x.shape[0], w.shape[0], ho, wo)


#: avx2 fp32: input channels in [min, max) where torch's oneDNN (AVX2 JIT) measured faster
AVX2_F32_SLOW_C = (8, 128)


def _slower_than_torch(dtype: str, c: int, level: str) -> str | None:
    """Why torch is measured faster for this conv class at ISA ``level``, or None."""
    lo, hi = AVX2_F32_SLOW_C
    if level == "avx2" and dtype == "float32" and lo <= c < hi:
        return (f"fp32 conv with C = {c} input channels in [{lo}, {hi}): torch's oneDNN measured "
                "faster on AVX2 (ours 0.75-0.93x at ResNet-50's C = 64 layers, batch 4, 2 "
                "threads, Zen 3: a kernel row is a short K run, so the 6 x 16 block's fixed "
                "cost shows)")  # fmt: skip
    return None


def _rule_for(level: str) -> Callable[[Call], Verdict]:
    def rule(call: Call) -> Verdict:
        verdict = _rule(call)
        if not verdict:
            return verdict
        slower = _slower_than_torch(call.dtype, call.arguments["input"].shape[1], level)
        return no(slower) if slower else YES

    return rule


def _rule(call: Call) -> Verdict:
    a = call.arguments
    if a["groups"] != 1:
        return no(f"groups={a['groups']}; only groups=1 (a dense conv) is implemented")
    if pair(a["dilation"]) != (1, 1):
        return no(f"dilation={pair(a['dilation'])}; only dilation 1 is implemented")
    x = a["input"]
    if not _channels_last(x):
        return no(f"input not channels_last (strides {x.strides} for shape {x.shape})")
    sizes, elements = _sizes(x, a["weight"], a["stride"], a["padding"], a["dilation"])
    if max(sizes) >= MAX_DIM or max(elements) >= MAX_ELEMENTS:
        return no(f"sizes {sizes} (N H W C O kH kW oH oW strides pads): the C kernel takes each "
                  f"< 2**31 and tensors < 2**40 elements")  # fmt: skip
    other = a.get("other")
    if other is not None:
        out = _out_shape(a)
        if tuple(other.shape) != out or not _channels_last(other):
            return no(f"other (shape {other.shape}, strides {other.strides}) is not a "
                      f"channels_last tensor of the output's shape {out}")  # fmt: skip
    return YES


def _nhwc(op: str, arg: str, a: np.ndarray, dt: np.dtype) -> np.ndarray:
    """The NHWC (C-contiguous) view of a channels-last array, checked."""
    if a.ndim != 4 or not _channels_last(a):
        rt.fail(op, arg, "a 4-D channels_last (dense NHWC) array", f"strides {a.strides}")
    return rt.array(op, arg, a.transpose(0, 2, 3, 1), dt)


def _kernel_fn(op: str, level: str) -> Callable[..., np.ndarray]:
    names = rt.symbols("conv2d", level, LEVELS[level])
    act, reads_other = OPS[op]

    def conv(input, weight, bias=None, other=None, stride=(1, 1), padding=(0, 0),
             dilation=(1, 1), groups=1) -> np.ndarray:  # fmt: skip
        dt = rt.float_dtype(op, "input", input, names)
        stride, dilation = pair(stride), pair(dilation)
        if groups != 1 or dilation != (1, 1):
            rt.fail(op, "groups", "groups=1 and dilation=1", f"groups={groups}, "
                    f"dilation={dilation}")  # fmt: skip
        x = _nhwc(op, "input", input, dt)
        if not isinstance(weight, np.ndarray) or weight.ndim != 4:
            rt.fail(op, "weight", "a 4-D (O, C, kH, kW) array", getattr(weight, "shape", weight))
        n, h, w, c = x.shape
        o, wc, kh, kw = weight.shape
        if wc != c:
            rt.fail(op, "weight", f"shape (O, {c}, kH, kW)", weight.shape)
        # OHWI memory: a view of a channels-last weight, one copy of any other
        wt = rt.array(op, "weight", np.ascontiguousarray(weight.transpose(0, 2, 3, 1)), dt)
        b = None if bias is None else rt.array(op, "bias", bias, dt, (o,))
        ph, pw, ho, wo = _geometry(input, weight, stride, padding, dilation)
        if ho < 1 or wo < 1 or min(stride) < 1 or ph < 0 or pw < 0:
            rt.fail(op, "input", "an output of at least 1 x 1", f"{ho} x {wo}")
        sizes, elements = _sizes(input, weight, stride, padding, dilation)
        if max(sizes) >= MAX_DIM or max(elements) >= MAX_ELEMENTS:  # see _rule
            rt.fail(op, "input", "every size < 2**31 and tensors < 2**40 elements", sizes)
        res = None
        if reads_other:
            res = _nhwc(op, "other", other, dt)
            if res.shape != (n, ho, wo, o):
                rt.fail(op, "other", f"shape {(n, o, ho, wo)}", other.shape)
        buf = np.empty((n, ho, wo, o), dt)
        if buf.size:
            name = names[dt]
            if dt == rt.BFLOAT16 and level in rt.FLUSHES_BF16 and not rt.bf16_dots_exact(
                    x, wt, kh * kw * c):  # fmt: skip
                name = "rc_conv2d_bf16_avx2"  # subnormals that matter: exact products
            cf = rt.c_function(name)
            macs = buf.size * kh * kw * c
            rc = cf.fn(cf.ptr(x), cf.ptr(wt), cf.opt(b), cf.opt(res), cf.ptr(buf), n, h, w, c, o,
                       kh, kw, *stride, ph, pw, ho, wo, act, rt.threads(2 * macs))  # fmt: skip
            if rc != 0:
                raise MemoryError(f"{op} (native): no memory for the conv scratch buffers")
        out = buf.transpose(0, 3, 1, 2)
        padded = padding not in ("valid", (0, 0))
        finite = tensors.all_finite(buf) and (not padded or tensors.all_finite(weight))
        if not finite:
            args = dict(input=input, weight=weight, bias=bias, stride=stride, padding=padding)
            out[...] = _reference(op, **args, **({"other": other} if reads_other else {}))
        return out

    conv.__name__ = op
    return conv


def _reference(op: str, **args) -> np.ndarray:
    """The reference's result (float64 sums, rounded once), for the rare calls the C kernels
    get wrong by design (found by refcore.fuzz):

    - an output that is not finite: with fp32 accumulation, products overflowing to +inf and
      -inf meet in some partial sum and give NaN where the exact sum is one infinity (or
      finite), depending on the order (csrc/rc_gemm_fix.h recomputes GEMM sums likewise);
    - a weight holding NaN or Inf with padding: the kernels skip padded taps, where torch and
      the reference multiply zeros by the weight (0 * inf is NaN).

    Finite sums and finite weights never come here: the cost is one check of the output (and
    of the weight when padded) per call."""
    from refcore.registry import default_registry, resolve

    return resolve(default_registry().op(op).reference)(**args)


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op x ISA level the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op=op, name=f"{op}_{lvl}", fn=_kernel_fn(op, lvl), dtypes=dts, layouts=LAYOUTS,
               isa=lvl, priority=rt.priority(lvl), rule=_rule_for(lvl))
        for lvl, dts in LEVELS.items() if cpu.has(lvl)
        for op in OPS
    )  # fmt: skip
