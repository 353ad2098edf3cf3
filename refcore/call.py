"""Normalise one op call: bind arguments to the signature, convert torch to NumPy, validate.

This happens once per call, before any kernel is chosen, so every provider sees the same checked
`Call`. Errors name the op, the argument, what was expected and what was given.

Naming a call's arguments is one mechanism, `Spelling`: how a calling convention spells an op's
arguments (refcore's own signature, torch's function as the spec's ``torch:`` declares it, or
another torch callable standing for the op), built once per op and convention (`spelling`).
`bind` validates through it, `Plan` re-binds a call as it was spelled, and the graph layers
(pattern matching, derived fused ops, custom ops' fake kernels, prepacking) name fx nodes'
arguments and their own calls with it.

Example:
    >>> import numpy as np
    >>> from refcore.registry import default_registry
    >>> c = bind(default_registry().op("gelu"), (np.ones(3, np.float32),), {})
    >>> c.dtype, c.arguments["approximate"]
    ('float32', 'none')
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from refcore import tensors
from refcore.packed import PackedWeight
from refcore.registry import default_registry, resolve
from refcore.spec import Arg, OpSpec


@dataclass(frozen=True)
class Call:
    """A validated call: NumPy views of every tensor argument plus canonical attributes."""

    op: OpSpec
    arguments: Mapping[str, Any]
    dtype: str
    torch_out: bool

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, array) for every tensor argument that is not None (a `PackedWeight` as is)."""
        for a in self.op.signature.tensor_args:
            v = self.arguments[a.name]
            if v is not None:
                yield a.name, v

    def layout(self, name: str) -> str:
        """``contiguous``, ``channels_last`` (4-D NHWC memory), ``strided`` (any other strides)
        or ``unaligned`` (data pointer or a stride not a multiple of the item's alignment, which
        only kernels reading any strides, ``strided``, accept) for a tensor arg; a
        `PackedWeight`'s layout name (``amx_bf16_vnni2``...)."""
        return layout_of(self.arguments[name])

    def wrap(self, out: Any) -> Any:
        """Return ``out`` (NumPy) as the caller's kind: torch if any input was torch."""
        if not self.torch_out:
            return out
        if isinstance(out, tuple):
            return tuple(self.wrap(o) for o in out)
        return tensors.to_torch(out)


def layout_of(a: np.ndarray | PackedWeight) -> str:
    if isinstance(a, PackedWeight):
        return a.layout
    flags = a.flags  # one flags object: each ``a.flags`` builds a new one
    if not flags.aligned:  # a data pointer or stride off the item size (``frombuffer(offset=1)``)
        return "unaligned"
    if flags.c_contiguous:
        return "contiguous"
    if a.ndim == 4 and a.transpose(0, 2, 3, 1).flags.c_contiguous:
        return "channels_last"
    return "strided"


def _err(op: str, arg: str, expected: str, got: Any, exc: type[Exception] = TypeError):
    return exc(f"{op}: argument {arg!r} expected {expected}; got {got}")


