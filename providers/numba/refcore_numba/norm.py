"""Numba kernels for the norm family (specs/norm.yaml): layer_norm, rms_norm, batch_norm.

Precision: statistics are reduced in fp32 (bf16 widened exactly), as torch's CPU kernels do;
layer_norm takes two passes over a row that is already in cache (mean, then the centred sum of
squares), so its variance does not suffer the cancellation of a one-pass sum/sum-of-squares; a row
whose max |x| would overflow fp32 squares (or make them denormal) is scaled by a power of two
first (`_norm_scale`, as the native kernels' rc_norm_row.h).
Each output is formed in fp32 and rounded once (RNE) to the output dtype.

Layout: layer_norm / rms_norm read the input as a (rows, normalized size) view and batch_norm as an
(N, C, spatial) view, with any strides; an input that cannot be viewed so without a copy is
declined with a reason. Contiguous rows are the fast path. batch_norm runs channel planes (NCHW)
with scalar parameters, or, when the channels are innermost in memory (channels-last, or an (N, C)
input) and the whole input is one uniformly strided run, one flat pass against parameters tiled
to the chunk length; its output keeps the input's memory order, as torch's does.
Parameters of length D or C (weight, bias, running statistics) are small: a non-contiguous one is
copied, a missing weight or bias becomes ones or zeros.

Fast-math: only ``reassoc`` and ``contract`` (reductions may vectorize, products fuse into FMAs);
no flag that assumes finite values, so inf and NaN propagate as in the reference.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types
from numba.extending import overload

from refcore import buffers
from refcore.call import Call
from refcore.provider import YES, Kernel, Verdict, no
from refcore.tensors import fp32_scalar
from refcore_numba._runtime import as_bits, bf16_to_f32, f32_to_bf16, sync_threads

BOTH = frozenset({"float32", "bfloat16"})
FASTMATH = {"reassoc", "contract"}
#: Below this many elements a parallel region's launch (~12 us) costs more than it saves.
PARALLEL_MIN = 1 << 16
#: Channels-last batch_norm tiles its parameters to >= this many elements (whole pixels): long
#: enough to amortise a chunk's loop setup, short enough that three tiled parameter arrays and
#: the streamed input stay in L1 (measured: 512 beats 2048 by ~20% on 32x256x28x28).
_CHUNK = 512


def _ld(x):  # replaced inside numba by the overload below
    raise NotImplementedError


@overload(_ld, inline="always")
def _ld_impl(x):
    """An element as fp32: bf16 bits (uint16) widened exactly, float32 as is."""
    if x == types.uint16:
        return lambda x: bf16_to_f32(x)
    return lambda x: np.float32(x)


def _st(v, like):  # replaced inside numba by the overload below
    raise NotImplementedError


@overload(_st, inline="always")
def _st_impl(v, like):
    """An fp32 value in the element type of array ``like``: bf16 bits rounded RNE, or float32."""
    if like.dtype == types.uint16:
        return lambda v, like: f32_to_bf16(v)
    return lambda v, like: np.float32(v)


# ---------------------------------------------------------------------------------------------
# views and parameters


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped to ``shape`` without a copy (any strides), or None when that needs a copy."""
    v = a.view()
    try:
        v.shape = shape
    except AttributeError:  # numpy's "incompatible shape for in-place modification"
        return None
    return v


def _param(t: np.ndarray | None, n: int, like: np.ndarray, fill: float) -> np.ndarray:
    """A contiguous length-``n`` parameter in ``like``'s bit dtype (ones/zeros when missing)."""
    if t is None:
        return as_bits(np.full(n, fill, like.dtype))
    return as_bits(np.ascontiguousarray(t)).reshape(n)


def _parallel(rows: int, size: int) -> bool:
    return rows > 1 and size >= PARALLEL_MIN


# ---------------------------------------------------------------------------------------------
# layer_norm, rms_norm: one row of D elements per iteration


