"""Helpers for the generic property suites (and for third-party providers testing their kernels).

Example:
    >>> import numpy as np
    >>> from refcore.spec import Tolerance
    >>> assert_close(np.float32([1.0, np.nan]), np.float32([1.0, np.nan]), Tolerance(0, 0))
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from refcore import tensors
from refcore.registry import resolve
from refcore.sampling import Sample
from refcore.spec import OpSpec, Tolerance


class HypothesisDraw:
    """A `refcore.sampling.Draw` backed by hypothesis' ``data.draw``, so failures shrink."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self._data, self._st = data, st

    def integer(self, lo: int, hi: int) -> int:
        return self._data.draw(self._st.integers(lo, hi))

    def choice(self, options: Sequence[Any]) -> Any:
        return self._data.draw(self._st.sampled_from(list(options)))


def _as_f64(x: Any) -> np.ndarray:
    if tensors.is_torch(x):
        x = tensors.to_numpy(x)
    return np.asarray(x).astype(np.float64)


def assert_close(actual: Any, expected: Any, tol: Tolerance, what: str = "") -> None:
    """Same shape; NaN where expected has NaN; equal infinities; else |a-e| <= atol + rtol*|e|."""
    a, e = _as_f64(actual), _as_f64(expected)
    prefix = f"{what}: " if what else ""
    if a.shape != e.shape:
        raise AssertionError(f"{prefix}shape {a.shape} != expected {e.shape}")
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if (nan_a != nan_e).any():
        i = np.argwhere(nan_a != nan_e)[0]
        raise AssertionError(
            f"{prefix}NaN mismatch at {tuple(i)}: got {a[tuple(i)]}, expected {e[tuple(i)]}"
        )
    inf_e = np.isinf(e)
    if (np.isinf(a) != inf_e).any() or (a[inf_e] != e[inf_e]).any():
        i = np.argwhere((np.isinf(a) != inf_e) | (inf_e & (a != e)))[0]
        raise AssertionError(
            f"{prefix}inf mismatch at {tuple(i)}: got {a[tuple(i)]}, expected {e[tuple(i)]}"
        )
    fin = ~(nan_e | inf_e)
    err = np.abs(a[fin] - e[fin])
    bound = tol.atol + tol.rtol * np.abs(e[fin])
    if (err > bound).any():
        k = int(np.argmax(err - bound))
        idx = tuple(np.argwhere(fin)[k])
        raise AssertionError(
            f"{prefix}{int((err > bound).sum())} of {err.size} elements differ beyond "
            f"atol={tol.atol}, rtol={tol.rtol}; worst at {idx}: got {a[idx]!r}, expected {e[idx]!r}"
        )


def call_torch(op: OpSpec, fn: Any, named: Mapping[str, Any]) -> Any:
    """Call a torch function with arguments named as in ``op``'s signature.

    Positional arguments go in schema order (up to the last one given, defaults filling gaps) and
    keyword-only ones by keyword: the spec's signature mirrors torch's, so this is torch's own call.
    """
    positional = [a for a in op.signature.args if not a.kwarg_only]
    last = max((i for i, a in enumerate(positional) if a.name in named), default=-1)
    pos = [named.get(a.name, a.default) for a in positional[: last + 1]]
    kw = {a.name: named[a.name] for a in op.signature.args if a.kwarg_only and a.name in named}
    with warnings.catch_warnings():
        # e.g. conv2d padding='same' with even kernels: a performance note, not a result change
        warnings.filterwarnings("ignore", "Using padding='same'", UserWarning)
        return fn(*pos, **kw)


def torch_oracle(op: OpSpec, sample: Sample) -> np.ndarray:
    """Run torch's own op (``op.torch.function``) on the sample; return a NumPy array."""
    out = call_torch(op, resolve(op.torch.function), sample.torch_args())
    return tensors.to_numpy(out).copy()


def snapshot(args: Mapping[str, Any]) -> dict[str, bytes]:
    """Bytes of every array argument, to prove later that nothing wrote to the inputs."""
    return {
        k: np.ascontiguousarray(v).tobytes() for k, v in args.items() if isinstance(v, np.ndarray)
    }


def check_kernel(
    kernel: Any, op: OpSpec, sample: Sample, packed: Mapping[str, str] | None = None
) -> bool:
    """Run ``kernel`` on ``sample`` and compare with the reference within the spec tolerance.

    ``packed`` maps argument names to a layout (specs/layouts.yaml): the kernel gets those
    arguments packed (`refcore.pack`), the reference the sample's plain arrays.
    Returns False when the kernel declines the call (its reason must be non-empty), True when it ran
    and matched; raises AssertionError on a mismatch or when the kernel wrote to its inputs.
    """
    from refcore.call import bind
    from refcore.packed import pack, pack_params

    args = dict(sample.args)
    for arg, layout in (packed or {}).items():
        if args.get(arg) is not None:  # packed for this call, as the prepack pass does
            params = pack_params(op.name, layout, sample.args)
            args[arg] = pack(op.name, args[arg], layout, arg, **params)
    call = bind(op, (), args)
    verdict = kernel.supports(call)
    if not verdict:
        assert verdict.reason, f"{kernel.name} declined {op.name} without a reason"
        return False
    before = snapshot(sample.args)
    got = kernel(call)
    assert snapshot(sample.args) == before, f"{kernel.name} wrote to its inputs"
    expected = resolve(op.reference)(**sample.args)
    assert tensors.dtype_name(got) == tensors.dtype_name(expected), (
        f"{kernel.name}: output dtype {tensors.dtype_name(got)}, "
        f"expected {tensors.dtype_name(expected)}"
    )
    assert_close(got, expected, op.tolerance_for(sample.dtype), f"{op.name} kernel {kernel.name}")
    return True