@dataclass(frozen=True)
class Spelling:
    """How one calling convention spells an op's arguments, and `arguments` to name a call's.

    ``positional``: the names a call may give by position, in order (torch-only ones included);
    ``keywords``: the names it may give by keyword (None: any, for graph ops without a spec);
    ``extra``: torch-only arguments, each with the value refcore needs (``"any"`` when it does
    not change the result), checked and dropped; ``defaults`` and ``required``: the signature's.
    ``op``, ``caller`` and ``shown`` name the op, the callee and its signature in errors.
    """

    op: str
    caller: str
    shown: str
    positional: tuple[str, ...]
    keywords: frozenset[str] | None
    extra: tuple[tuple[str, Any], ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()
    required: tuple[str, ...] = ()

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                  defaults: bool = True) -> dict[str, Any]:  # fmt: skip
        """The call's arguments by signature name, the defaults of those not given included
        (``defaults=False``: the given ones only, as a call to forward is spelled); TypeError or
        ValueError naming the op, the argument, what was expected and what was given.

        The values are not looked at (fx nodes name theirs as well as tensors do), except a
        torch-only argument's, which must be the value refcore needs."""
        if len(args) > len(self.positional):
            raise TypeError(
                f"{self.caller} takes at most {len(self.positional)} positional arguments "
                f"({len(args)} given); signature: {self.shown}"
            )
        named = dict(zip(self.positional, args))
        for k, v in kwargs.items():
            if k in named:
                raise TypeError(f"{self.caller} got multiple values for argument {k!r}")
            if self.keywords is not None and k not in self.keywords:
                raise TypeError(
                    f"{self.caller} got an unexpected argument {k!r}; signature: {self.shown}"
                )
            named[k] = v
        for k, allowed in self.extra:
            if k in named:
                v = named.pop(k)
                if allowed != "any" and not _same(v, allowed):
                    raise ValueError(
                        f"{self.op}: torch argument {k}={v!r} (refcore needs {allowed!r})"
                    )
        for k in self.required:
            if k not in named:
                raise TypeError(
                    f"{self.caller} missing required argument {k!r}; signature: {self.shown}"
                )
        if defaults:
            for k, d in self.defaults:
                if k not in named:
                    named[k] = d
        return named

    def sources(self, nargs: int, kwargs: Mapping[str, Any]) -> dict[str, int | str]:
        """Where a call with ``nargs`` positional arguments and these keywords (one `arguments`
        accepted) gives each argument: signature name -> its position or keyword."""
        where: dict[str, int | str] = dict(zip(self.positional, range(nargs)))
        where.update({k: k for k in kwargs})
        for k, _ in self.extra:
            where.pop(k, None)
        return where


def _same(value: Any, allowed: Any) -> bool:
    try:
        return bool(value == allowed)
    except Exception:  # an array or tensor given where refcore needs a constant
        return False


#: the spellings `spelling` built: (id of the op, form) -> (the op, its spelling); the op is held
#: so its id stays its own (an OpSpec holds dicts, so it cannot key a functools cache itself)
_SPELLINGS: dict[tuple[int, str], tuple[OpSpec, Spelling]] = {}

SPELLING_FORMS = ("refcore", "torch", "alias")


def spelling(op: OpSpec, form: str = "refcore") -> Spelling:
    """How ``form`` spells ``op``'s arguments (built once per op and form):

    - ``"refcore"``: refcore's own calling convention, the signature (keyword-only arguments by
      keyword only);
    - ``"torch"``: torch's function ``op.torch.function``, in the positional order the spec's
      ``torch.positional`` declares (the signature's when it declares none), torch-only
      arguments (``torch.extra``) checked and dropped;
    - ``"alias"``: any other torch callable standing for the op (``torch.also``'s methods and
      operators, a graph's spellings): the signature's order, ``torch.extra`` as for ``torch``
      (``torch.positional`` is the order of torch's function alone: ``Tensor.softmax(dim,
      dtype)`` takes no ``_stacklevel``).

    Example:
        >>> from refcore.registry import default_registry
        >>> sm = spelling(default_registry().op("softmax"), "torch")
        >>> sm.arguments(("x", 1), {"_stacklevel": 5})
        {'input': 'x', 'dim': 1}
    """
    hit = _SPELLINGS.get((id(op), form))
    if hit is not None and hit[0] is op:
        return hit[1]
    if form not in SPELLING_FORMS:
        raise ValueError(f"spelling: form {form!r}; expected one of {SPELLING_FORMS}")
    sig, t = op.signature, op.torch
    sig_pos = tuple(a.name for a in sig.positional)
    defaults = tuple((a.name, a.default) for a in sig.args if a.has_default)
    required = tuple(a.name for a in sig.args if not a.has_default)
    if form == "refcore":
        sp = Spelling(op.name, f"{op.name}()", str(sig), sig_pos, sig.names, (), defaults, required)
    else:
        extra = tuple(t.extra)
        positional = t.positional if form == "torch" and t.positional else sig_pos
        keywords = sig.names | {k for k, _ in extra}
        if form == "torch" and t.positional:  # every argument may come by keyword
            rest = ", ".join(sorted(keywords - set(positional)))
            shown = f"{t.function}({', '.join(positional)}{', *, ' + rest if rest else ''})"
            caller = f"{op.name} as {t.function}()"
        else:
            shown = str(sig) + (f" (torch-only: {', '.join(k for k, _ in extra)})" if extra else "")
            caller = f"{op.name}()"
        sp = Spelling(
            op.name, caller, shown, positional, frozenset(keywords), extra, defaults, required
        )
    if len(_SPELLINGS) > 4096:  # a bound, for programs making registries without end
        _SPELLINGS.clear()
    _SPELLINGS[(id(op), form)] = (op, sp)
    return sp


