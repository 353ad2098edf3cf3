"""Native kernels for the vision family (specs/vision.yaml): roi_align.

C: ``csrc/vision_portable.c``, compiled again at the avx2 and avx512 levels (the channel loop on
that level's vectors). The map is read in place, NCHW or channels-last (NHWC: the channel loop is
contiguous, the case detection heads run); the output takes the input's memory format. Boxes are
split over the threads. torch has no roi_align of its own (torchvision's does not load beside
this CPU torch), so nothing here is measured against torch: these kernels stand for the
reference, not instead of a torch kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.ops.vision import MAX_GRID, output_pair
from refcore.provider import YES, Kernel, Verdict, no
from refcore_native import _runtime as rt

LAYOUTS = frozenset({"contiguous", "channels_last"})


def _channels_last(a: np.ndarray) -> bool:
    t = a.transpose(0, 2, 3, 1)
    return t.flags.c_contiguous and t.flags.aligned


def _dense(a: np.ndarray) -> np.ndarray | None:
    """The C-contiguous buffer behind a contiguous or channels-last 4-D array, or None."""
    if a.flags.c_contiguous and a.flags.aligned:
        return a
    return a.transpose(0, 2, 3, 1) if _channels_last(a) else None


def _rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    if _dense(x) is None:
        return no(f"input neither contiguous nor channels_last (strides {x.strides} for shape "
                  f"{x.shape}); the kernel reads a dense map")  # fmt: skip
    return YES


def _make(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols("roi_align", level, dtypes)
    op = "roi_align"

    def roi_align(input: np.ndarray, boxes: np.ndarray, output_size, spatial_scale: float = 1.0,
                  sampling_ratio: int = -1, aligned: bool = False) -> np.ndarray:  # fmt: skip
        dt = rt.float_dtype(op, "input", input, names)
        if not isinstance(input, np.ndarray) or input.ndim != 4:
            rt.fail(op, "input", "a 4-D (N, C, H, W) array", getattr(input, "shape", input))
        dense = _dense(input)
        if dense is None:
            rt.fail(op, "input", "a contiguous or channels_last array", f"strides {input.strides}")
        rt.array(op, "input", dense, dt)
        if not isinstance(boxes, np.ndarray) or boxes.ndim != 2 or boxes.shape[1] != 5:
            rt.fail(op, "boxes", "a (K, 5) array", getattr(boxes, "shape", boxes))
        b = np.ascontiguousarray(boxes, dtype=np.float32)  # bf16 boxes widen exactly
        oh, ow = output_pair(output_size)
        if oh < 1 or ow < 1:
            rt.fail(op, "output_size", "a positive height and width", (oh, ow))
        n, c, h, w = input.shape
        k = b.shape[0]
        cl = dense is not input  # channels-last in, channels-last out
        buf = buffers.empty((k, oh, ow, c) if cl else (k, c, oh, ow), dt)
        out = buf.transpose(0, 3, 1, 2) if cl else buf
        if buf.size:
            es = input.itemsize
            cf = rt.c_function(names[dt])
            bad = cf.fn(cf.ptr(dense), n, c, h, w, *(s // es for s in input.strides), cf.ptr(b),
                        k, oh, ow, float(spatial_scale), int(sampling_ratio), int(bool(aligned)),
                        MAX_GRID, cf.ptr(buf), *(s // es for s in out.strides),
                        rt.threads(buf.nbytes * 16))  # fmt: skip
            if bad:
                rt.fail(op, "boxes", f"batch indices in [0, {n}), finite coordinates and at most "
                        f"{MAX_GRID} samples per bin side", f"box {bad - 1}: {boxes[bad - 1]}")
        return out

    return roi_align


def kernels() -> tuple[Kernel, ...]:
    """One kernel per ISA level the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op="roi_align", name=f"roi_align_{lvl}", fn=_make(lvl, dts), dtypes=dts,
               layouts=LAYOUTS, isa=lvl, priority=rt.priority(lvl), rule=_rule)
        for lvl, dts in rt.variants("vision") if cpu.has(lvl)
    )  # fmt: skip
