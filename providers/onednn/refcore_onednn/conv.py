"""conv2d, conv2d_relu and conv2d_add_relu on torch's oneDNN (``torch.ops.mkldnn``).

``torch.ops.mkldnn._convolution_pointwise`` runs the conv with the ReLU as a oneDNN post-op; its
``.binary`` form adds ``other`` (post-op "add") before the ReLU, reading it without writing it.
The weight comes plain (oneDNN reorders it into its blocked format on every call) or packed in
the ``onednn_conv`` layout (specs/layouts.yaml), whose blocked form for the call's conv is kept
beside the weight (`PackedWeight.held`): made by the pack when it knew the conv, else here on the
first call of each conv (at most `HELD` per weight). The result is the same either way (oneDNN
reorders a blocked weight made for another input size again; measured bit-identical), so a
packed weight is never declined for the input size.

Arrays cross to torch and back without a copy (`refcore.tensors`); the output is torch's tensor
(channels-last for channels-last input), seen as NumPy.

**Declined** (with the reason, shown by ``refcore.explain``): padding that differs top / bottom
or left / right ('same' with an even kernel: oneDNN's pointwise conv takes one padding per dim),
``other`` not of the output's shape (conv2d_add_relu: the post-op does not broadcast), bf16
where torch's oneDNN has no bf16 path (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT; not
registered at all there), and bf16 shapes where torch's oneDNN is wrong or crashes (`_rule`).

**Redone by the reference** (rare, by design, as the native kernels do): calls with a NaN / Inf
or huge (|x| |w| K near fp32's limit; bf16: (|x| + |w|) K past 2^102, where the products
oneDNN's bf16 path drops by reading subnormals as 0 could matter) value in input, weight, bias
or ``other`` (see `_exact`:
oneDNN's ReLU post-op turns NaN into 0, its fp32 sums may overflow in another order, and it
skips padded taps the reference multiplies by the weight). The check is one pass over the input
per call (the packed weight's bound is kept).

**Measured** on AMD EPYC Zen 3 (AVX2 + FMA only), ResNet-50's 23 conv shapes at batch 4, fp32,
channels-last input and weight, 2 threads, packed weight, kernel function against eager
``relu(F.conv2d(...) [+ other])``, 11 interleaved rounds, shared machine (noise about +-0.3):
geomean 1.23x (0.68-4.24x: the stem 1.15-2.9x, 3x3 at 7x7 / 14x14 1.1-2.2x, most 1x1 layers
1.0-1.3x); through ``refcore.run`` 1.07x. End to end, ResNet-50 b4 224 fp32 (9 rounds):
``optimize(provider="onednn")`` 1.03x eager, ``"auto"`` 1.06x (native 1.00x), the choice
per node being measured (within noise of the 5% margin for most layers). No bf16 path here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._prims_common import suggest_memory_format

from refcore import cpu, tensors
from refcore.call import Call
from refcore.ops.layouts import onednn_conv_key, onednn_conv_reorder
from refcore.packed import PackedWeight
from refcore.provider import YES, Kernel, Verdict, no

#: op -> (oneDNN unary post-op, reads ``other``)
OPS: dict[str, tuple[str, bool]] = {
    "conv2d": ("none", False),
    "conv2d_relu": ("relu", False),
    "conv2d_add_relu": ("relu", True),
}
#: blocked forms kept per packed weight (one per conv geometry met; each a copy of the weight)
HELD = 4
LAYOUTS = frozenset({"strided", "onednn_conv"})
BF16 = tensors.numpy_dtype("bfloat16")
#: bf16 calls with (max|x| + max|w|) K past this are redone by the reference (see `_exact`)
FLUSH_BOUND = 2.0**102


def dtypes() -> frozenset[str]:
    """fp32; bf16 where torch's oneDNN has a bf16 path (AVX512-BW/VL/DQ or AVX-NE-CONVERT:
    measured "bf16 path needs the cpu support ..." on an AVX2-only Zen 3).
    ``REFCORE_CPU_CAPABILITY`` below avx512 leaves bf16 out, as a CPU without AVX-512 would."""
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported() and cpu.has("avx512")
    return frozenset({"float32", "bfloat16"} if bf16 else {"float32"})


def _key(a: dict[str, Any]) -> Any:
    return onednn_conv_key(tuple(a["weight"].shape), tuple(a["input"].shape), a["stride"],
                           a["padding"], a["dilation"], a["groups"])  # fmt: skip


def _out_shape(a: dict[str, Any], key: Any) -> tuple[int, ...]:
    (n, _, h, w), (sh, sw), (ph, pw), (dh, dw), _ = key
    kh, kw = a["weight"].shape[2:]
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return (n, a["weight"].shape[0], ho, wo)


def _rule(call: Call) -> Verdict:
    a = call.arguments
    key = _key(a)
    if key is None:
        return no(f"padding={a['padding']!r} with kernel {tuple(a['weight'].shape[2:])} pads "
                  "top / bottom or left / right differently; oneDNN's pointwise conv takes one "
                  "padding per dim")  # fmt: skip
    out = _out_shape(a, key)
    if a["input"].dtype == BF16 and out[3] == 1 and key[1][1] > 1:
        return no(f"bf16 with one output column and stride {key[1][1]} along W: torch's oneDNN "
                  "bf16 convolution reads out of its buffers there (wrong values, at times a "
                  "crash; F.conv2d too, on an Intel Xeon with AMX, torch 2.13)")  # fmt: skip
    if a["input"].dtype == BF16 and _padding_only(a, key):
        return no("bf16 with an output row or column whose every tap is padding: torch's "
                  "oneDNN bf16 convolution crashed there (SIGSEGV; F.conv2d too, Intel Xeon "
                  "with AMX, torch 2.13: 11 of 3,100 probed shapes, all of this kind)")  # fmt: skip
    other = a.get("other")
    if other is not None and a["input"].dtype == BF16 and not _fuses(a):
        return no("bf16 conv2d_add_relu that torch's oneDNN does not fuse (groups > 1, or "
                  "neither input nor weight channels-last): its unfused fallback, add_relu, "
                  "has no bf16 kernel (torch 2.13 raises)")  # fmt: skip
    if other is not None and tuple(other.shape) != out:
        return no(f"other of shape {tuple(other.shape)} is not the output's shape "
                  f"{out}; oneDNN's add post-op does not broadcast")  # fmt: skip
    return YES


def _padding_only(a: dict[str, Any], key: Any) -> bool:
    """Whether some output row or column reads padding only (each of its taps outside the
    input): output j of a dim of n inputs reads taps j * stride - pad + t * dilation, t < k."""
    (_, _, h, w), stride, pad, dil, _ = key
    kh, kw = a["weight"].shape[2:]
    for n, k, st, p, d in ((h, kh, stride[0], pad[0], dil[0]), (w, kw, stride[1], pad[1], dil[1])):
        for j in range((n + 2 * p - d * (k - 1) - 1) // st + 1):
            if not any(0 <= j * st - p + t * d < n for t in range(k)):
                return True
    return False


def _fuses(a: dict[str, Any]) -> bool:
    """Whether torch surely runs the add post-op fused (``mkldnn_convolution_pointwise_binary``:
    groups 1, and input or weight channels-last by torch's memory-format rule; a blocked weight
    also fuses, but a packed weight is judged by its plain array, so the verdict does not
    depend on whether an earlier call made the blocked form)."""
    if a["groups"] != 1:
        return False
    w = a["weight"]
    arrays = (a["input"], w.data if isinstance(w, PackedWeight) else w)
    cl = torch.channels_last
    return any(suggest_memory_format(tensors.to_torch(t)) == cl for t in arrays)


def _blocked(weight: PackedWeight, key: Any) -> Any:
    """The packed weight's blocked form for the conv ``key`` (made once, kept), or its plain
    array where oneDNN cannot reorder it here."""
    held = weight.held
    form = held.get(key)
    if form is None:
        form = onednn_conv_reorder(weight.data, key)
        if form is None:
            return tensors.to_torch(weight.data)
        forms = [k for k in held if isinstance(k, tuple)]  # the others: "amax"
        for old in forms[: max(0, len(forms) - HELD + 1)]:  # the oldest go (insertion order)
            held.pop(old, None)
        held[key] = form
    return form


def _dense(a: np.ndarray) -> Any:
    """``a`` as a torch tensor oneDNN reads right: contiguous or channels-last as it is, any other
    strides copied (oneDNN read a bias of stride 2, and strided inputs, as if contiguous:
    wrong results, found by the generic suite)."""
    t = tensors.to_torch(a)
    if t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)):
        return t
    return t.contiguous()


def _amax(t: Any) -> float:
    """max |t| in one pass (NaN if t holds one; torch's aminmax propagates NaN), over a flat
    view of dense memory: aminmax on a 4-D channels-last tensor measured 30x slower than on the
    same memory seen 1-D (9.4 ms against 0.3 ms, 4 x 256 x 56 x 56 fp32, 2 threads, Zen 3)."""
    flat = _flat(t)
    lo, hi = torch.aminmax(flat if flat is not None else t)
    return max(-float(lo), float(hi))


def _flat(t: Any) -> Any:
    """A 1-D view of ``t``'s elements when its memory is dense (contiguous or channels-last)."""
    if t.is_contiguous():
        return t.view(-1)
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return t.permute(0, 2, 3, 1).reshape(-1)
    return None


def _weight_amax(weight: Any) -> float:
    if isinstance(weight, PackedWeight):
        got = weight.held.get("amax")
        if got is None:
            got = weight.held["amax"] = _amax(tensors.to_torch(weight.data))
        return got
    return _amax(tensors.to_torch(weight))


def _exact(x: Any, weight: Any, b: Any, res: Any) -> bool:
    """True when oneDNN's result is the reference's: every value finite and too small for any
    fp32 partial sum to overflow (|x| |w| K + |b| + |other| < 1e38, K the products per output).

    oneDNN's ReLU post-op maps NaN to 0 where torch's relu keeps it, its fp32 sums of huge
    products can meet +inf and -inf (NaN) where the exact sum is finite, and it skips padded taps
    where the reference multiplies zeros by a NaN / Inf weight: such calls, found by this one
    pass over the input (and the packed weight's bound, kept), are redone by the reference."""
    k = math.prod(weight.shape[1:])
    ax, aw = _amax(x), _weight_amax(weight)
    bound = ax * aw * k
    if b is not None:
        bound += _amax(b)
    if res is not None:
        bound += _amax(res)
    # bf16: oneDNN's bf16 products read subnormals as 0, each dropped product under 2^-126
    # times the other operand's max; K of them lose at most 2^-24 below this (found by
    # refcore.fuzz: bf16 weights of 1e-38 against inputs of 3e38, products of ~3 dropped)
    flushed = x.dtype != torch.bfloat16 or (ax + aw) * k <= FLUSH_BOUND
    return bound < 1e38 and flushed  # False for NaN and inf too


def _kernel_fn(op: str) -> Callable[..., np.ndarray]:
    attr, binary = OPS[op]
    pointwise = torch.ops.mkldnn._convolution_pointwise

    def conv(input, weight, bias=None, other=None, stride=(1, 1), padding=(0, 0),
             dilation=(1, 1), groups=1) -> np.ndarray:  # fmt: skip
        args = dict(input=input, weight=weight, stride=stride, padding=padding,
                    dilation=dilation, groups=groups)  # fmt: skip
        key = _key(args)
        if key is None:
            raise ValueError(f"{op} (onednn): 'padding' expected the same padding on both "
                             f"sides of each dim; got {padding!r}")  # fmt: skip
        out_shape = _out_shape(args, key)
        if math.prod(out_shape) == 0:
            return np.zeros(out_shape, input.dtype)
        _, st, pad, dil, g = key
        w = _blocked(weight, key) if isinstance(weight, PackedWeight) else _dense(weight)
        x = _dense(input)
        b = None if bias is None else _dense(bias)
        res = _dense(other) if binary else None
        if binary:
            y = pointwise.binary(x, res, w, b, list(pad), list(st),
                                 list(dil), g, "add", None, attr, [], "")  # fmt: skip
        else:
            y = pointwise(x, w, b, list(pad), list(st), list(dil), g, attr, [], "")
        if not _exact(x, weight, b, res):
            from refcore.packed import unpack
            from refcore.registry import default_registry, resolve

            ref = resolve(default_registry().op(op).reference)
            extra = {"other": other} if binary else {}
            return ref(**{**args, "weight": unpack(weight), "bias": bias, **extra})
        return tensors.to_numpy(y)

    conv.__name__ = op
    return conv


def kernels() -> tuple[Kernel, ...]:
    """One kernel per op; each reads a plain weight or one packed as ``onednn_conv``."""
    dts = dtypes()
    return tuple(
        Kernel(op=op, name=f"{op}_onednn", fn=_kernel_fn(op), dtypes=dts, layouts=LAYOUTS,
               isa="portable", rule=_rule)
        for op in OPS
    )  # fmt: skip
