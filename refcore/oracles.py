"""Torch-side adapters for ops that torch has no functional form for.

A spec whose op torch only offers through an object (e.g. a sparse CSR tensor) names an adapter
here as its oracle (``torch.function: refcore.oracles:<op>``). Each adapter takes the op's
arguments as torch tensors (and attributes) in spec order, builds torch's own objects, calls
torch's kernel and returns a torch tensor. Adapters compute nothing themselves, so the oracle
stays independent of the references in `refcore.ops`.

A fused op's oracle (``refcore.oracles:<fused op>``) is its pattern's torch functions composed,
derived from specs/fusions.yaml by `refcore.derive`.

Example:
    >>> import torch
    >>> spmm_reduce(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([2.0]),
    ...             torch.ones(1, 3), "sum")
    tensor([[2., 2., 2.]])
"""

from __future__ import annotations

import functools
import warnings
from typing import Any


def spmm_reduce(crow_indices: Any, col_indices: Any, values: Any, dense: Any,
                reduce: str = "sum") -> Any:  # fmt: skip
    """torch.sparse.mm(csr, dense, reduce) with csr = CSR(crow, col, values) of shape (rows, K)."""
    import torch

    size = (crow_indices.shape[0] - 1, dense.shape[0])
    with warnings.catch_warnings():
        # torch warns once per process that sparse CSR support is in beta; it says nothing here.
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        csr = torch.sparse_csr_tensor(
            crow_indices, col_indices, values, size=size, check_invariants=False
        )
        return torch.sparse.mm(csr, dense, reduce)


def gather_scatter(x: Any, src_index: Any, dst_index: Any, edge_weight: Any = None,
                   dim_size: int = 0, reduce: str = "sum") -> Any:  # fmt: skip
    """PyG's message passing on an edge list as PyG writes it (torch_geometric.utils.scatter):
    gather x's rows per edge, scale by the weights, scatter into zeros (sum: scatter_add_;
    mean: that divided by the edge count clamped to 1; amax / amin: scatter_reduce_ without
    self, its values spelt so torch's gradient is right, see below). bf16 is computed in
    float32 and rounded once, as the op declares."""
    import torch

    wide = x.dtype == torch.bfloat16
    xs = x.float() if wide else x
    msg = xs.index_select(0, src_index)
    if edge_weight is not None:
        msg = msg * (edge_weight.float() if wide else edge_weight).view(-1, 1)
    index = dst_index.view(-1, 1).expand_as(msg)
    out = msg.new_zeros((dim_size, x.shape[1]))
    if reduce in ("sum", "mean"):
        out.scatter_add_(0, index, msg)
        if reduce == "mean":
            count = msg.new_zeros(dim_size).scatter_add_(0, dst_index, msg.new_ones(len(msg)))
            out = out / count.clamp(min=1).view(-1, 1)
    else:
        # the values of PyG's zeros.scatter_reduce_(..., include_self=False), spelt so that
        # torch's autograd shares a tie among the messages only: torch 2.13 counts the zeros as
        # one more member of the tie where a node's extreme is 0 (a ReLU'd feature), passing
        # back 1/(k+1) of the gradient instead of 1/k
        bound = -torch.inf if reduce == "amax" else torch.inf
        out = torch.full_like(out, bound).scatter_reduce_(0, index, msg, reduce)
        has = torch.zeros(dim_size, dtype=torch.bool).index_fill_(0, dst_index, True)
        out = out.masked_fill(~has.view(-1, 1), 0.0)
    return out.to(x.dtype)