@numba.njit(inline="always")
def _norm_scale(amax):
    """The power of two s that the row statistics scale x by (1 for most rows).

    fp32 squares overflow for |x| ~ 1e20 (layer_norm returned zeros there) and go denormal or 0
    for tiny |x|; a row whose max |x| is outside [2**-30, 2**40] is scaled so that its max |x| is
    in [0.5, 1), and var + eps becomes var * s**2 + eps * s**2, exact wherever representable.
    """
    if (amax >= 2.0**-30 and amax <= 2.0**40) or amax == 0.0 or not amax <= 3.4028234663852886e38:
        return np.float32(1.0)
    e = min(max(math.frexp(amax)[1], -126), 126)  # s = 2**-e stays a normal fp32
    return np.float32(math.ldexp(1.0, -e))


@numba.njit(inline="always")
def _norm_rstd(ms, eps, s):
    """1 / sqrt(ms / s**2 + eps), times 1 / s (the scaled row's reciprocal std); FLT_MAX where it
    is finite but past FLT_MAX: a constant row (every x*s - mean exactly 0) with eps * s**2 below
    1e-77, whose reference output 0 / sqrt(eps) = 0 was 0 * inf = NaN (found by refcore.fuzz);
    inf (eps = 0: 0 / 0) stays inf."""
    sd = np.float64(s)
    r = 1.0 / math.sqrt(np.float64(ms) + eps * (sd * sd))
    return (
        np.float32(3.4028234663852886e38) if 3.4028234663852886e38 < r < math.inf else np.float32(r)
    )


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _row_sum(x, i, s):
    """Sum of x[i, :] * s in fp32 and max |x[i, :]|."""
    t = np.float32(0.0)
    m = np.float32(0.0)
    for j in range(x.shape[1]):
        v = _ld(x[i, j])
        t += v * s
        m = max(m, abs(v))
    return t, m


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _layer_norm_rest(x, i, w, b, eps, out, o, total, amax):
    """layer_norm of row i of x into row o of out, given the row's plain sum and max |x|."""
    d = x.shape[1]
    s = _norm_scale(amax)
    if s != 1.0:
        total = _row_sum_exact(x, i, s)
    mean = total / np.float32(d)
    ss = np.float32(0.0)
    for j in range(d):
        c = _ld(x[i, j]) * s - mean
        ss += c * c
    var = ss / np.float32(d)
    if var <= mean * mean * np.float32(2.0**-30):  # a (nearly) constant row: see _row_csum
        dm = _row_csum(x, i, s, mean) / np.float32(d)
        mean += dm
        var = max(var - dm * dm, np.float32(0.0))
    _ln_affine(x, i, w, b, out, o, s, mean, _norm_rstd(var, eps, s))


@numba.njit(error_model="numpy")
def _row_sum_exact(x, i, s):
    """Sum of x*s over a scaled row (s != 1), compensated (Neumaier) in float64, as the native
    kernels' rc_row_sum_exact: such a row may hold +-3e38 beside values near 1, whose plain sum
    loses the small terms that the cancelling large ones leave as the whole mean (found by
    refcore.fuzz). No fastmath: reassociation would cancel the compensation away; only rare
    rows pay this pass."""
    t = 0.0
    c = 0.0
    for j in range(x.shape[1]):
        v = np.float64(_ld(x[i, j])) * np.float64(s)
        u = t + v
        c += (t - u) + v if abs(t) >= abs(v) else (v - u) + t
        t = u
    return np.float32(t + c)


@numba.njit(fastmath={"contract"}, error_model="numpy")
def _row_csum(x, i, s, c):
    """Sum of x*s - c over row i: the mean's own rounding, which the corrected two-pass variance
    adds back (mean += csum / d, var -= (csum / d)**2). The fp32 mean of d equal values can be an
    ulp off, x - mean an ulp rather than 0, and with eps = 0 (or eps * s**2 tiny for a huge row)
    that ulp came out as +-1 where the reference gives NaN (0 / 0) or 0 (found by refcore.fuzz:
    a stride-0 row). No reassoc (it would turn this into sum(x*s) - d*c) and not inlined; only
    rows whose spread is below 2**-15 of their mean pay this pass."""
    t = np.float32(0.0)
    for j in range(x.shape[1]):
        t += _ld(x[i, j]) * s - c
    return t