def torch_spelling(op: OpSpec, fn: Any) -> Spelling:
    """`spelling` of a call of the torch callable ``fn`` standing for ``op``: ``"torch"`` when
    ``fn`` is the op's torch function, else ``"alias"``."""
    return spelling(op, "torch" if fn is _torch_function(op) else "alias")


def _torch_function(op: OpSpec) -> Any:
    hit = _TORCH_FUNCTIONS.get(id(op))
    if hit is None or hit[0] is not op:
        if len(_TORCH_FUNCTIONS) > 4096:
            _TORCH_FUNCTIONS.clear()
        hit = _TORCH_FUNCTIONS[id(op)] = (op, resolve(op.torch.function))
    return hit[1]


_TORCH_FUNCTIONS: dict[int, tuple[OpSpec, Any]] = {}  # id of the op -> (the op, torch function)


def bind(op: OpSpec, args: Sequence[Any], kwargs: Mapping[str, Any],
         spelled: Spelling | None = None) -> Call:  # fmt: skip
    """Bind ``args``/``kwargs`` (spelled as ``spelled`` says, by default refcore's signature)
    to ``op``'s signature and validate generic rules.

    Generic rules come from the spec (types, dtypes, choices); the op's own ``check`` function then
    validates shapes and relations between arguments. Defaults are taken as the spec writes them.
    """
    sig = op.signature
    args, kwargs = _unpack(op, list(args), dict(kwargs))
    values = (spelled or spelling(op)).arguments(args, kwargs, defaults=False)
    out: dict[str, Any] = {}
    torch_out = False
    for a in sig.args:
        if a.name not in values:
            out[a.name] = a.default  # not validated: the spec's default, as written
            continue
        v = values[a.name]
        if a.is_tensor:
            if type(v) is not np.ndarray and tensors.is_torch(v):
                torch_out = True
            out[a.name] = _tensor(op.name, a, v)
        else:
            out[a.name] = _attr(op.name, a, v)
    dtype = _check_dtypes(op, out)
    _resolved(op.check)(**out)
    return Call(op=op, arguments=out, dtype=dtype, torch_out=torch_out)


def torch_arguments(op: OpSpec, args: Sequence[Any], kwargs: Mapping[str, Any],
                    spelled: Spelling | None = None) -> dict[str, Any]:  # fmt: skip
    """A call's arguments by the op's names as given: not converted or checked, a sparse CSR
    operand unpacked, defaults filled in (what a routed call's gradient op is called with)."""
    args, kwargs = _unpack(op, list(args), dict(kwargs))
    return (spelled or spelling(op)).arguments(args, kwargs)


@dataclass(frozen=True)
class Plan:
    """How to bind another call of the same structure without validating it again.

    Valid only for a call whose structure (every tensor's dtype, shape, strides and alignment,
    every other argument's type and value: `structure_key`) equals the planned call's, of an op
    whose checks read no tensor's contents (`plannable`). Such a call passes the same checks, so
    binding it is converting its tensors: ``tensors`` lists (argument name, positional index or
    keyword in the call as it was spelled: torch's spelling for a routed torch call, so a
    repeated call is not renamed first) and ``fixed`` holds every other argument, already
    canonical.
    """

    op: OpSpec
    tensors: tuple[tuple[str, int | str], ...]
    fixed: Mapping[str, Any]
    dtype: str
    torch_out: bool

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call:
        out = dict(self.fixed)
        for name, src in self.tensors:
            v = args[src] if type(src) is int else kwargs[src]
            out[name] = v if type(v) is np.ndarray else tensors.to_numpy(v)
        return Call(op=self.op, arguments=out, dtype=self.dtype, torch_out=self.torch_out)