def gather_scatter_backward(grad_output: Any, x: Any, src_index: Any, dst_index: Any,
                            edge_weight: Any = None, dim_size: int = 0,
                            reduce: str = "sum") -> Any:  # fmt: skip
    """The gradient torch's autograd gives ``x`` through PyG's composition (`gather_scatter`),
    what eager training runs for it; bf16 in float32, rounded once at the end."""
    import torch

    wide = grad_output.dtype == torch.bfloat16
    g, xs = (t.detach().float() if wide else t.detach() for t in (grad_output, x))
    w = None if edge_weight is None else (edge_weight.float() if wide else edge_weight)
    with torch.enable_grad(), torch._C.DisableTorchFunction():  # never routed (see below)
        xs.requires_grad_()
        out = gather_scatter(xs, src_index, dst_index, w, dim_size, reduce)
        (grad,) = torch.autograd.grad(out, [xs], g, allow_unused=True)
    return (torch.zeros_like(xs) if grad is None else grad).to(x.dtype)


def segment_reduce(data: Any, reduce: str, *, lengths: Any = None, offsets: Any = None,
                   axis: int = 0, unsafe: bool = False, initial: Any = None) -> Any:  # fmt: skip
    """torch.segment_reduce, bf16 in float32 and rounded once, as the op declares.

    NOTE: torch 2.13's CPU kernel accumulates bf16 in bf16 (a 1000-row sum off by 3 on 44)."""
    import torch

    wide = data.dtype == torch.bfloat16
    out = torch.segment_reduce(data.float() if wide else data, reduce, lengths=lengths,
                               offsets=offsets, axis=axis, unsafe=unsafe, initial=initial)
    return out.to(data.dtype)


def index_add(input: Any, dim: int, index: Any, source: Any, *, alpha: float = 1.0) -> Any:
    """torch.index_add, bf16 in float32 and rounded once, as the op declares.

    NOTE: torch 2.13's CPU kernel adds bf16 slices one by one in bf16 (a rounding per add)."""
    import torch

    wide = input.dtype == torch.bfloat16
    if wide:
        input, source = input.float(), source.float()
    return torch.index_add(input, dim, index, source, alpha=alpha).to(
        torch.bfloat16 if wide else input.dtype)


def spmm_reduce_backward(grad_output: Any, crow_indices: Any, col_indices: Any, values: Any,
                         dense: Any, reduce: str = "sum") -> Any:  # fmt: skip
    """The gradient torch's autograd gives ``dense`` through `spmm_reduce` (torch.sparse.mm),
    what eager training runs for it; bf16 in float32, rounded once at the end.

    NOTE: torch 2.13's bf16 backward rounds g / count and every product to bf16 before summing
    (a mean's gradient off by up to 87x where terms cancel, in 3000 draws), and its amax / amin
    pick the winning nonzero among bf16-rounded products, so ties move the gradient to another
    element; bf16 products are exact in float32, where the winner is the declared one.
    """
    import torch

    wide = grad_output.dtype == torch.bfloat16
    g, v, d = (t.detach().float() if wide else t.detach() for t in (grad_output, values, dense))
    # torch's own backward, never routed (refcore.enable's mode would send the forward back to
    # the kernel this oracle is timed against)
    with torch.enable_grad(), torch._C.DisableTorchFunction():
        d.requires_grad_()
        out = spmm_reduce(crow_indices, col_indices, v, d, reduce)
        (grad,) = torch.autograd.grad(out, [d], g)
    return grad.to(dense.dtype)


def merged_embedding_bag(input: Any, weight: Any, offsets: Any, *, mode: str = "sum",
                         include_last_offset: bool = False) -> Any:  # fmt: skip
    """One F.embedding_bag per table, stacked as (bags, tables, dim), as DLRM runs its tables."""
    import torch

    bags = [
        torch.nn.functional.embedding_bag(input[t], weight[t], offsets[t], mode=mode,
                                          include_last_offset=include_last_offset)
        for t in range(weight.shape[0])
    ]  # fmt: skip
    return torch.stack(bags, dim=1)


def interaction(dense: Any, sparse: Any) -> Any:
    """DLRM's interact_features ("dot"): cat, bmm, gather of the strictly-lower triangle."""
    import torch

    z = torch.cat([dense[:, None, :], sparse], dim=1)
    gram = torch.bmm(z, z.transpose(1, 2))
    rows, cols = torch.tril_indices(z.shape[1], z.shape[1], offset=-1)
    return torch.cat([dense, gram[:, rows, cols]], dim=1)


