"""Bad and extreme inputs per op, derived from the specs, and the verdict on one kernel's call.

`draw_call` draws a valid call from one of the op's sample cases (`refcore.sampling`, with some
dimensions pinned to 0 or 1; three draws in four keep every ranged dimension within
`SMALL_SPAN` of its lower bound, so most calls are small and cheap, the fourth uses the case's
whole ranges) and then applies up to three mutations chosen by the same draw:

- values: NaN / +-Inf / huge / denormal / -0.0 mixed in, or the whole tensor scaled to 1e-38..1e38;
- indices (arguments drawn with ``index`` values): out of range, negative, past 2^31 and 2^62;
- offsets and CSR row pointers (``offsets`` / ``crow``): non-monotone, not starting at 0, past the
  total, negative;
- shapes: one dim one larger, a dim dropped or added, a 0-d tensor in place of a tensor;
- dtypes: a tensor cast to another dtype (bf16 / fp32 / fp16 / fp64 / ints / bool);
- memory: flipped (negative strides), strided, transposed, channels-last, unaligned, stride-0
  (broadcast) and overlapping views, all with the values a plain array would have (the broadcast
  one repeats its first slice);
- attributes: ints at 0, -1, 2^31, 2^40, 2^63 - 1, -2^63; floats NaN / Inf / -0.0 / denormal /
  huge; None, wrong types, unknown choices.

`judge` runs the call through `refcore.run` twice, on the reference provider (the oracle) and on
the provider under test, and says ``ok`` (same result within the spec tolerance, NaN where the
reference has NaN), ``raised:<Exception>`` (both raised that type), ``declined`` (the provider
declined the call: `ProviderUnavailableError`), ``disputed`` (another result, where torch's own op
is off the reference as much: see `_arbitrate`) or ``wrong`` (anything else: another result,
another exception, a result where the reference raised, or writes to an input). The kernel runs
on one thread except in one call of `PARALLEL_ONE_IN` (`kernel_threads`, from the seed).
`refcore.fuzz_run` runs calls in worker processes so a crash or a hang is recorded, not fatal.

Example:
    >>> from refcore.registry import default_registry
    >>> fc = draw_call(default_registry().op("relu"), 7)
    >>> sorted(fc.args)
    ['input']
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from refcore import tensors
from refcore.sampling import RandomDraw, _apply_layout, cases, draw_case
from refcore.spec import OpSpec, Tolerance

_SPECIAL = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e20, -1e30, 1e-40, -1e-45, -0.0, 0.0]
_SCALES = [1e-38, 1e-20, 1e20, 1e30, 1e38]
_BIG_INTS = [-1, 2**31 - 1, 2**31, -(2**31) - 1, 2**40, 2**62, -(2**63), 2**63 - 1]
_INT_ATTRS = [0, -1, 1, -(2**31), 2**31, 2**40, 2**63 - 1, -(2**63)]
_FLOAT_ATTRS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3e38, -1.0, 1e300]
_DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"]
_LAYOUTS = ["flipped", "strided", "transposed", "channels_last", "unaligned", "stride0", "overlap"]


@dataclass
class FuzzCall:
    """One drawn call: its arguments and what was done to them (for a reproducible report)."""

    op: str
    seed: int
    dtype: str
    case: int
    args: dict[str, Any]
    mutations: list[str]
    #: product of the factors > 1 tensors were scaled by: the spec's atol is for the sampled
    #: magnitudes (N(0, 1) inputs), so it is read at this scale (see `judge`)
    scale: float = 1.0

    def describe(self) -> str:
        parts = []
        for k, v in self.args.items():
            if isinstance(v, np.ndarray):
                al = "" if v.flags.aligned else " unaligned"
                parts.append(f"{k}={v.dtype}{list(v.shape)} strides {v.strides}{al}")
            else:
                parts.append(f"{k}={v!r}")
        muts = "; ".join(self.mutations) or "none (a valid sample)"
        return (
            f"{self.op} seed {self.seed} ({self.dtype}, sample case {self.case}): "
            f"mutations: {muts}; args: {', '.join(parts)}"
        )


def _kind(gen: Any) -> str:
    """What an argument's sample generator draws: float / index / offsets / crow / mask / attr."""
    if "tensor" not in gen:
        return "attr"
    vals = gen.get("values")
    if isinstance(vals, dict) and next(iter(vals)) in ("index", "offsets", "crow"):
        return next(iter(vals))
    if vals == "bool_rows" or gen.get("dtype") == "bool":
        return "mask"
    if gen.get("dtype", "T") in ("T", "float32", "bfloat16", "float64", "float16"):
        return "float"
    return "index"