# The affine steps keep their order: no "reassoc" (LLVM may otherwise hoist s * rstd or rstd * w
# out of the loop, which overflows where the result is finite: rms_norm of a row of -1e-45 gave
# -inf, as x * (s * rstd) with s = 2**126; found by refcore.fuzz). Not inlined, so that the
# caller's reassoc flags do not reach these instructions.
@numba.njit(fastmath={"contract"}, error_model="numpy")
def _ln_affine(x, i, w, b, out, o, s, mean, rstd):
    for j in range(x.shape[1]):
        # ((x - mean) * rstd) * w + b: no cancellation on a constant row (see specs/norm.yaml);
        # rstd * w first overflowed for a huge w where the result is finite (found by the fuzzer)
        out[o, j] = _st((_ld(x[i, j]) * s - mean) * rstd * _ld(w[j]) + _ld(b[j]), out)


@numba.njit(fastmath={"contract"}, error_model="numpy")
def _rms_affine(x, w, out, i, s, rstd):
    for j in range(x.shape[1]):
        out[i, j] = _st(_ld(x[i, j]) * s * rstd * _ld(w[j]), out)  # not rstd * w: see above


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _layer_norm_row(x, w, b, eps, out, i):
    total, amax = _row_sum(x, i, np.float32(1.0))
    _layer_norm_rest(x, i, w, b, eps, out, i, total, amax)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _layer_norm_par(x, w, b, eps, out):
    for i in numba.prange(x.shape[0]):
        _layer_norm_row(x, w, b, eps, out, i)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _layer_norm_ser(x, w, b, eps, out):
    for i in range(x.shape[0]):
        _layer_norm_row(x, w, b, eps, out, i)


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _row_sumsq(x, i, s):
    """Sum of (x[i, :] * s)**2 in fp32 and max |x[i, :]|."""
    t = np.float32(0.0)
    m = np.float32(0.0)
    for j in range(x.shape[1]):
        v = _ld(x[i, j])
        t += (v * s) * (v * s)
        m = max(m, abs(v))
    return t, m


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _rms_norm_row(x, w, eps, out, i):
    d = x.shape[1]
    ss, amax = _row_sumsq(x, i, np.float32(1.0))
    s = _norm_scale(amax)
    if s != 1.0:
        ss = _row_sumsq(x, i, s)[0]
    _rms_affine(x, w, out, i, s, _norm_rstd(ss / np.float32(d), eps, s))


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _rms_norm_par(x, w, eps, out):
    for i in numba.prange(x.shape[0]):
        _rms_norm_row(x, w, eps, out, i)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _rms_norm_ser(x, w, eps, out):
    for i in range(x.shape[0]):
        _rms_norm_row(x, w, eps, out, i)