def roi_align(input: Any, boxes: Any, output_size: Any, spatial_scale: float = 1.0,
              sampling_ratio: int = -1, aligned: bool = False) -> Any:  # fmt: skip
    """ONNX's RoiAlign (its reference implementation, onnx.reference) on float32 copies:
    torchvision's compiled ops do not load beside this CPU torch. half_pixel is aligned=True,
    output_half_pixel aligned=False; ONNX's sampling_ratio 0 is torchvision's adaptive -1.

    Differentiable in ``input`` (the backward's oracle): roi_align is linear in the map, y = A x,
    and its gradient A^T g is read off ONNX's own forward (`_roi_align_adjoint`)."""
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    model = _roi_align_model(int(oh), int(ow), float(spatial_scale), max(int(sampling_ratio), 0),
                             "half_pixel" if aligned else "output_half_pixel")  # fmt: skip
    if getattr(input, "requires_grad", False):
        return _roi_align_function().apply(input, boxes, model, float(spatial_scale))
    return _roi_align_onnx(model, input, boxes)


def _roi_align_onnx(model: Any, input: Any, boxes: Any) -> Any:
    import numpy as np
    import torch

    x = input.detach().to(torch.float32).contiguous().numpy()
    b = boxes.detach().to(torch.float32).numpy()
    feeds = {"X": x, "rois": np.ascontiguousarray(b[:, 1:]), "idx": b[:, 0].astype(np.int64)}
    (y,) = model.run(None, feeds)
    return torch.from_numpy(np.asarray(y, dtype=np.float32)).to(input.dtype)


def _roi_align_adjoint(model: Any, grad: Any, boxes: Any, shape: tuple[int, ...],
                       spatial_scale: float) -> Any:
    """A^T g for y = roi_align(x) = A x, read off ONNX's own forward: run on a basis map whose
    channel j is the one-hot image of pixel j, box k gives Y[j, p, q] = d y[k, c, p, q] /
    d x[b_k, c, j] (the same for every channel c), so dx[b_k, c, j] += sum over its bins of
    g[k, c, p, q] * Y[j, p, q]. Per box, only the pixels within 2 of the scaled box are basis
    channels (its samples and their taps lie inside it, a side of at least 1 and inverted
    corners included: a crop too small loses gradient, which the tests see). Float64 sums of
    ONNX's weights."""
    import math

    import torch

    n, c, h, w = shape
    g = grad.to(torch.float64)
    dx = torch.zeros((n, c, h, w), dtype=torch.float64)
    for k in range(boxes.shape[0]):
        bx = [float(v) * spatial_scale for v in boxes[k, 1:].tolist()]
        # the samples span [lo, max(hi, lo + 1)] whichever way round the corners are given: an
        # inverted box (x2 < x1) still samples a side of 1 from x1 (aligned=False)
        xl, xh = min(bx[0], bx[2]), max(bx[0], bx[2], bx[0] + 1.0)
        yl, yh = min(bx[1], bx[3]), max(bx[1], bx[3], bx[1] + 1.0)
        x0, x1 = max(0, math.floor(xl) - 2), min(w - 1, math.ceil(xh) + 2)
        y0, y1 = max(0, math.floor(yl) - 2), min(h - 1, math.ceil(yh) + 2)
        if x0 > x1 or y0 > y1:
            continue
        ys, xs = torch.meshgrid(torch.arange(y0, y1 + 1), torch.arange(x0, x1 + 1), indexing="ij")
        ys, xs = ys.reshape(-1), xs.reshape(-1)
        basis = torch.zeros((1, ys.numel(), h, w), dtype=torch.float32)
        basis[0, torch.arange(ys.numel()), ys, xs] = 1.0
        row = boxes[k : k + 1].detach().clone()
        row[:, 0] = 0
        a = _roi_align_onnx(model, basis, row).to(torch.float64)[0]  # (pixels, oh, ow)
        b = int(boxes[k, 0])
        dx[b, :, ys, xs] += torch.einsum("cpq,jpq->cj", g[k], a)
    return dx.to(grad.dtype)