#: most draws keep every ranged dim within this much of its lower bound (calls stay small and
#: cheap; the span still crosses 8- and 16-wide vector tails); see `FULL_RANGE_ONE_IN`
SMALL_SPAN = 16
#: one draw in this many uses the sample case's whole ranges (blocked, tiled and parallel paths)
FULL_RANGE_ONE_IN = 4
#: one call in this many runs its kernel on torch's thread count (parallel regions of numba and
#: native kernels), the others on one thread: a parallel region's wake-up on a busy shared
#: machine costs 0.1-7 ms (numba's OpenMP pool, Zen 3, 2 cores) against ~2 us for the loop
PARALLEL_ONE_IN = 8


_CASES: dict[tuple[int, str], tuple[OpSpec, tuple]] = {}


def _cases(op: OpSpec, dtype: str) -> tuple:
    """`refcore.sampling.cases`, memoized per op object (specs are immutable)."""
    got = _CASES.get((id(op), dtype))
    if got is None or got[0] is not op:
        got = _CASES[(id(op), dtype)] = (op, tuple(cases(op, dtype)))
    return got[1]


def draw_call(op: OpSpec, seed: int, dtypes: tuple[str, ...] | None = None) -> FuzzCall:
    """Draw one (probably bad) call of ``op`` from ``seed``; ``dtypes``: the compute dtypes to
    pick from (default: the op's)."""
    draw = RandomDraw(seed)
    rng = functools.cache(lambda: np.random.default_rng(seed))  # made when used (~40 us)
    usable_dtypes = [d for d in (dtypes or op.dtypes) if _cases(op, d)]
    dtype = draw.choice(usable_dtypes)
    index, case = draw.choice(_cases(op, dtype))
    muts: list[str] = []
    pinned: dict[str, Any] = {}
    ranged = [name for name, rule in case.dims if isinstance(rule, list)]
    if ranged and draw.integer(0, 4) == 0:
        name, val = draw.choice(ranged), draw.choice([0, 0, 1])
        pinned[name] = val
        muts.append(f"dim {name}={val}")
    if draw.integer(1, FULL_RANGE_ONE_IN) > 1:  # a small draw: ranges cut to SMALL_SPAN
        for name, rule in case.dims:
            if isinstance(rule, list) and name not in pinned:
                lo, hi = rule
                pinned[name] = [lo, f"min(({hi}), ({lo}) + {SMALL_SPAN})"]
    try:
        sample = draw_case(op, index, dtype, draw, pinned)
    except (ValueError, ZeroDivisionError, IndexError):  # a pinned dim the expressions reject
        muts.clear()
        sample = draw_case(op, index, dtype, draw)
    gens = dict(case.args)
    args = dict(sample.args)
    for _ in range(draw.choice([0, 1, 1, 1, 2, 2, 3])):
        name = draw.choice(sorted(args))
        kind = _kind(gens.get(name, {}))
        what = _mutate(args, name, kind, draw, rng)
        if what:
            muts.append(what)
    scale = 1.0
    for m in muts:
        if " scaled by " in m:
            scale = min(1e300, scale * max(1.0, float(m.rsplit(" ", 1)[1])))
    return FuzzCall(op.name, seed, dtype, index, args, muts, scale)