def plannable(op: OpSpec) -> bool:
    """True when ``op``'s checks depend on its call's structure only: no packed argument forms
    and no integer tensor argument whose values are checked: indices, offsets and zero points
    (int16 / int32 / int64) always are; int8 / uint8 tensors are too, except in an op tagged
    ``quantized``, where they are codes (any value of the dtype is valid: qlinear, qconv2d, their
    fused forms, dequantize_per_tensor, the weight-only linears); and no op tagged
    ``checked_values``, whose check reads a floating tensor's values (roi_align's boxes: after
    one valid call a box of NaN or a batch index past the batch was bound unchecked, and the
    outcome depended on the calls before it; found by refcore.fuzz)."""
    if op.packed_args or "checked_values" in op.tags:
        return False
    codes = ("int8", "uint8") if "quantized" in op.tags else ()
    ints = {"int8", "int16", "int32", "int64", "uint8"} - set(codes)
    return not any(d in ints for flat, _, _ in op.allowed_dtypes.values() for d in flat)


def plan(call: Call, args: Sequence[Any], kwargs: Mapping[str, Any],
         spelled: Spelling | None = None) -> Plan | None:  # fmt: skip
    """A `Plan` re-binding calls shaped like ``args``/``kwargs`` (which produced ``call``, spelled
    as ``spelled`` says: the plan reads the tensors where that call has them), or None when the
    op is not `plannable` or its tensors are not all torch or all NumPy."""
    op = call.op
    if not plannable(op):
        return None
    where = (spelled or spelling(op)).sources(len(args), kwargs)
    srcs, fixed = [], {}
    for a in op.signature.args:
        v = call.arguments[a.name]
        if a.is_tensor and v is not None:
            if isinstance(v, PackedWeight):
                fixed[a.name] = v  # the same object: part of the routing key by identity
                continue
            src = where[a.name]
            given = args[src] if type(src) is int else kwargs[src]
            if type(given) is not np.ndarray and not tensors.is_torch(given):
                return None
            if tensors.is_torch(given) != call.torch_out:
                return None  # mixed NumPy and torch: bind decides per call
            srcs.append((a.name, src))
        else:
            fixed[a.name] = v
    return Plan(op, tuple(srcs), fixed, call.dtype, call.torch_out)


def structure_key(head: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """A hashable description of a call's structure (every array's or tensor's dtype, shape,
    strides and alignment, every other argument's type and value), prefixed by ``head``; None
    when it has none.

    Two calls with equal keys must be equal for every check and every kernel's `supports`: the
    memos of `refcore.run` and the router reuse the first call's outcome. So values are keyed by
    type too (``1 == 1.0 == True`` in Python, but a float attribute rejects a bool), floats by
    their bits (``0.0 == -0.0``), and arrays by alignment (kernels decline unaligned ones).
    """
    try:
        key = (head, tuple(map(_part, args)), tuple((k, _part(v)) for k, v in kwargs.items()))
        hash(key)
    except (TypeError, RuntimeError):  # unhashable values; tensors without strides (sparse)
        return None
    return key


_TENSOR_TYPES: set[type] = set()  # torch tensor classes seen (Tensor, Parameter, ...): a set test


def _part(v: Any) -> Any:
    t = type(v)
    if t in _TENSOR_TYPES or (tensors.is_torch(v) and not _TENSOR_TYPES.add(t)):
        # torch.Size is a tuple: hashable as it is
        aligned = v.data_ptr() % v.element_size() == 0
        return (v.dtype, v.shape, v.stride(), v.layout, v.is_cpu, aligned)
    if t is np.ndarray:
        return ("ndarray", v.dtype, v.shape, v.strides, v.flags.aligned)
    if t is list or t is tuple:
        return (t, *map(_part, v))
    if isinstance(v, float):  # np.float64 too; the bits: 0.0 and -0.0 differ, nan equals nan
        return (t, v.hex())
    if isinstance(v, np.floating):
        return (t, float(v).hex())
    return (t, v)  # other attributes by type and value; a PackedWeight by identity


@functools.cache
def _resolved(dotted: str) -> Any:
    return resolve(dotted)  # once per check function, not per call (a hot path under routing)


def _unpack(op: OpSpec, args: list, kwargs: dict) -> tuple[list, dict]:
    """Expand a torch sparse CSR tensor given in place of ``packed_args['sparse_csr']``."""
    names = op.packed_args.get("sparse_csr")
    if not names or not args or not tensors.is_torch(args[0]):
        return args, kwargs
    import torch

    if args[0].layout != torch.sparse_csr:
        return args, kwargs
    csr = args[0]
    if csr.dim() != 2:
        raise _err(op.name, names[0], "a 2-D sparse CSR tensor", f"{csr.dim()}-D", ValueError)
    # The packed form carries the column count, which the three unpacked arrays do not: check it
    # against the operand it multiplies (the next tensor argument) before it is lost.
    rest = [a.name for a in op.signature.args if a.name not in names]
    other = args[1] if len(args) > 1 else kwargs.get(rest[0])
    if other is not None and hasattr(other, "shape") and other.shape[0] != csr.shape[1]:
        raise _err(
            op.name, rest[0], f"{csr.shape[1]} rows (the sparse operand has shape "
            f"{tuple(csr.shape)})", f"shape {tuple(other.shape)}", ValueError,
        )  # fmt: skip
    return [csr.crow_indices(), csr.col_indices(), csr.values(), *args[1:]], kwargs


def _tensor(op: str, a: Arg, v: Any) -> np.ndarray | None:
    if v is None:
        if a.optional:
            return None
        raise _err(op, a.name, "a tensor", "None")
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, PackedWeight):
        spec = default_registry().layouts.get(v.layout)
        if spec is None or f"{op}.{a.name}" not in spec.args:
            raise _err(op, a.name, "a plain array (no packed layout applies to it)", repr(v))
        return v
    if tensors.is_torch(v):
        if v.device.type != "cpu":
            raise _err(op, a.name, "a CPU tensor", f"device {v.device}", ValueError)
        if str(v.layout) != "torch.strided":
            raise _err(op, a.name, "a dense (strided) tensor", f"layout {v.layout}", ValueError)
        return tensors.to_numpy(v)
    raise _err(op, a.name, "a NumPy array or torch tensor", type(v).__name__)