def _rows(input: np.ndarray, normalized_shape) -> np.ndarray | None:
    d = math.prod(normalized_shape)
    if not d:
        return None
    x = as_bits(input)
    return x.reshape(-1, d) if x.flags.c_contiguous else _view(x, (x.size // d, d))


def _rows_rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    if x.size and _rows(x, call.arguments["normalized_shape"]) is None:
        return no(
            f"input (shape {x.shape}, strides {x.strides}) cannot be viewed as rows of the "
            "normalized dims without a copy"
        )
    return YES


def layer_norm(
    input: np.ndarray,
    normalized_shape: tuple[int, ...],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    sync_threads()
    out = buffers.empty(input.shape, input.dtype)
    if out.size == 0:
        return out
    x = _rows(input, normalized_shape)
    m, d = x.shape
    w = _param(weight, d, input, 1.0)
    b = _param(bias, d, input, 0.0)
    kernel = _layer_norm_par if _parallel(m, x.size) else _layer_norm_ser
    kernel(x, w, b, fp32_scalar(eps), as_bits(out).reshape(m, d))
    return out


def rms_norm(
    input: np.ndarray,
    normalized_shape: tuple[int, ...],
    weight: np.ndarray | None = None,
    eps: float | None = None,
) -> np.ndarray:
    sync_threads()
    out = buffers.empty(input.shape, input.dtype)
    if out.size == 0:
        return out
    if eps is None:  # torch's compute type is fp32 for float32 and bf16 inputs alike
        eps = float(np.finfo(np.float32).eps)
    x = _rows(input, normalized_shape)
    m, d = x.shape
    w = _param(weight, d, input, 1.0)
    kernel = _rms_norm_par if _parallel(m, x.size) else _rms_norm_ser
    kernel(x, w, fp32_scalar(eps), as_bits(out).reshape(m, d))
    return out


# ---------------------------------------------------------------------------------------------
# batch_norm (inference): y = (x - mean[c]) * scale[c] + bias[c], scale = weight / sqrt(var + eps)


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _batch_norm_plane(x, mean, scale, bias, out, r):
    """Plane r of x, out (A, C, S): all S values of one (a, c), with scalar parameters."""
    a, c = divmod(np.int64(r), x.shape[1])  # prange's index may be unsigned: keep int64 math
    mu, k, b = mean[c], scale[c], bias[c]
    for s in range(x.shape[2]):
        out[a, c, s] = _st((_ld(x[a, c, s]) - mu) * k + b, out)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _batch_norm_planes_par(x, mean, scale, bias, out):
    for r in numba.prange(x.shape[0] * x.shape[1]):
        _batch_norm_plane(x, mean, scale, bias, out, r)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _batch_norm_planes_ser(x, mean, scale, bias, out):
    for r in range(x.shape[0] * x.shape[1]):
        _batch_norm_plane(x, mean, scale, bias, out, r)


@numba.njit(inline="always", fastmath=FASTMATH, error_model="numpy")
def _batch_norm_chunk(x, mean, scale, bias, out, t):
    """Chunk t of flat channels-last x, out; the parameters are tiled to the chunk length, a
    multiple of C, so element j of every chunk has channel j % C."""
    n = mean.size
    start = np.int64(t) * n
    xs, os = x[start : start + n], out[start : start + n]  # j >= 0 below: no wraparound gathers
    for j in range(xs.size):
        os[j] = _st((_ld(xs[j]) - mean[j]) * scale[j] + bias[j], os)


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH, error_model="numpy")
def _batch_norm_flat_par(x, mean, scale, bias, out):
    for t in numba.prange((x.size + mean.size - 1) // mean.size):
        _batch_norm_chunk(x, mean, scale, bias, out, t)


@numba.njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def _batch_norm_flat_ser(x, mean, scale, bias, out):
    for t in range((x.size + mean.size - 1) // mean.size):
        _batch_norm_chunk(x, mean, scale, bias, out, t)


def _nc_s(input: np.ndarray) -> np.ndarray | None:
    """The input as an (N, C, S) view (S = the spatial dims merged; 1 for an (N, C) input)."""
    n, c = input.shape[:2]
    return _view(as_bits(input), (n, c, math.prod(input.shape[2:])))


def _batch_norm_rule(call: Call) -> Verdict:
    x = call.arguments["input"]
    if x.size and _nc_s(x) is None:
        return no(
            f"input (shape {x.shape}, strides {x.strides}) cannot be viewed as (N, C, spatial) "
            "without a copy"
        )
    return YES


def _channel_params(running_mean, running_var, weight, bias, eps) -> tuple[np.ndarray, ...]:
    """fp32 mean, scale and bias per channel (O(C) work, float64 for the scale), and the channels
    whose scale weight / sqrt(var + eps) is finite but not a normal fp32 (it overflows, as for a
    weight of 3e38 and var 0.06, underflows to a denormal, or is 0), or whose mean or bias is
    near the fp32 limit: `_exact_channels` does them."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = 1.0 / np.sqrt(running_var.astype(np.float64) + eps)
        if weight is not None:
            scale = scale * weight.astype(np.float64)
        s32 = scale.astype(np.float32)
    a = np.abs(scale)
    # a zero scale too (weight 0, or rstd 0 for an eps past FLT_MAX): the reference's
    # (x - mean) * 0 is 0 where fp32's x - mean overflows to inf and gives NaN (found by the fuzzer)
    bad = np.isfinite(scale) & ((a > np.finfo(np.float32).max) | (a < 2.0**-126))
    # a mean or bias of 2^100 or more: fp32's x - mean (or (x - mean) * scale before the bias is
    # added) can overflow where the result is finite (found by refcore.fuzz: x 2.3e38, mean
    # -2.8e38, var 3.4 gave inf where the reference and torch give 2.8e38). Below 2^100 an fp32
    # overflow of those steps means a result past FLT_MAX, as the reference's.
    big = 2.0**100
    mean64 = running_mean.astype(np.float64)
    bad |= np.isfinite(mean64) & (np.abs(mean64) >= big)
    if bias is not None:
        bias64 = bias.astype(np.float64)
        bad |= np.isfinite(bias64) & (np.abs(bias64) >= big)
    f32 = np.float32
    bias = np.zeros(len(scale), f32) if bias is None else bias.astype(f32)
    return running_mean.astype(f32), s32, bias, bad


def _exact_channels(input, running_mean, running_var, weight, bias, eps, out, bad) -> None:
    """Channels ``bad`` of ``out`` from the reference's float64 formula: their fp32 scale
    overflowed to inf (or underflowed) where the output is finite (found by refcore.fuzz: a
    weight of 3e38 gave inf, the reference 6.2e37). O(N * S) per such channel, rare."""
    from refcore.ops.norm import batch_norm as reference

    def sub(t):
        return None if t is None else t[bad]

    mv = (running_mean[bad], running_var[bad])
    out[:, bad] = reference(input[:, bad], *mv, sub(weight), sub(bias), False, 0.1, eps)


def batch_norm(
    input: np.ndarray,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> np.ndarray:
    del training, momentum  # inference only (spec choices): nothing is updated
    sync_threads()
    if input.size == 0:
        return np.empty(input.shape, input.dtype)
    x = _nc_s(input)
    *params, bad = _channel_params(running_mean, running_var, weight, bias, fp32_scalar(eps))
    n, c, s = x.shape
    channels_inner = s == 1 or abs(x.strides[1]) < abs(x.strides[2])
    flat = _view(x.transpose(0, 2, 1), (n * s * c,)) if channels_inner else None
    if flat is not None:
        # channels-last memory (or an (N, C) input): one flat pass, output in the same order
        mem = buffers.empty((n, *input.shape[2:], c), input.dtype)
        reps = -(-_CHUNK // c)  # parameters tiled so that a chunk holds whole pixels
        tiled = [np.tile(p, reps) for p in params]
        parallel = flat.size > tiled[0].size and flat.size >= PARALLEL_MIN
        kernel = _batch_norm_flat_par if parallel else _batch_norm_flat_ser
        kernel(flat, *tiled, as_bits(mem).reshape(-1))
        out = np.moveaxis(mem, -1, 1)
    else:
        out = buffers.empty(input.shape, input.dtype)
        kernel = _batch_norm_planes_par if _parallel(n * c, x.size) else _batch_norm_planes_ser
        kernel(x, *params, as_bits(out).reshape(n, c, s))
    if bad.any():
        _exact_channels(input, running_mean, running_var, weight, bias, eps, out, bad)
    return out


KERNELS = (
    Kernel(op="layer_norm", name="layer_norm", fn=layer_norm, dtypes=BOTH, rule=_rows_rule),
    Kernel(op="rms_norm", name="rms_norm", fn=rms_norm, dtypes=BOTH, rule=_rows_rule),
    Kernel(op="batch_norm", name="batch_norm", fn=batch_norm, dtypes=BOTH, rule=_batch_norm_rule),
)