def _mutate(args: dict[str, Any], name: str, kind: str, draw: RandomDraw, rng) -> str | None:
    v = args[name]
    if kind == "attr" or not isinstance(v, np.ndarray):
        return _mutate_attr(args, name, draw)
    family = draw.choice(["values", "values", "shape", "dtype", "layout", "layout", "none"])
    if family == "values" and kind == "float" and v.size:
        return _values(args, name, draw, rng)
    if family == "values" and kind in ("index", "offsets", "crow") and v.size:
        return _indices(args, name, kind, draw, rng)
    if family == "shape":
        return _shape(args, name, draw)
    if family == "dtype":
        dt = draw.choice(_DTYPES)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args[name] = tensors.round_to(v.astype(np.float64), dt) if dt != "bool" else v != 0
        return f"{name} cast to {dt}"
    if family == "layout" and v.size:
        lay = draw.choice(_LAYOUTS)
        args[name] = _layout(v, lay, draw)
        return f"{name} as a {lay} view"
    if family == "none":
        args[name] = None
        return f"{name}=None"
    return None


def _values(args: dict[str, Any], name: str, draw: RandomDraw, rng) -> str:
    v = args[name]
    x = v.astype(np.float64)
    if draw.integer(0, 2) == 0:
        scale = draw.choice(_SCALES)
        x = x * scale
        what = f"{name} scaled by {scale:g}"
    else:
        hit = np.asarray(rng().random(x.shape) < 0.25)  # an array also when 0-d
        if not hit.any():
            hit.flat[draw.integer(0, x.size - 1)] = True
        which = rng().integers(0, len(_SPECIAL), int(hit.sum()))
        x[hit] = np.array(_SPECIAL)[which]
        pool = sorted(repr(_SPECIAL[i]) for i in np.unique(which))
        what = f"{name}: {int(hit.sum())} of {x.size} values from {pool}"
    with np.errstate(all="ignore"):
        args[name] = _like(v, tensors.round_to(x, v.dtype))
    return what


