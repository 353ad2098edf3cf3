"""Prepacked weights: a weight reordered once into a kernel's layout (specs/layouts.yaml).

`pack` returns a `PackedWeight`, which an argument listed in the layout's ``args`` accepts in
place of the plain array. Binding and the op's checks see its logical shape and dtype; kernels
that declare the layout (``Kernel.layouts``) read ``data`` as is, every other kernel declines it,
and the reference provider runs on `unpack`'s plain array.

Example:
    >>> import numpy as np, refcore
    >>> w = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> pw = refcore.pack("linear", w, "avx512_f32_panel32")
    >>> pw.shape, pw.data.shape
    ((2, 3), (1, 3, 32))
    >>> refcore.run("linear", np.ones((1, 3), np.float32), pw, provider="reference")
    array([[ 3., 12.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refcore import tensors


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A weight of logical ``shape`` (N, K) and ``dtype``, stored as ``data`` in ``layout``.

    ``params`` are the layout's pack parameters it was packed with (specs/layouts.yaml
    ``params``, e.g. the conv geometry), as sorted (name, value) pairs. ``held`` keeps forms of
    the weight that are no NumPy array (a oneDNN blocked tensor), keyed as the layout's doc says:
    the pack puts the form for ``params`` there, and a kernel that reads the layout may add the
    form for another call (a bounded cache). Unpack never reads it: ``data`` is the meaning.
    """

    layout: str
    shape: tuple[int, ...]
    dtype: np.dtype
    data: np.ndarray
    params: tuple[tuple[str, Any], ...] = ()
    held: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self) -> str:
        dt = tensors.dtype_name(self.dtype)
        return f"PackedWeight({self.layout!r}, shape={self.shape}, dtype={dt})"


def pack(op: str, weight: Any, layout: str, arg: str = "weight", **params: Any) -> PackedWeight:
    """Pack ``weight`` (NumPy or torch, (N, K)) for argument ``arg`` of ``op`` into ``layout``.

    ``params`` are the layout's pack parameters (specs/layouts.yaml ``params``; `pack_params`
    reads them off a call's arguments); a layout without any takes none.
    Raises ValueError naming op, argument and layout when the layout does not apply.
    """
    from refcore.registry import default_registry, resolve

    reg = default_registry()
    reg.op(op)
    if layout not in reg.layouts:
        known = ", ".join(sorted(reg.layouts))
        raise ValueError(f"{op}: argument {arg!r}: unknown layout {layout!r}; known: {known}")
    spec = reg.layouts[layout]
    if f"{op}.{arg}" not in spec.args:
        raise ValueError(
            f"{op}: argument {arg!r} expected one of the arguments of layout {layout!r} "
            f"({', '.join(spec.args)}); got {op}.{arg}"
        )
    w = tensors.to_numpy(weight) if tensors.is_torch(weight) else weight
    if not isinstance(w, np.ndarray):
        raise TypeError(f"{op}: argument {arg!r} expected a NumPy array or torch tensor; got {w!r}")
    name = tensors.dtype_name(w)
    if name not in spec.dtypes:
        raise TypeError(
            f"{op}: argument {arg!r} expected dtype {' or '.join(spec.dtypes)} for layout "
            f"{layout!r}; got dtype {name}"
        )
    known = {name for name, _ in spec.params}
    if set(params) - known:
        raise ValueError(
            f"{op}: argument {arg!r}: layout {layout!r} takes params {sorted(known) or 'none'}; "
            f"got {sorted(params)}"
        )
    got = resolve(spec.pack)(w, **params)
    data, held = got if isinstance(got, tuple) else (got, {})
    return PackedWeight(layout, tuple(int(d) for d in w.shape), w.dtype, _aligned(data),
                        tuple(sorted(params.items())), held)  # fmt: skip


def pack_params(op: str, layout: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The pack parameters of ``layout`` read off a call of ``op`` (its named ``arguments``):
    a source ``input.shape`` gives the argument's shape as a tuple, any other its value. Sources
    missing from ``arguments`` are left out (the pack's defaults apply).

    Example:
        >>> pack_params("linear", "avx512_f32_panel32", {})
        {}
    """
    from refcore.registry import default_registry

    out: dict[str, Any] = {}
    for name, source in default_registry().layouts[layout].params:
        arg, _, attr = source.partition(".")
        if arg not in arguments:
            continue
        value = arguments[arg]
        out[name] = tuple(int(d) for d in value.shape) if attr == "shape" else value
    return out


def _aligned(a: np.ndarray, to: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``a`` starting on a ``to``-byte boundary (a cache line): kernels
    read packed blocks with full-width loads, which cost double when they straddle two lines."""
    buf = np.empty(a.nbytes + to, np.uint8)
    off = -buf.ctypes.data % to
    out = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def unpack(a: Any) -> Any:
    """The plain array of a `PackedWeight`; anything else is returned unchanged."""
    if not isinstance(a, PackedWeight):
        return a
    from refcore.registry import default_registry, resolve

    return resolve(default_registry().layouts[a.layout].unpack)(a.data, a.shape)
