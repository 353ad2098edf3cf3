"""Native kernels for the attention family (specs/attention.yaml): scaled_dot_product_attention.

C: ``csrc/attention_<level>.c``. A flash-attention forward: per (batch*head, block of queries),
the keys are visited in blocks with an online softmax (running max and sum, the output rescaled
when the max grows), so the (L, S) score matrix never exists. Causal calls skip the key blocks
above the diagonal. Scores, probabilities and the output accumulate in fp32 and the output is
rounded once (the reference's policy; torch's bf16 rounding of the probabilities is not
mirrored).

AVX2 (csrc/attention_avx2.c, rc_attn_avx2.h): the same flash scheme on 8 lanes, and its own
decode path for L <= 4; its rule declines fp32 decode calls, measured no faster than torch on
AMD EPYC Zen 3 (see AVX2_F32_DECODE_MAX_WORK for the measurements).

Decode (L <= 2 query rows, csrc/rc_attn_decode.h): no packing; keys and values are read in
place like a GEMV (16 keys per pass, vdpbf16ps for bf16 scores where the level has it), a
two-pass softmax per row, and with fewer rows than 2 per thread each head's keys split over the
threads, the partials merged (flash-decoding).

Layout: any strides. Query, key, value and the mask (broadcast to (..., L, S) as a stride-0 view,
never copied) reach C as a base pointer, one element offset per batch index and the strides of
the last two dims; the kernels pack what they read (keys transposed, values, query blocks) into
fp32 or bf16 tile layouts per head, so a transposed head layout from a model costs nothing extra.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from refcore import buffers, cpu
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore.tensors import dtype_name
from refcore_native import _build
from refcore_native import _runtime as rt

OP = "scaled_dot_product_attention"
#: (ISA level, dtypes): AMX (bf16 tiles) is bf16 only; its fp32 calls go to the avx512 kernel.
VARIANTS = rt.variants("attention", (*rt.VARIANTS, ("amx", frozenset({"bfloat16"}))))
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2


def _batch_offsets(batch: tuple[int, ...], strides: np.ndarray) -> np.ndarray:
    """Element offsets (5, prod(batch)) of each batch index (row-major) for each tensor's batch
    strides (a (5, len(batch)) array: query, key, value, mask, out), in one product."""
    if not batch:
        return np.zeros((5, 1), np.int64)
    idx = np.indices(batch, dtype=np.int64).reshape(len(batch), -1)
    return strides @ idx


@functools.lru_cache(maxsize=256)
def _layout(batch: tuple[int, ...], itemsize: int, strides: tuple[tuple[int, ...], ...]) -> tuple:
    """(offs, st) int64 arrays of attention.h for batch dims ``batch`` and the byte strides of
    query, key, value, the mask (zeros when absent) and the output, all of ``itemsize`` bytes (a
    bool mask is read as bytes: its strides are scaled). Cached: a decode loop calls with one
    layout per token (building them cost ~8 us of a ~25 us call)."""
    es = np.array(strides, np.int64)
    for name, row in zip(("query", "key", "value", "attn_mask", "out"), es):
        if np.any(row % itemsize):
            rt.fail(OP, name, "strides that are multiples of the element size", tuple(row))
    es //= itemsize
    nd = len(batch)
    offs = np.ascontiguousarray(_batch_offsets(batch, es[:, :nd]))
    st = np.ascontiguousarray(es[:, nd:].reshape(-1))
    offs.flags.writeable = st.flags.writeable = False
    return offs, st


def _check(query, key, value, attn_mask, dropout_p, is_causal, names):
    dt = rt.float_dtype(OP, "query", query, names)
    for name, t in (("key", key), ("value", value)):
        if not isinstance(t, np.ndarray) or t.dtype != dt:
            got = dtype_name(t) if isinstance(t, np.ndarray) else type(t).__name__
            rt.fail(OP, name, f"dtype {dtype_name(dt)} (query's)", got, TypeError)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim < 2:
            rt.fail(OP, name, "a 2-D or more tensor (..., seq, features)", t.shape)
    batch = query.shape[:-2]
    for name, t in (("key", key), ("value", value)):
        if t.shape[:-2] != batch:
            rt.fail(OP, name, f"batch dims {batch} (those of query)", f"shape {t.shape}")
    if key.shape[-1] != query.shape[-1]:
        rt.fail(OP, "key", f"last dim {query.shape[-1]} (query's)", f"shape {key.shape}")
    if value.shape[-2] != key.shape[-2]:
        rt.fail(OP, "value", f"dim -2 of size {key.shape[-2]} (key's)", f"shape {value.shape}")
    if dropout_p != 0.0:
        rt.fail(OP, "dropout_p", "0.0 (inference kernel)", dropout_p)
    if attn_mask is None:
        return dt
    if not isinstance(attn_mask, np.ndarray) or attn_mask.dtype not in (np.dtype(bool), dt):
        got = dtype_name(attn_mask) if isinstance(attn_mask, np.ndarray) else type(attn_mask)
        rt.fail(OP, "attn_mask", f"dtype bool or {dtype_name(dt)}", got, TypeError)
    if is_causal:
        rt.fail(OP, "attn_mask", "None when is_causal=True", f"shape {attn_mask.shape}")
    target = (*batch, query.shape[-2], key.shape[-2])
    try:
        ok = np.broadcast_shapes(attn_mask.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        rt.fail(OP, "attn_mask", f"a shape broadcastable to {target}", attn_mask.shape)
    return dt


def _output(query: np.ndarray, ev: int, dt: np.dtype) -> np.ndarray:
    """The output (*batch, L, Ev), in query's memory order when query's rows interleave its
    heads: for q of shape (B, H, L, E) over (B, L, H, E) memory (a projection split into heads,
    as transformers does it) the output is (B, L, H, Ev) memory, so the usual
    ``out.transpose(1, 2).reshape(B, L, H * Ev)`` after it needs no copy. torch's CPU flash
    attention returns the same layout."""
    batch, L = query.shape[:-2], query.shape[-2]
    if len(batch) == 2 and L > 1 and query.strides[1] < query.strides[2]:
        return buffers.empty((batch[0], L, batch[1], ev), dt).transpose(0, 2, 1, 3)
    return buffers.empty((*batch, L, ev), dt)


#: AVX2, AMD EPYC Zen 3, 2 threads, interleaved paired medians, ours/torch (ranges over runs
#: at machine loads from ~4 to ~8 on the 2 cores; the low ends from the busiest runs):
#: B1 H12 L512 D64 full fp32 0.80-1.12x, bf16 0.84-1.20x (1.01-1.20x at load ~4); causal fp32
#: 1.22-1.95x, bf16 1.15-2.07x (blocks above the diagonal skipped, torch computes them); MiniLM
#: B8 H12 L128 D32 + (8,1,1,128) float mask fp32 0.81-1.36x (1.19-1.36x at load ~4), bf16
#: 0.99-1.45x; decode B1 H12 L1 S512 D64 fp32 0.57-0.98x, bf16 2.3-3.3x.
#: fp32 decode calls (L <= 4) of at least this many multiply-adds nb * L * S * (E + Ev) are
#: declined: parity at best against torch's fp32 path. Smaller calls are not declined here (the
#: generic suite's samples must run), though torch's smaller fixed cost wins there (fp32 0.39x
#: at B1 H1 L1 S8 D8): a per-shape choice for the router.
AVX2_F32_DECODE_MAX_WORK = 1 << 18


def _rule(call: Call) -> Verdict:
    a = call.arguments
    batch = a["query"].shape[:-2]
    for name in ("key", "value"):
        if a[name].shape[:-2] != batch:  # the spec broadcasts them (as torch); C reads one batch
            return no(f"{name} batch dims {a[name].shape[:-2]} differ from query's {batch} "
                      "(broadcast); the kernel takes equal batch dims")  # fmt: skip
    scale = a["scale"]
    if scale is not None and not math.isfinite(scale):
        return no(f"scale={scale}: the kernel folds the scale into fp32 scores; finite only")
    return YES


def _rule_avx2(call: Call) -> Verdict:
    verdict = _rule(call)
    if not verdict:
        return verdict
    a = call.arguments
    q, k, v = a["query"], a["key"], a["value"]
    work = math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if call.dtype == "float32" and q.shape[-2] <= 4 and work >= AVX2_F32_DECODE_MAX_WORK:
        return no(f"fp32 decode (L <= 4), {work} multiply-adds: torch measured as fast or faster "
                  "on AVX2 (AMD EPYC Zen 3, 2 threads: 0.57-0.98x at B1 H12 L1 S512)")  # fmt: skip
    return YES


def _sdpa(level: str, dtypes: frozenset[str]) -> Callable[..., np.ndarray]:
    names = rt.symbols(OP, level, dtypes)

    def scaled_dot_product_attention(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        attn_mask: np.ndarray | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        scale: float | None = None,
    ) -> np.ndarray:
        dt = _check(query, key, value, attn_mask, dropout_p, is_causal, names)
        # C reads typed elements: an unaligned array (``frombuffer(offset=1)``), which any-strides
        # kernels accept, is copied to aligned memory first (a misaligned load is undefined
        # behaviour, and UBSan aborts on it in the sanitized build)
        query, key, value = (a if a.flags.aligned else a.copy() for a in (query, key, value))
        if attn_mask is not None and not attn_mask.flags.aligned:
            attn_mask = attn_mask.copy()
        batch = query.shape[:-2]
        (L, E), S, Ev = query.shape[-2:], key.shape[-2], value.shape[-1]
        if L * Ev * math.prod(batch) == 0 or S == 0:  # nothing to attend: 0, as the reference
            return np.zeros((*batch, L, Ev), dt)
        out = _output(query, Ev, dt)
        if scale is None:
            scale = 1.0 / math.sqrt(E) if E else 1.0
        if not math.isfinite(scale):
            rt.fail(OP, "scale", "a finite value", scale)  # see _rule
        arrays = [query, key, value]
        kind = MASK_NONE
        if attn_mask is not None:
            kind = MASK_BOOL if attn_mask.dtype == np.dtype(bool) else MASK_FLOAT
            m = np.broadcast_to(attn_mask, (*batch, L, S))  # a stride-0 view, no copy
            arrays.append(m.view(np.uint8) if kind == MASK_BOOL else m)
        strides = [a.strides for a in arrays]
        if kind == MASK_BOOL:  # bytes, read as elements of the data's size: scale the strides
            strides[3] = tuple(s * dt.itemsize for s in strides[3])
        elif kind == MASK_NONE:
            strides.append((0,) * (len(batch) + 2))
        strides.append(out.strides)
        offs, st = _layout(batch, dt.itemsize, tuple(strides))
        lib = _build.library()
        c = rt.c_function(names[dt])
        # every array, the output too (a dense block, possibly in (B, L, H, Ev) order), by address
        ptr = [lib.ffi.cast("void *", a.__array_interface__["data"][0]) for a in (*arrays, out)]
        mask = ptr[3] if kind != MASK_NONE else c.null
        nbytes = sum(a.nbytes for a in arrays[:3]) + out.nbytes
        rc = c.fn(ptr[0], ptr[1], ptr[2], mask, ptr[-1], c.ptr(offs), c.ptr(st), offs.shape[1],
             L, S, E, Ev, kind, int(bool(is_causal)), float(scale), rt.threads(nbytes))  # fmt: skip
        if rc != 0:
            raise MemoryError(f"{OP} (native): no memory for the kernel's scratch buffers")
        return out

    return scaled_dot_product_attention


def kernels() -> tuple[Kernel, ...]:
    """One kernel per ISA-level variant the CPU (and REFCORE_CPU_CAPABILITY) allows."""
    return tuple(
        Kernel(op=OP, name=f"{OP}_{lvl}", fn=_sdpa(lvl, dts), dtypes=dts, isa=lvl,
               priority=rt.priority(lvl), rule=_rule_avx2 if lvl == "avx2" else _rule)
        for lvl, dts in VARIANTS if cpu.has(lvl)
    )  # fmt: skip