def _indices(args: dict[str, Any], name: str, kind: str, draw: RandomDraw, rng) -> str:
    v = args[name]
    x = v.astype(np.int64) if v.dtype.kind in "iu" else v.astype(np.float64)
    flat = x.reshape(-1)
    i = draw.integer(0, flat.size - 1)
    finite = flat[np.isfinite(flat)] if flat.dtype.kind == "f" else flat  # a cast may add inf
    top = int(finite.max()) if finite.size else 0
    if kind in ("offsets", "crow") and draw.integer(0, 1) == 0 and x.ndim and x.shape[-1] >= 2:
        how = draw.choice(["non-monotone", "first not 0", "last past total", "last short"])
        row = x.reshape(-1, x.shape[-1])[draw.integer(0, x.size // x.shape[-1] - 1)]
        if how == "non-monotone":
            j = draw.integer(0, row.size - 2)
            row[j] = row[j + 1] + 1
        elif how == "first not 0":
            row[0] = 1
        elif how == "last past total":  # an int64 row may already end at the int64 maximum
            row[-1] = min(top + 1, np.iinfo(np.int64).max)
        else:
            row[-1] = max(0, row[-1] - 1)
        what = f"{name} {how}"
    else:
        val = draw.choice([top + 1, top + 2, -1, -top - 2, *_BIG_INTS])
        info = np.iinfo(v.dtype) if v.dtype.kind in "iu" else None
        if info is not None:
            val = int(np.clip(val, info.min, info.max))
        flat[i] = val
        what = f"{name}[{np.unravel_index(i, x.shape)}] = {val}"
    with np.errstate(all="ignore"):
        args[name] = _like(v, x.astype(v.dtype))
    return what


def _like(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``new``'s values in ``old``'s memory (keeping its strides and alignment) when writable."""
    if not old.flags.writeable:
        return new
    old[...] = new
    return old


def _shape(args: dict[str, Any], name: str, draw: RandomDraw) -> str:
    v = args[name]
    how = draw.choice(["grow", "drop", "add", "0-d"] if v.ndim else ["add", "grow"])
    if how == "0-d":
        args[name] = np.asarray(v.reshape(-1)[0] if v.size else 0, dtype=v.dtype)
    elif how == "drop":
        args[name] = v[..., 0] if v.shape[-1] else np.zeros(v.shape[:-1], v.dtype)
    elif how == "add":
        args[name] = np.stack([v] * draw.integer(1, 2))
    else:
        ax = draw.integer(0, v.ndim - 1) if v.ndim else 0
        w = v.reshape(1) if v.ndim == 0 else v
        extra = np.take(w, [0], axis=ax) if w.shape[ax] else np.zeros_like(w, shape=(
            *w.shape[:ax], 1, *w.shape[ax + 1:]))  # fmt: skip
        args[name] = np.concatenate([w, extra], axis=ax)
    return f"{name} shape {how} -> {list(args[name].shape)}"


def _layout(v: np.ndarray, lay: str, draw: RandomDraw) -> np.ndarray:
    if lay == "flipped":
        ax = draw.integer(0, v.ndim - 1) if v.ndim else None
        if ax is None:
            return v
        return np.flip(np.flip(v, ax).copy(), ax)
    if lay in ("strided", "transposed", "channels_last", "unaligned"):
        return _apply_layout(np.ascontiguousarray(v), lay)
    if lay == "stride0":
        if not v.ndim:
            return v
        ax = draw.integer(0, v.ndim - 1)
        return np.broadcast_to(np.take(v, [0], axis=ax), v.shape)
    # overlapping rows: each row starts half a row after the previous one
    if v.ndim < 2:
        return np.broadcast_to(v.reshape(-1)[:1], v.shape) if v.ndim else v
    item = v.itemsize
    step = max(1, v.shape[-1] // 2)
    inner = [step * item, item]
    outer, span = [], (v.shape[-2] - 1) * step + v.shape[-1]
    for n in reversed(v.shape[:-2]):
        outer.insert(0, span * item)
        span *= n
    base = np.resize(np.ascontiguousarray(v).reshape(-1), span)
    return np.lib.stride_tricks.as_strided(base, v.shape, (*outer, *inner), writeable=False)


def _mutate_attr(args: dict[str, Any], name: str, draw: RandomDraw) -> str:
    v = args[name]
    if isinstance(v, bool) or draw.integer(0, 5) == 0:
        new = draw.choice([None, 1, 0.5, "bogus", (1, 2), not v if isinstance(v, bool) else True])
    elif isinstance(v, int):
        new = draw.choice(_INT_ATTRS + [v + 1, -v])
    elif isinstance(v, float):
        new = draw.choice(_FLOAT_ATTRS)
    elif isinstance(v, str):
        new = draw.choice(["bogus", v.upper(), ""])
    elif isinstance(v, tuple):
        new = draw.choice([(), (0,) * max(1, len(v)), (-1,) * max(1, len(v)), (2**40,) * max(
            1, len(v)), (*v, 1)])  # fmt: skip
    else:
        new = None
    args[name] = new
    return f"{name}={new!r}"


@contextlib.contextmanager
def kernel_threads(seed: int):
    """Run the kernel under test of call ``seed`` on one thread, or on torch's current thread
    count for one call in `PARALLEL_ONE_IN` (numba and native kernels follow torch's count;
    without torch loaded, nothing is changed: importing it here would cost a call seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield None
        return
    before = torch.get_num_threads()
    want = before if seed % PARALLEL_ONE_IN == 0 else 1
    if want != before:
        torch.set_num_threads(want)
    try:
        yield want
    finally:
        if want != before:
            torch.set_num_threads(before)


def _identical(got: Any, want: Any) -> bool:
    """Same dtype, shape and bytes: equal whatever the tolerance (the common case, and cheap)."""
    return (
        isinstance(got, np.ndarray) and isinstance(want, np.ndarray)
        and got.dtype == want.dtype and got.shape == want.shape
        and np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()
    )  # fmt: skip


def judge(fc: FuzzCall, provider: str) -> tuple[str, str]:
    """Run ``fc`` on the reference and on ``provider``; return (outcome, detail).

    The outcome is ``ok``, ``raised:<type>``, ``declined`` or ``wrong`` (see the module doc).
    ``provider`` should hold the one kernel under test (`refcore.provider.using_providers`), so
    a decline is that kernel's. The kernel runs on the threads `kernel_threads` gives the seed.
    """
    from refcore.call import bind
    from refcore.dispatch import ProviderUnavailableError, run
    from refcore.registry import default_registry
    from refcore.testing import assert_close, snapshot

    before = snapshot(fc.args)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected, ref_exc = run(fc.op, provider="reference", **fc.args), None
        except Exception as e:  # the oracle's verdict, whatever it is
            expected, ref_exc = None, e
        if snapshot(fc.args) != before:
            return "wrong", "the reference wrote to an input"
        try:
            with kernel_threads(fc.seed):
                got, exc = run(fc.op, provider=provider, **fc.args), None
        except ProviderUnavailableError:
            return "declined", ""
        except Exception as e:
            got, exc = None, e
    if snapshot(fc.args) != before:
        return "wrong", f"{provider} wrote to an input"
    said = f"{type(exc).__name__}: {exc}" if exc is not None else "a result"
    if ref_exc is not None:
        if exc is not None and type(exc) is type(ref_exc):
            return f"raised:{type(exc).__name__}", ""
        return "wrong", f"gave {said}; the reference raised {type(ref_exc).__name__}: {ref_exc}"
    if exc is not None:
        return "wrong", f"raised {said}; the reference returned a result"
    pairs = list(zip(got, expected) if isinstance(expected, tuple) else [(got, expected)])
    if all(_identical(g, e) for g, e in pairs):
        return "ok", ""
    op = default_registry().op(fc.op)
    tol = op.tolerance_for(bind(op, (), fc.args).dtype)
    # an input scaled by 1e20 scales the rounding error of a sum that cancels (whose result is
    # far below its terms) by 1e20 too: atol, meant for the sampled magnitudes, scales with it
    tol = Tolerance(tol.atol * fc.scale, tol.rtol)
    for g, e in pairs:
        got_dt, want_dt = tensors.dtype_name(g), tensors.dtype_name(e)
        if got_dt != want_dt:
            return "wrong", f"output dtype {got_dt}, expected {want_dt}"
    for i, (g, e) in enumerate(pairs):
        try:
            assert_close(g, e, tol)
        except AssertionError as err:
            return _arbitrate(op, fc, i, g, e, tol, str(err))
    return "ok", ""


#: a kernel off the reference is ``disputed`` (not ``wrong``) only where its error is within this
#: factor of torch's own, at every element it misses
NO_WORSE_THAN_TORCH = 4.0


def _arbitrate(
    op: OpSpec, fc: FuzzCall, i: int, got: Any, want: Any, tol: Tolerance, why: str
) -> tuple[str, str]:
    """The kernel's output ``i`` is off the reference: is torch's own op as far off?

    ``disputed`` when, at every element the kernel misses, torch's error is at least
    1 / `NO_WORSE_THAN_TORCH` of the kernel's: an ill-conditioned call (a sum that cancels far
    below its terms, an intermediate past FLT_MAX that the reference holds in float64), where
    fp32 arithmetic in another order lands elsewhere and the kernel is as right as torch.
    ``wrong`` otherwise: where torch is exact or much closer (the issue's "silently wrong":
    torch and the reference agree, refcore differs), or torch has no answer (it raised).
    Disputed calls are counted and reported apart, never as ok."""
    from refcore.testing import call_torch, resolve

    try:
        named = {k: tensors.to_torch(np.array(v)) if isinstance(v, np.ndarray) else v
                 for k, v in fc.args.items()}  # fmt: skip
        out = call_torch(op, resolve(op.torch.function), named)
        t = tensors.to_numpy(out[i] if isinstance(out, tuple) else out)
    except Exception as e:  # torch gives no verdict: the reference's stands
        return "wrong", f"{why} (torch raised {type(e).__name__})"
    k, t, r = (np.asarray(x, dtype=np.float64) for x in (got, t, want))
    if t.shape != r.shape:
        return "wrong", f"{why} (torch's output has shape {t.shape})"
    band = tol.atol + tol.rtol * np.abs(r)

    def error(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(off the band?, distance: 0 where equal, inf where NaN or inf meets another value)"""
        same = (x == r) | (np.isnan(x) & np.isnan(r))
        dist = np.nan_to_num(np.abs(x - r), nan=np.inf)
        dist[same] = 0.0
        return ~same & ~(dist <= band), dist

    (miss_k, dk), (miss_t, dt) = error(k), error(t)
    worse = miss_k & (dk > NO_WORSE_THAN_TORCH * dt)
    if worse.any():
        spread = _input_rounding(op, fc, i, r)
        if spread is not None and not (worse & ~(dk <= WITHIN_ROUNDING * spread + band)).any():
            j = int(np.argmax(worse.ravel()))
            moved = float(spread.ravel()[j])
            return "disputed", (f"{why}; within what rounding the inputs to fp32 moves the "
                                f"reference by ({moved!r} at flat index {j})")  # fmt: skip
        j = int(np.argmax(worse.ravel()))
        said = "agrees with the reference" if not miss_t.ravel()[j] else "is off too, by less"
        return "wrong", f"{why}; torch {said} there ({float(t.ravel()[j])!r} at flat index {j})"
    j = int(np.argmax(miss_k.ravel()))
    return "disputed", f"{why}; torch gives {float(t.ravel()[j])!r} there"


#: a kernel off the reference (and further than torch) is still ``disputed`` where its error is
#: within this factor of how far the reference moves when every floating input moves by up to
#: `INPUT_ROUNDING` (relative, random sign and size in [1/2, 1] of it): what any fp32 evaluation
#: order may show there. With the sign alone, two equal terms that cancel (0.578 x 3e38 against
#: 0.578 x -3e38) got equal moves in a third of the draws and still cancelled, so a matmul whose
#: reference loses its 1e20 terms beside them measured no spread and the kernel that kept them
#: (exact: -1.07e20, reference and torch 0.0) was called wrong (refcore.fuzz, seed 66857)
WITHIN_ROUNDING = 8.0
INPUT_ROUNDING = 2.0**-22


def _input_rounding(op: OpSpec, fc: FuzzCall, i: int, want: np.ndarray) -> np.ndarray | None:
    """Per element of output ``i``: how far the reference's result moves when every floating
    input is computed on in fp32 and moved by a relative `INPUT_ROUNDING` (two draws, the
    larger move). Large where the call is ill-conditioned: a sum of terms of 3e22 that cancels
    to 9e19 moves by ~1e16 (the spread of fp32 sums in any order), where a torch in another
    order happened to land closer; tiny where it is not, so a kernel's real error stays wrong.
    None where the reference does not run on such inputs."""
    from refcore.dispatch import run

    rng = np.random.default_rng(fc.seed)
    moved = np.zeros(want.shape)
    for _ in range(2):
        args = {}
        for k, v in fc.args.items():
            if isinstance(v, np.ndarray) and (v.dtype.kind == "f" or v.dtype == tensors.BFLOAT16):
                a = v.astype(np.float64)
                size = rng.uniform(0.5, 1.0, a.shape)  # not a sign alone: see INPUT_ROUNDING
                a *= 1.0 + INPUT_ROUNDING * size * rng.choice([-1.0, 1.0], a.shape)
                v = a.astype(np.float32)
            args[k] = v
        try:
            with np.errstate(all="ignore"):
                out = run(fc.op, provider="reference", **args)
        except Exception:  # the reference takes no fp32 here (a dtype the op pins)
            return None
        got = np.asarray(out[i] if isinstance(out, tuple) else out, dtype=np.float64)
        if got.shape != want.shape:
            return None
        d = np.abs(got - want)
        d[np.isnan(d)] = np.inf  # a NaN or inf moved: anything goes there
        d[(got == want) | (np.isnan(got) & np.isnan(want))] = 0.0
        moved = np.maximum(moved, d)
    return moved
