"""One optimizer step as a call: bind and check its arguments once, then dispatch like an op.

A step call updates, in place, a list of parameters (one optimizer's parameter group), their
state and, for a split-BF16 master, the trailing halves. Its kernels are `refcore.Kernel` objects
whose ``op`` names the optimizer (specs/optim.yaml) and whose ``dtypes`` name the masters they
update (``float32``, ``split_bf16``); dispatch ranks and asks them exactly as it does an op's, so
`step` and `explain` mean what `refcore.run` and `refcore.explain` mean. A kernel's function is
called as ``fn(params, bottoms, grads, states, step, fresh, **hp)`` (see
`refcore.ops.optim.in_place`, the reference provider's).

Example:
    >>> import numpy as np
    >>> p, g = np.float32([1.0, 2.0]), np.float32([0.5, -1.0])
    >>> step("sgd", [p], [g], [{}], step=1, lr=0.1, provider="reference")
    ('reference', 'reference')
    >>> p.tolist()
    [0.949999988079071, 2.0999999046325684]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refcore import dispatch, tensors
from refcore.call import layout_of
from refcore.ops import optim as rules
from refcore.registry import default_registry
from refcore.spec import OptimizerSpec

GRAD_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class StepCall:
    """A checked step: the arrays (NumPy views of the caller's memory) and canonical
    hyper-parameters. ``dtype`` is the master's storage (``float32`` or ``split_bf16``)."""

    op: OptimizerSpec
    arguments: Mapping[str, Any]
    dtype: str
    grad_dtype: str
    named: Mapping[str, np.ndarray] = field(repr=False)

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(name, array) of every array the step reads or writes: ``params[0]``,
        ``grads[0]``, ``states[0].exp_avg``..."""
        yield from self.named.items()

    def layout(self, name: str) -> str:
        return layout_of(self.named[name])


def _fail(op: str, arg: str, expected: str, got: Any, exc: type[Exception] = ValueError):
    raise exc(f"{op}: argument {arg!r} expected {expected}; got {got}")


def _array(op: str, arg: str, v: Any) -> np.ndarray:
    if tensors.is_torch(v):
        if v.device.type != "cpu":
            _fail(op, arg, "a CPU tensor", f"a tensor on {v.device}")
        if v.is_sparse or v.is_complex():
            _fail(op, arg, "a dense real tensor", "a sparse or complex tensor", TypeError)
        return tensors.to_numpy(v)
    if not isinstance(v, np.ndarray):
        _fail(op, arg, "a NumPy array or torch tensor", type(v).__name__, TypeError)
    return v


def hyperparameters(spec: OptimizerSpec, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` completed with the spec's defaults and made canonical (floats, bools, a tuple
    of two betas); unknown names, non-finite or negative numbers and betas outside [0, 1) fail,
    as does nesterov without momentum or with dampening (torch's rule)."""
    op = spec.name
    unknown = set(given) - set(spec.hyperparameters)
    if unknown:
        known = ", ".join(spec.hyperparameters)
        _fail(op, sorted(unknown)[0], f"one of the hyper-parameters {known}", "an unknown name",
              TypeError)  # fmt: skip
    hp: dict[str, Any] = {}
    for name, raw in spec.hyperparameters.items():
        v = given.get(name, raw["default"])
        if isinstance(raw["default"], bool):
            if not isinstance(v, (bool, np.bool_)):
                _fail(op, name, "a bool", repr(v), TypeError)
            hp[name] = bool(v)
        elif isinstance(raw["default"], list):
            if len(v) != 2 or not all(0.0 <= float(b) < 1.0 for b in v):
                _fail(op, name, "two betas in [0, 1)", repr(v))
            hp[name] = (float(v[0]), float(v[1]))
        else:
            x = float(v.item() if hasattr(v, "item") else v)  # torch allows a tensor lr
            if not math.isfinite(x) or x < 0:
                _fail(op, name, "a finite number >= 0", repr(v))
            hp[name] = x
    if hp.get("nesterov") and (hp["momentum"] <= 0 or hp["dampening"] != 0):
        _fail(op, "nesterov", "momentum > 0 and dampening 0 with it",
              f"momentum={hp['momentum']}, dampening={hp['dampening']}")  # fmt: skip
    return hp


def bind(name: str, params: Sequence[Any], grads: Sequence[Any], states: Sequence[Any], *,
         step: int, bottoms: Sequence[Any] | None = None, fresh: bool = False,
         **hp: Any) -> StepCall:  # fmt: skip
    """Check a step's arguments (optimizer, arrays, state names, hyper-parameters) and return
    the `StepCall`; errors name the optimizer, the argument, what was expected and given."""
    reg = default_registry()
    if name not in reg.optimizers:
        _fail("step", "name", f"one of {sorted(reg.optimizers)}", repr(name))
    spec = reg.optimizers[name]
    hps = hyperparameters(spec, hp)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        _fail(name, "step", "an int >= 1 (the 1-based number of this step)", repr(step))
    n = len(params)
    for arg, seq in (("grads", grads), ("states", states), ("bottoms", bottoms)):
        if seq is not None and len(seq) != n:
            _fail(name, arg, f"{n} entries, one per parameter", f"{len(seq)}")
    master = "float32" if bottoms is None else "split_bf16"
    if master not in spec.masters:
        _fail(name, "bottoms", f"a master among {list(spec.masters)}", master)
    want_p = "float32" if master == "float32" else "bfloat16"
    need = rules.state_names(name, **hps)
    named: dict[str, np.ndarray] = {}
    ps, bs, gs, ss = [], [] if bottoms is not None else None, [], []
    grad_dtype = ""
    for i in range(n):
        p = named[f"params[{i}]"] = _array(name, f"params[{i}]", params[i])
        if tensors.dtype_name(p) != want_p:
            _fail(name, f"params[{i}]", f"dtype {want_p} (a {master} master)",
                  tensors.dtype_name(p), TypeError)  # fmt: skip
        if not p.flags.writeable:
            _fail(name, f"params[{i}]", "a writeable array (the step writes it)", "a read-only one")
        g = named[f"grads[{i}]"] = _array(name, f"grads[{i}]", grads[i])
        gd = tensors.dtype_name(g)
        if gd not in GRAD_DTYPES or gd != (grad_dtype or gd):
            _fail(name, f"grads[{i}]", f"dtype {grad_dtype or ' or '.join(GRAD_DTYPES)}", gd,
                  TypeError)  # fmt: skip
        grad_dtype = gd
        if g.shape != p.shape:
            _fail(name, f"grads[{i}]", f"shape {p.shape}", f"shape {g.shape}")
        if bs is not None:
            b = named[f"bottoms[{i}]"] = _array(name, f"bottoms[{i}]", bottoms[i])
            if b.dtype not in (np.uint16, np.int16) or b.shape != p.shape:
                _fail(name, f"bottoms[{i}]", f"a 16-bit integer array of shape {p.shape}",
                      f"{tensors.dtype_name(b)} of shape {b.shape}")  # fmt: skip
            if not b.flags.writeable:
                _fail(name, f"bottoms[{i}]", "a writeable array", "a read-only one")
            bs.append(b.view(np.uint16))
        s = states[i]
        if not isinstance(s, Mapping) or set(s) != set(need):
            got = sorted(s) if isinstance(s, Mapping) else type(s).__name__
            _fail(name, f"states[{i}]", f"a mapping of exactly {list(need)}", got)
        st = {}
        for k in need:
            a = named[f"states[{i}].{k}"] = _array(name, f"states[{i}].{k}", s[k])
            if a.dtype != np.float32 or a.shape != p.shape or not a.flags.writeable:
                _fail(name, f"states[{i}].{k}", f"a writeable float32 array of shape {p.shape}",
                      f"{tensors.dtype_name(a)} of shape {a.shape}")  # fmt: skip
            st[k] = a
        ps.append(p)
        gs.append(g)
        ss.append(st)
    _no_overlap(name, named)
    args = dict(params=ps, bottoms=bs, grads=gs, states=ss, step=int(step), fresh=bool(fresh))
    return StepCall(spec, {**args, **hps}, master, grad_dtype or "float32", named)


def _no_overlap(op: str, named: Mapping[str, np.ndarray]) -> None:
    """Every array a step writes must be its own memory: a kernel writing a parameter while
    reading it through another name would depend on its own order of work."""
    spans = sorted(
        (a.__array_interface__["data"][0], a.nbytes, k) for k, a in named.items() if a.nbytes
    )
    for (s0, n0, k0), (s1, _, k1) in itertools.pairwise(spans):
        if s1 < s0 + n0:
            _fail(op, k1, "memory of its own", f"memory shared with {k0!r}")


def step(name: str, params: Sequence[Any], grads: Sequence[Any], states: Sequence[Any], *,
         step: int, bottoms: Sequence[Any] | None = None, fresh: bool = False,
         provider: str = dispatch.AUTO, **hp: Any) -> tuple[str, str]:  # fmt: skip
    """Take one step of optimizer ``name`` over ``params`` in place (NumPy arrays or torch CPU
    tensors); return the (provider, kernel) that ran. ``states[i]`` maps the names
    `refcore.ops.optim.state_names` gives to float32 arrays; with ``fresh`` they are started as
    `refcore.ops.optim.initial_state` first. ``bottoms`` (16-bit arrays) makes the params the
    bf16 top halves of split-BF16 masters.

    Like `refcore.run`: ``provider="auto"`` runs the best kernel that accepts the call (the
    reference last); an explicit provider that cannot raises `ProviderUnavailableError`."""
    call = bind(name, params, grads, states, step=step, bottoms=bottoms, fresh=fresh, **hp)
    found = dispatch.first_with_provider(call, provider)  # type: ignore[arg-type]
    if found is None:
        raise dispatch.ProviderUnavailableError(str(explain_call(call, provider)))
    run(call, found[1])
    return found[0], found[1].name


def run(call: StepCall, kernel: Any) -> None:
    """Run ``kernel`` on ``call``, first starting a ``fresh`` state as the rule does."""
    if call.arguments["fresh"]:
        hp = {k: call.arguments[k] for k in call.op.hyperparameters}
        for st in call.arguments["states"]:
            for k, v in rules.initial_state(call.op.name, (), **hp).items():
                st[k][...] = v
    kernel(call)


def explain_call(call: StepCall, provider: str = dispatch.AUTO) -> dispatch.Explanation:
    return dispatch.select(call, provider)[1]  # type: ignore[arg-type]


def explain(name: str, params: Sequence[Any], grads: Sequence[Any], states: Sequence[Any], *,
            step: int, bottoms: Sequence[Any] | None = None, fresh: bool = False,
            provider: str = dispatch.AUTO, **hp: Any) -> dispatch.Explanation:  # fmt: skip
    """Which kernel `step` would run for these arguments, and why each other one would not."""
    call = bind(name, params, grads, states, step=step, bottoms=bottoms, fresh=fresh, **hp)
    return explain_call(call, provider)