@functools.cache
def _roi_align_function() -> Any:
    import torch

    class RoiAlignOracle(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, input: Any, boxes: Any, model: Any, scale: float) -> Any:
            ctx.model, ctx.shape, ctx.scale = model, tuple(input.shape), scale
            ctx.save_for_backward(boxes)
            return _roi_align_onnx(model, input, boxes)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple:
            (boxes,) = ctx.saved_tensors
            dx = _roi_align_adjoint(ctx.model, grad, boxes, ctx.shape, ctx.scale)
            return dx, None, None, None

    return RoiAlignOracle


@functools.lru_cache(maxsize=64)
def _roi_align_model(oh: int, ow: int, scale: float, ratio: int, mode: str) -> Any:
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node(
        "RoiAlign", ["X", "rois", "idx"], ["Y"], mode="avg", output_height=oh, output_width=ow,
        sampling_ratio=ratio, spatial_scale=scale, coordinate_transformation_mode=mode,
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "roi_align",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("idx", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]))


def woq_linear(input: Any, weight: Any, scales: Any, bias: Any = None) -> Any:
    """F.linear on the weight dequantized in fp32 (int8 * scale), summed in fp32 and rounded
    once to the input's dtype. torch._weight_int8pack_mm is torch's own kernel for this, but
    takes scales in the input's dtype (bf16 scales for a bf16 input: another weight)."""
    import torch

    if scales.dim() == 1:
        w = weight.to(torch.float32) * scales[:, None]
    else:  # per group along K
        w = weight.to(torch.float32) * scales.repeat_interleave(
            weight.shape[1] // scales.shape[1], 1
        )
    b = None if bias is None else bias.to(torch.float32)
    return torch.nn.functional.linear(input.to(torch.float32), w, b).to(input.dtype)


def woq_int4_linear(input: Any, weight: Any, scales: Any, mins: Any, bias: Any = None) -> Any:
    """F.linear on the weight unpacked (low nibble first) and dequantized in fp32 with torch ops
    (q * scale + min), summed in fp32 and rounded once to the input's dtype."""
    import torch

    n, half = weight.shape
    q = torch.stack([weight & 0x0F, weight >> 4], dim=-1).reshape(n, 2 * half)
    per = q.shape[1] // scales.shape[1] if scales.shape[1] else 1
    w = torch.addcmul(mins.repeat_interleave(per, 1), q.to(torch.float32),
                      scales.repeat_interleave(per, 1))  # fmt: skip
    b = None if bias is None else bias.to(torch.float32)
    return torch.nn.functional.linear(input.to(torch.float32), w, b).to(input.dtype)


def _decomposed() -> Any:
    """torch's quantized_decomposed ops (the pt2e flow's q/dq), registered on first import."""
    import torch
    import torch.ao.quantization.fx._decomposed  # registers the ops

    return torch.ops.quantized_decomposed


def quantize_per_tensor(input: Any, scale: float, zero_point: int, quant_min: int,
                        quant_max: int, dtype: str) -> Any:  # fmt: skip
    """torch's quantized_decomposed.quantize_per_tensor (dtype named as a string)."""
    import torch

    return _decomposed().quantize_per_tensor(input, scale, zero_point, quant_min, quant_max,
                                             getattr(torch, dtype))  # fmt: skip


def dequantize_per_tensor(input: Any, scale: float, zero_point: int, quant_min: int,
                          quant_max: int, dtype: str) -> Any:  # fmt: skip
    """torch's quantized_decomposed.dequantize_per_tensor (dtype named as a string)."""
    import torch

    return _decomposed().dequantize_per_tensor(input, scale, zero_point, quant_min, quant_max,
                                               getattr(torch, dtype))  # fmt: skip


