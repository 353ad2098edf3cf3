"""Observers: how calibration turns the values an activation took into its (scale, zero point).

A static scheme's ``activation.observer`` (specs/schemes.yaml) names one of these; each is a
reference, tested against the torch observer it follows (tests/test_int8.py):

- `MINMAX`: the range of every value seen (torch's ``MinMaxObserver``);
- `MOVING_AVERAGE`: the range as a moving average of each batch's, constant 0.01 (torch's
  ``MovingAverageMinMaxObserver``): outliers of a single batch move it little;
- `HISTOGRAM`: a 2048-bin histogram of the values seen, then the range that minimises the L2
  error of quantizing them to 256 levels (torch's ``HistogramObserver``, after caffe2's
  NormMinimization): it clips the tails a min-max range would stretch to.

An observer folds each calibration tensor into its state (``observe(state, x) -> state``, from
``None``) and gives the quantization parameters from the state (``qparams(state, quant_min,
quant_max, symmetric, eps)``, the arithmetic of `refcore.ops.int8.minmax_qparams` on the range
it settled on). The arithmetic is torch's, step for step in float32 where torch computes in
float32, so the parameters agree with torch's.

Example:
    >>> import numpy as np
    >>> state = MINMAX.observe(None, np.float32([-1.0, 3.0]))
    >>> MINMAX.qparams(state, 0, 255, False, 2.0**-23)
    (0.01568627543747425, 64)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from refcore.ops.int8 import minmax_qparams

f32 = np.float32


@dataclass(frozen=True)
class Observer:
    """A calibration rule: ``observe`` folds a tensor's values into the state, ``qparams``
    gives (scale, zero_point) from it."""

    name: str
    observe: Callable[[Any, np.ndarray], Any]
    qparams: Callable[..., tuple[float, int]]


def _finite(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).reshape(-1)


def _minmax_observe(state: tuple[float, float] | None, x: np.ndarray) -> tuple[float, float]:
    x = _finite(x)
    if not x.size:
        return state  # type: ignore[return-value]
    lo, hi = f32(x.min()), f32(x.max())
    return (lo, hi) if state is None else (min(state[0], lo), max(state[1], hi))


def _range_qparams(state: tuple[float, float], quant_min: int, quant_max: int, symmetric: bool,
                   eps: float) -> tuple[float, int]:  # fmt: skip
    return minmax_qparams(float(state[0]), float(state[1]), quant_min, quant_max, symmetric, eps)


MINMAX = Observer("minmax", _minmax_observe, _range_qparams)

#: MovingAverageMinMaxObserver's default averaging constant
AVERAGING = f32(0.01)


def _moving_observe(state: tuple[float, float] | None, x: np.ndarray) -> tuple[float, float]:
    x = _finite(x)
    if not x.size:
        return state  # type: ignore[return-value]
    lo, hi = f32(x.min()), f32(x.max())
    if state is None:
        return lo, hi
    a, b = f32(state[0]), f32(state[1])
    return f32(a + AVERAGING * f32(lo - a)), f32(b + AVERAGING * f32(hi - b))


MOVING_AVERAGE = Observer("moving_average", _moving_observe, _range_qparams)

BINS = 2048  # HistogramObserver's default
DST_BINS = 256  # the levels of an 8-bit range
UPSAMPLE = 16  # how finely an old histogram is spread over a wider range


@dataclass(frozen=True)
class _Hist:
    hist: np.ndarray  # float32 (BINS,)
    lo: np.float32
    hi: np.float32


def _histc(x: np.ndarray, lo: np.float32, hi: np.float32) -> np.ndarray:
    """torch.histc(x, BINS, lo, hi) in float32: bin (x - lo) * BINS / (hi - lo), truncated; the
    top edge in the last bin; values outside [lo, hi] dropped."""
    if lo == hi:  # torch widens an empty range by one on each side
        lo, hi = f32(lo - 1), f32(hi + 1)
    x = x[(x >= lo) & (x <= hi)]
    pos = ((x - lo) * f32(BINS) / f32(hi - lo)).astype(np.int64)
    pos = np.minimum(pos, BINS - 1)
    return np.bincount(pos, minlength=BINS).astype(np.float32)


def _linspace(start: np.float32, end: np.float32, steps: int) -> np.ndarray:
    """torch.linspace in float32: start + step * i for the first half, end - step * (steps - 1 -
    i) for the rest."""
    step = f32(f32(end - start) / f32(steps - 1))
    i = np.arange(steps)
    half = steps // 2
    lo = start + step * i[:half].astype(np.float32)
    hi = end - step * (steps - 1 - i[half:]).astype(np.float32)
    return np.concatenate([lo, hi]).astype(np.float32)


def _upscale(h: _Hist, lo: np.float32, hi: np.float32) -> np.ndarray:
    """The old histogram in the new range [lo, hi]: each old bin split in UPSAMPLE parts, each
    part's count put in the new bin holding its midpoint."""
    fine = np.repeat(h.hist, UPSAMPLE) / f32(UPSAMPLE)
    size = f32(f32(h.hi - h.lo) / f32(BINS * UPSAMPLE))
    mids = _linspace(h.lo, h.hi, BINS * UPSAMPLE + 1)[:-1] + f32(0.5) * size
    edges = _linspace(lo, hi, BINS + 1)
    where = np.clip(np.searchsorted(edges, mids, side="right") - 1, 0, BINS - 1)
    out = np.zeros(BINS, np.float32)
    np.add.at(out, where, fine)  # summed in float32 in order, as torch.bincount's weights
    return out