def _attr(op: str, a: Arg, v: Any) -> Any:
    if v is None:
        if a.optional or a.default is None:
            return None
        raise _err(op, a.name, a.type, "None")
    canon = _canonical(op, a, v)
    if a.choices is not None and canon not in a.choices:
        opts = ", ".join(repr(c) for c in a.choices)
        raise _err(op, a.name, f"one of {opts}", repr(v), ValueError)
    return canon


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _canonical(op: str, a: Arg, v: Any) -> Any:
    t = a.type
    if t == "int" and _is_int(v):
        return int(v)
    if t == "float" and (_is_int(v) or isinstance(v, (float, np.floating))):
        return float(v)
    if t == "bool" and isinstance(v, (bool, np.bool_)):
        return bool(v)
    if t == "str" and isinstance(v, str):
        return v
    if t == "int[2]|str" and isinstance(v, str):
        return v
    if t in ("int[]", "int[2]", "int[2]|str"):
        if _is_int(v):
            return (int(v),) if t == "int[]" else (int(v), int(v))
        if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v):
            if t != "int[]" and len(v) != 2:
                raise _err(op, a.name, "an int or a pair of ints", repr(v), ValueError)
            return tuple(int(x) for x in v)
    raise _err(op, a.name, t, f"{type(v).__name__} {v!r}")


def _check_dtypes(op: OpSpec, values: Mapping[str, Any]) -> str:
    first: tuple[str, str] | None = None
    for name, (flat, takes_t, declared) in op.allowed_dtypes.items():
        v = values[name]
        if v is None:
            continue
        got = tensors.dtype_name(v)
        if got not in flat:
            raise _err(op.name, name, "dtype " + " or ".join(flat), f"dtype {got}")
        if takes_t and got in op.dtypes and got not in declared:
            if first is None:
                first = (name, got)
            elif got != first[1]:
                raise _err(
                    op.name, name, f"dtype {first[1]} (the dtype of {first[0]!r})",
                    f"dtype {got}",
                )  # fmt: skip
    if first is None:
        if len(op.dtypes) == 1:  # an op with one compute dtype (int8 in, float32 out) has it
            return op.dtypes[0]
        raise TypeError(f"{op.name}: no floating tensor argument fixes the compute dtype")
    return first[1]