def quantize_per_channel(input: Any, scales: Any, zero_points: Any, axis: int, quant_min: int,
                         quant_max: int, dtype: str) -> Any:  # fmt: skip
    """torch's quantized_decomposed.quantize_per_channel (dtype named as a string)."""
    import torch

    return _decomposed().quantize_per_channel(input, scales, zero_points, axis, quant_min,
                                              quant_max, getattr(torch, dtype))  # fmt: skip


def dequantize_per_channel(input: Any, scales: Any, zero_points: Any, axis: int,
                           quant_min: int, quant_max: int, dtype: str) -> Any:  # fmt: skip
    """torch's quantized_decomposed.dequantize_per_channel (dtype named as a string)."""
    import torch

    return _decomposed().dequantize_per_channel(input, scales, zero_points, axis, quant_min,
                                                quant_max, getattr(torch, dtype))  # fmt: skip


def qlinear(
    input: Any,
    input_scale: float,
    input_zero_point: int,
    weight: Any,
    weight_scales: Any,
    bias: Any = None,
) -> Any:
    """torch's own int8 linear (oneDNN, `onednn_qlinear`) where it sums this call's u8 x s8
    products exactly (`onednn_int8_exact`), else the int32 sums in float64 with torch's matmul
    (exact: every |sum| < 2^31), then the declared float32 steps."""
    import torch

    if input.numel() and weight.numel() and onednn_int8_exact(weight):
        return onednn_qlinear(input, input_scale, input_zero_point, weight, weight_scales, bias)
    acc = torch.matmul(input.to(torch.float64) - input_zero_point,
                       weight.to(torch.float64).T)  # fmt: skip
    s = torch.tensor(input_scale, dtype=torch.float32) * weight_scales.to(torch.float32)
    y = acc.to(torch.float32) * s
    return y if bias is None else y + bias.to(torch.float32)


def onednn_int8_exact(weight: Any) -> bool:
    """Whether torch's own int8 GEMM (oneDNN) sums u8 x s8 products with this weight exactly on
    this CPU: always with VNNI (vpdpbusd: 4 products into an int32 lane), else only on 7-bit
    weights (`sums_pairs_in_int16`)."""
    from refcore import cpu

    return "avx512_vnni" in cpu.detected() or sums_pairs_in_int16(weight)


def sums_pairs_in_int16(weight: Any) -> bool:
    """Whether every weight is in [-64, 64], so that any pair of u8 x s8 products is at most
    255 * 64 * 2 = 32640 in magnitude (the 7-bit weights of x86_static_int8_w7). Without VNNI
    oneDNN sums pairs with vpmaddubsw, which saturates at int16: exact on such a weight, off
    wherever a pair passes 32767 (a full-range activation and weights beyond +-64). Read once
    per weight version (`_per_weight`)."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(weight) or weight.is_meta:  # traced (a custom op's fake run): no values to read
        return False
    entry = _per_weight(weight)
    if "w7" not in entry:
        lo, hi = weight.aminmax() if weight.numel() else (0, 0)
        entry["w7"] = bool(-64 <= int(lo) and int(hi) <= 64)
    return entry["w7"]


def _per_weight(weight: Any) -> dict[Any, Any]:
    """What the oneDNN int8 adapters keep per weight tensor (its range verdict, its packed
    forms), dropped with the tensor or when it is written (its version moves), as a frozen
    graph keeps a prepacked weight per layer."""
    from torch.utils.weak import WeakIdKeyDictionary

    global _ONEDNN_PACKED
    if _ONEDNN_PACKED is None:
        _ONEDNN_PACKED = WeakIdKeyDictionary()
    version, entry = _ONEDNN_PACKED.get(weight, (None, None))
    if version != weight._version or len(entry) > _PACKS_PER_WEIGHT:
        entry = {}  # (a weight met with ever-changing input shapes keeps its latest packs only)
        _ONEDNN_PACKED[weight] = (weight._version, entry)
    return entry


def dynamic_qlinear(input: Any, weight: Any, weight_scales: Any, bias: Any = None) -> Any:
    """The declared steps with torch ops: per-row min-max (u8, float32 eps) qparams, quantize,
    the int32 sums in float64 (exact), float32 scale and bias, rounded to the input's dtype."""
    import torch

    f32 = torch.float32
    x = input.to(f32).reshape(input.shape[:-1].numel(), input.shape[-1])
    if x.shape[1]:
        lo = torch.clamp(x.amin(dim=1), max=0.0)
        hi = torch.clamp(x.amax(dim=1), min=0.0)
    else:
        lo = hi = torch.zeros(x.shape[0], dtype=f32)
    scale = torch.clamp((hi - lo) / 255.0, min=torch.finfo(f32).eps)
    zp = torch.clamp(-torch.round(lo / scale), 0, 255)
    bad = ~torch.isfinite(scale)
    scale, zp = torch.where(bad, torch.nan, scale), torch.where(bad, 0.0, zp)
    q = torch.clamp(torch.nan_to_num(torch.round(x * (1.0 / scale)[:, None]) + zp[:, None]), 0, 255)
    acc = torch.matmul(q.to(torch.float64) - zp.to(torch.float64)[:, None],
                       weight.to(torch.float64).T)  # fmt: skip
    y = acc.to(f32) * (scale[:, None] * weight_scales.to(f32)[None, :])
    if bias is not None:
        y = y + bias.to(f32)
    return y.reshape(*input.shape[:-1], weight.shape[0]).to(input.dtype)