def _hist_observe(state: _Hist | None, x: np.ndarray) -> _Hist:
    x = _finite(x)
    x = x[np.isfinite(x)]  # +-inf ignored, as torch's (quantization clamps them)
    if not x.size:
        return state  # type: ignore[return-value]
    lo, hi = f32(x.min()), f32(x.max())
    if state is None:
        return _Hist(_histc(x, lo, hi), lo, hi)
    nlo, nhi = min(state.lo, lo), max(state.hi, hi)
    update = _histc(x, nlo, nhi)
    if nlo == state.lo and nhi == state.hi:
        return _Hist(state.hist + update, nlo, nhi)
    if state.lo == state.hi:
        old = _histc(np.float32([state.lo]), nlo, nhi) * f32(state.hist.sum())
    else:
        old = _upscale(state, nlo, nhi)
    return _Hist(update + old, nlo, nhi)


def _norm(d0: np.ndarray, d1: np.ndarray, density: np.ndarray) -> np.ndarray:
    return density * ((d1 * d1 * d1 - d0 * d0 * d0) / f32(3))


def _error(h: _Hist, start: int, end: int) -> float:
    """The L2 error of quantizing the histogram to DST_BINS levels over bins start..end."""
    width = (float(h.hi) - float(h.lo)) / BINS
    dst = width * (end - start + 1) / DST_BINS
    if dst == 0.0:
        return 0.0
    dstf = f32(dst)
    src = np.arange(BINS)
    begin = (src - start).astype(np.float32) * f32(width)
    stop = begin + f32(width)
    b_bin = np.clip(np.floor_divide(begin, dstf), 0, DST_BINS - 1)
    e_bin = np.clip(np.floor_divide(stop, dstf), 0, DST_BINS - 1)
    density = h.hist / f32(width)
    norm = _norm(begin - (b_bin + f32(0.5)) * dstf, np.full(BINS, f32(dst / 2)), density)
    norm = norm + (e_bin - b_bin - f32(1)) * _norm(f32(-dst / 2), f32(dst / 2), density)
    e_center = e_bin * dstf + f32(dst / 2)
    norm = norm + _norm(np.full(BINS, f32(-dst / 2)), stop - e_center, density)
    return float(norm.sum(dtype=np.float32))


def _search(h: _Hist) -> tuple[np.float32, np.float32]:
    """HistogramObserver's non-linear search: move the start or end bin inwards (whichever the
    next 1e-5 quantile moves further) while the L2 error does not grow."""
    width = f32(f32(h.hi - h.lo) / f32(BINS))
    total = float(h.hist.sum(dtype=np.float32))
    csum = np.cumsum(h.hist, dtype=np.float32)
    alpha, beta, start, end, best = 0.0, 1.0, 0, BINS - 1, float("inf")
    while alpha < beta:
        na, nb = alpha + 1e-5, beta - 1e-5
        left, right = start, end
        while left < end and csum[left] < na * total:
            left += 1
        while right > start and csum[right] > nb * total:
            right -= 1
        ns, ne = start, end
        if left - start > end - right:
            ns, alpha = left, na
        else:
            ne, beta = right, nb
        if ns == start and ne == end:
            continue
        err = _error(h, ns, ne)
        if err > best:
            break
        best, start, end = err, ns, ne
    return f32(h.lo + width * f32(start)), f32(h.lo + width * f32(end + 1))


def _hist_qparams(h: _Hist, quant_min: int, quant_max: int, symmetric: bool,
                  eps: float) -> tuple[float, int]:  # fmt: skip
    lo, hi = _search(h)
    return minmax_qparams(float(lo), float(hi), quant_min, quant_max, symmetric, eps)


HISTOGRAM = Observer("histogram", _hist_observe, _hist_qparams)

#: the observers by name (`refcore.quantize`'s ``observer=``)
OBSERVERS = {o.name: o for o in (MINMAX, MOVING_AVERAGE, HISTOGRAM)}