def qconv2d(
    input: Any,
    input_scale: float,
    input_zero_point: int,
    weight: Any,
    weight_scales: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Any:
    """torch's own int8 conv (oneDNN, `onednn_qconv2d`) on a CPU without VNNI where it sums
    this call's products exactly (7-bit weights, `sums_pairs_in_int16`; integer padding, a
    non-empty call), else F.conv2d of (x - zp) and w in float64 (exact integer sums); then
    qlinear's float32 steps per output channel. (With VNNI oneDNN's conv is exact for any
    weight, but its VNNI kernels have not been through the generated suites yet: float64 there.)"""
    import torch

    from refcore import cpu

    if (not isinstance(padding, str) and input.numel() and weight.numel()
            and "avx512_vnni" not in cpu.detected() and sums_pairs_in_int16(weight)):  # fmt: skip
        return onednn_qconv2d(input, input_scale, input_zero_point, weight, weight_scales, bias,
                              stride, padding, dilation, groups)  # fmt: skip
    acc = torch.nn.functional.conv2d(input.to(torch.float64) - input_zero_point,
                                     weight.to(torch.float64), None, stride, padding, dilation,
                                     groups)  # fmt: skip
    s = torch.tensor(input_scale, dtype=torch.float32) * weight_scales.to(torch.float32)
    y = acc.to(torch.float32) * s[:, None, None]
    return y if bias is None else y + bias.to(torch.float32)[:, None, None]


def onednn_qlinear(
    input: Any,
    input_scale: float,
    input_zero_point: int,
    weight: Any,
    weight_scales: Any,
    bias: Any = None,
) -> Any:
    """torch's own int8 linear as inductor's x86 lowering calls it (oneDNN's qlinear_pointwise
    with a float32 output) on the weight prepacked by qlinear_prepack once per weight and input
    shape (as a frozen graph holds it); leading dims of input are flattened for it. The
    benchmark anchor of qlinear (specs/benchmarks.yaml), and qlinear's oracle where it is exact
    (`onednn_int8_exact`)."""
    import torch

    lead, k = input.shape[:-1], input.shape[-1]
    x = input.reshape(-1, k).contiguous()
    packs, key = _per_weight(weight), ("linear", tuple(x.shape))
    if key not in packs:
        packed = torch.ops.onednn.qlinear_prepack(weight.contiguous(), list(x.shape))
        packs[key] = (packed, torch.zeros(weight.shape[0], dtype=torch.int64))
    packed, zeros = packs[key]
    y = torch.ops.onednn.qlinear_pointwise(
        x, input_scale, input_zero_point, packed, weight_scales.contiguous(), zeros, bias,
        1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip
    return y.reshape(*lead, weight.shape[0])


def onednn_qconv2d(
    input: Any,
    input_scale: float,
    input_zero_point: int,
    weight: Any,
    weight_scales: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> Any:
    """torch's own int8 conv as inductor's x86 lowering calls it (oneDNN's qconv2d_pointwise,
    float32 output) on the weight prepacked by qconv_prepack once per weight and input shape:
    the benchmark anchor of qconv2d (specs/benchmarks.yaml), and qconv2d's oracle where it is
    exact (see `qconv2d`). Integer padding only."""
    import torch

    def pair(v: Any) -> list[int]:
        return [int(v), int(v)] if isinstance(v, int) else [int(t) for t in v]

    st, pad, dil = pair(stride), pair(padding), pair(dilation)
    packs = _per_weight(weight)
    key = ("conv", tuple(input.shape), float(input_scale), int(input_zero_point), tuple(st),
           tuple(pad), tuple(dil), int(groups),
           weight_scales.to(torch.float32).numpy().tobytes())  # fmt: skip
    if key not in packs:
        packed = torch.ops.onednn.qconv_prepack(weight, weight_scales, input_scale,
                                                input_zero_point, st, pad, dil, groups,
                                                list(input.shape))  # fmt: skip
        packs[key] = (packed, torch.zeros(weight.shape[0], dtype=torch.int64))
    packed, zeros = packs[key]
    return torch.ops.onednn.qconv2d_pointwise(
        input, input_scale, input_zero_point, packed, weight_scales, zeros, bias, st, pad, dil,
        groups, 1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip


@functools.cache
def _lamb_class() -> type:
    import torch

    class Lamb(torch.optim.Optimizer):
        """Lamb (specs/optim.yaml) in plain torch ops, per tensor: torch has no Lamb, so this is
        the oracle of the generated optimizer suite and the bench's torch anchor."""

        def __init__(self, params: Any, lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                     eps: float = 1e-6, weight_decay: float = 0.0, clamp_min: float = 0.0,
                     clamp_max: float = 10.0) -> None:  # fmt: skip
            defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            clamp_min=clamp_min, clamp_max=clamp_max)  # fmt: skip
            super().__init__(params, defaults)

        @torch.no_grad()
        def step(self, closure: Any = None) -> None:
            for group in self.param_groups:
                b1, b2 = group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    st = self.state[p]
                    if not st:
                        st["step"] = torch.tensor(0.0)
                        st["exp_avg"] = torch.zeros_like(p)
                        st["exp_avg_sq"] = torch.zeros_like(p)
                    st["step"] += 1
                    n = st["step"].item()
                    g = p.grad
                    st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                    st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                    m_hat = st["exp_avg"] / (1 - b1**n)
                    v_hat = st["exp_avg_sq"] / (1 - b2**n)
                    u = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                    w_norm, u_norm = p.norm(), u.norm()
                    phi = w_norm.clamp(group["clamp_min"], group["clamp_max"])
                    ok = (w_norm > 0) & (u_norm > 0)
                    ratio = torch.where(ok, phi / u_norm, torch.ones_like(u_norm))
                    p.sub_(group["lr"] * ratio * u)

    return Lamb


# per weight tensor (weakly held): its version and what `_per_weight` keeps for it, at most
# _PACKS_PER_WEIGHT entries (a packed form per input shape, plus the range verdict)
_ONEDNN_PACKED: Any = None
_PACKS_PER_WEIGHT = 8


def __getattr__(name: str) -> Any:
    """``Lamb`` (a torch.optim.Optimizer, made on first use: no torch import here), or the
    derived torch oracle of fused op ``name`` (`refcore.derive.oracle`)."""
    if name == "Lamb":
        return _lamb_class()
    from refcore import derive

    return derive.lookup(name, "oracle")
