"""refcore's optimizers as torch optimizers: torch's classes whose ``step`` runs refcore kernels.

`SGD`, `Adagrad`, `Adam`, `AdamW` subclass torch's own classes and `Lamb` the plain torch Lamb
of refcore.oracles, so they take the same arguments, keep the same state under the same names
and their ``state_dict`` moves to and from torch's optimizers unchanged. Two arguments are added:

- ``master``: ``"float32"`` (default) or ``"split_bf16"``. A split-BF16 group trains bfloat16
  parameters with the exactness of float32 masters at no extra memory: the parameter holds the
  master's top 16 bits (what the model computes with) and the state ``"bottom"`` (int16) the
  other 16; each step joins them, steps in float32 and splits again (specs/optim.yaml). float32
  parameters given to such a group become bfloat16 (their top halves) at construction, their
  trailing halves kept, as `ipex.optimize` does for training; `master_weight` returns a
  parameter's float32 master.
- ``provider``: which kernels may run (``"auto"``, or a provider name as in `refcore.run`).

Each step groups a parameter group's tensors by their step count and gradient dtype and runs
each set as one multi-tensor step call (`refcore.optim.call`). Under ``"auto"`` a float32 group
runs the best provider kernel that is no correctness fallback, else torch's own step (for
sparse gradients, ``differentiable`` or ``capturable`` groups, a CPU without a vector kernel);
a split-BF16 group, which torch cannot step, runs the best kernel that accepts it, the reference
last. `routes` says what ran for each set in the last step and why.

Example:
    >>> import torch, refcore.optim
    >>> w = torch.nn.Parameter(torch.ones(4))
    >>> opt = refcore.optim.SGD([w], lr=0.5)
    >>> w.grad = torch.ones(4); opt.step(); w.tolist()
    [0.5, 0.5, 0.5, 0.5]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from refcore import dispatch, oracles, tensors
from refcore.ops import optim as rules
from refcore.optim import call as calls

MASTERS = ("float32", "split_bf16")
_BOTTOM = "bottom"


class _Front:
    """What the five classes share: ``master`` / ``provider``, the grouped kernel steps, the
    split-BF16 state, and `state_dict` loading that keeps float32 state float32."""

    _torch_step: Callable[..., Any]

    def _setup(self, master: str, provider: str) -> None:
        if master not in MASTERS:
            raise ValueError(f"{type(self).__name__}: argument 'master' expected one of "
                             f"{list(MASTERS)}; got {master!r}")  # fmt: skip
        self.defaults["master"], self.defaults["provider"] = master, provider
        self.routes: list[str] = []
        self._plans: dict[int, _Plan] = {}
        for group in self.param_groups:
            self._adopt(group, master, provider)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # type: ignore[misc]
        if "master" in self.defaults:  # not during torch's __init__: _setup adopts those
            group = self.param_groups[-1]  # type: ignore[attr-defined]
            self._adopt(group, group["master"], group["provider"])

    def _adopt(self, group: dict[str, Any], master: str, provider: str) -> None:
        group.setdefault("master", master)
        group.setdefault("provider", provider)
        if group["master"] != "split_bf16":
            return
        for p in group["params"]:
            if p.dtype not in (torch.float32, torch.bfloat16):
                raise TypeError(f"{type(self).__name__}: a split_bf16 master needs float32 or "
                                f"bfloat16 parameters; got {p.dtype}")  # fmt: skip
            state = self.state[p]  # type: ignore[attr-defined]
            if p.dtype == torch.float32:  # keep the float32 value as the master: split it
                bits = p.detach().contiguous().view(torch.int32)
                state[_BOTTOM] = (bits & 0xFFFF).to(torch.int16)
                p.data = (bits >> 16).to(torch.int16).view(torch.bfloat16)
                p.grad = None
            for k, v in list(state.items()):  # torch made them in the parameter's dtype
                if k not in ("step", _BOTTOM) and torch.is_tensor(v) and v.dtype != torch.float32:
                    state[k] = v.to(torch.float32)

    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s float32 master: for a split-BF16 parameter its two halves joined bit for bit
        (a new tensor), else ``p`` as float32."""
        bottom = self.state[p].get(_BOTTOM) if p.dtype == torch.bfloat16 else None  # type: ignore[attr-defined]
        if bottom is None:
            return p.detach().float()
        top = p.detach().view(torch.int16).to(torch.int32) << 16
        return (top | (bottom.to(torch.int32) & 0xFFFF)).view(torch.float32)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading, except that a split-BF16 parameter's state keeps its float32 and
        int16 tensors (torch casts every floating state to the parameter's dtype)."""
        saved = state_dict["state"]
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)  # type: ignore[misc]
        params = [p for g in self.param_groups for p in g["params"]]  # type: ignore[attr-defined]
        for i, p in zip(ids, params):
            if p.dtype != torch.bfloat16 or i not in saved:
                continue
            for k, v in saved[i].items():
                if torch.is_tensor(v) and k != "step" and v.dtype in (torch.float32, torch.int16):
                    self.state[p][k] = v.clone()  # type: ignore[attr-defined]

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.routes = []
        to_torch = []
        for gi, group in enumerate(self.param_groups):  # type: ignore[attr-defined]
            why = self._torch_only(group)
            if why and group["master"] == "float32":
                to_torch.append(group)
                self.routes.append(f"group {gi}: torch ({why})")
                continue
            if why:
                raise RuntimeError(f"{type(self).__name__}: a split_bf16 group cannot run: {why}")
            rule = self._rule(group)
            spec = calls.default_registry().optimizers[rule]
            hp = calls.hyperparameters(spec, {k: group[k] for k in spec.hyperparameters})
            need = rules.state_names(rule, **hp)
            plan = self._plans.get(gi)
            if plan is not None and plan.fits(self.state, group, rule, need):  # type: ignore[attr-defined]
                grads = plan.grads()
                if grads is not None:
                    plan.run(grads, hp)
                    self.routes.append(plan.route)
                    continue
            self._plans.pop(gi, None)
            for ps in self._sets(group, need):
                self._run(gi, group, rule, hp, need, ps, to_torch)
        if to_torch:
            self._torch_groups(to_torch)
        return loss

    def _torch_only(self, group: dict[str, Any]) -> str:
        for flag in ("differentiable", "capturable"):
            if group.get(flag):
                return f"{flag}=True"
        for p in group["params"]:
            if p.grad is not None and (p.grad.is_sparse or p.is_complex()):
                return "sparse gradients or complex parameters"
        return ""

    def _sets(self, group: dict[str, Any], need: tuple[str, ...]) -> Iterator[list[torch.Tensor]]:
        """The group's parameters with a gradient, by (step count, fresh, gradient dtype)."""
        sets: dict[tuple, list[torch.Tensor]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state[p]  # type: ignore[attr-defined]
            fresh = not all(k in st for k in need)
            key = (float(st["step"]) if "step" in st else 0.0, fresh, p.grad.dtype)
            sets.setdefault(key, []).append(p)
        yield from sets.values()

    def _rule(self, group: dict[str, Any]) -> str:
        raise NotImplementedError

    def _run(self, gi: int, group: dict[str, Any], rule: str, hp: dict[str, Any],
             need: tuple[str, ...], ps: list[torch.Tensor], to_torch: list) -> None:  # fmt: skip
        split = group["master"] == "split_bf16"
        states, fresh, made = [], False, []  # state made here is kept only if a kernel runs
        for p in ps:
            st = self.state[p]  # type: ignore[attr-defined]
            new = {k: torch.zeros(p.shape, dtype=torch.float32) for k in need if k not in st}
            if split and _BOTTOM not in st:
                new[_BOTTOM] = torch.zeros(p.shape, dtype=torch.int16)
            if any(k in need for k in new):
                fresh = True
                if "step" not in st and rule != "sgd":
                    new["step"] = torch.tensor(0.0)
            made.append(new)
            states.append({k: new[k] if k in new else st[k] for k in need})
        n = int(float(self.state[ps[0]].get("step", 0.0))) + 1  # type: ignore[attr-defined]
        bottoms = None
        if split:
            bottoms = [m.get(_BOTTOM, self.state[p].get(_BOTTOM)) for p, m in zip(ps, made)]  # type: ignore[attr-defined]
        c = calls.bind(rule, ps, [p.grad for p in ps], states, step=n, bottoms=bottoms,
                       fresh=fresh, **hp)  # fmt: skip
        provider = group["provider"]
        if provider == dispatch.AUTO:
            found, _ = dispatch.accepting(c)  # type: ignore[arg-type]
            pick = found[0] if found else None
            if pick is None and not split:
                why = calls.explain_call(c)
                self.routes.append(f"group {gi}: torch (no fast kernel accepts it)\n{why}")
                to_torch.append({**group, "params": ps})
                return
            if pick is None:
                pick = dispatch.first_with_provider(c)  # type: ignore[arg-type]
        else:
            pick = dispatch.first_with_provider(c, provider)  # type: ignore[arg-type]
            if pick is None:
                raise dispatch.ProviderUnavailableError(str(calls.explain_call(c, provider)))
        for p, new in zip(ps, made):
            self.state[p].update(new)  # type: ignore[attr-defined]
        calls.run(c, pick[1])
        route = f"group {gi}: {pick[0]}/{pick[1].name} ({len(ps)} tensors)"
        self.routes.append(route)
        steps = [self.state[p]["step"] for p in ps if "step" in self.state[p]]  # type: ignore[attr-defined]
        if steps:
            torch._foreach_add_(steps, 1.0)
        if len(ps) == sum(p.grad is not None for p in group["params"]):  # the whole group ran
            self._plans[gi] = _Plan(self.state, group, need, ps, c, pick[1], route, steps, n)  # type: ignore[attr-defined]

    def _torch_groups(self, groups: list[dict[str, Any]]) -> None:
        """torch's own step over ``groups`` (its class's ``step``, given just those groups)."""
        mine = self.param_groups  # type: ignore[attr-defined]
        self.param_groups = groups  # type: ignore[attr-defined]
        try:
            self._torch_step()
        finally:
            self.param_groups = mine  # type: ignore[attr-defined]


class _Plan:
    """A group's step as it last ran. While the group's parameters with a gradient, their memory
    and their state tensors stay the same objects (no ``p.data`` swap, no `load_state_dict`),
    the next step re-binds only the gradients and the hyper-parameters: binding a whole step
    call costs ~40 us a tensor, this a few. A gradient of another dtype, shape or layout, or one
    at a planned array's address, takes the full path (which checks and may route elsewhere)."""

    def __init__(self, state: Any, group: dict[str, Any], need: tuple[str, ...],
                 ps: list[torch.Tensor], call: calls.StepCall, kernel: Any, route: str,
                 steps: list[torch.Tensor], n: int) -> None:  # fmt: skip
        self.ps, self.need, self.kernel, self.route = ps, need, kernel, route
        self.steps, self.n = steps, n
        self.master, self.provider = group["master"], group["provider"]
        self.rule = call.op.name  # Adam's decoupled_weight_decay may switch it to adamw
        self.ptrs = [p.data_ptr() for p in ps]
        self.objs = [tuple((k, v) for k, v in state[p].items() if torch.is_tensor(v)) for p in ps]
        self.taken = {int(a.__array_interface__["data"][0]) for _, a in call.tensors()
                      if not _.startswith("grads")}  # fmt: skip
        self.gdtype = ps[0].grad.dtype
        a = call.arguments
        self.args = {"params": a["params"], "bottoms": a["bottoms"], "states": a["states"]}

    def fits(self, state: Any, group: dict[str, Any], rule: str, need: tuple[str, ...]) -> bool:
        now = (group["master"], group["provider"], rule, need)
        if now != (self.master, self.provider, self.rule, self.need):
            return False
        ps = [p for p in group["params"] if p.grad is not None]
        if len(ps) != len(self.ps) or any(a is not b for a, b in zip(ps, self.ps)):
            return False
        for p, ptr, objs in zip(ps, self.ptrs, self.objs):
            st = state[p]
            if p.data_ptr() != ptr or any(st.get(k) is not v for k, v in objs):
                return False
        return True

    def grads(self) -> list | None:
        out = []
        for p in self.ps:
            g = p.grad
            if (g.dtype != self.gdtype or g.shape != p.shape or not g.is_contiguous()
                    or g.data_ptr() in self.taken):  # fmt: skip
                return None
            out.append(tensors.to_numpy(g))
        return out

    def run(self, grads: list, hp: dict[str, Any]) -> None:
        self.n += 1
        self.kernel.fn(**self.args, grads=grads, step=self.n, fresh=False, **hp)
        if self.steps:
            torch._foreach_add_(self.steps, 1.0)


def _init(self: Any, base: type, params: Any, args: tuple, kwargs: dict) -> None:
    master = kwargs.pop("master", "float32")
    provider = kwargs.pop("provider", dispatch.AUTO)
    base.__init__(self, params, *args, **kwargs)
    self._setup(master, provider)


class SGD(_Front, torch.optim.SGD):
    """torch.optim.SGD stepped by refcore kernels (module doc); adds ``master``, ``provider``."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, torch.optim.SGD, params, args, kwargs)

    def _rule(self, group: dict[str, Any]) -> str:
        return "sgd"

    def _torch_step(self) -> None:
        torch.optim.SGD.step(self)


class Adagrad(_Front, torch.optim.Adagrad):
    """torch.optim.Adagrad stepped by refcore kernels (module doc)."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, torch.optim.Adagrad, params, args, kwargs)
        for group in self.param_groups:  # torch made ``sum`` in the parameter's dtype
            if group["master"] == "split_bf16":
                for p in group["params"]:
                    st = self.state[p]
                    st["sum"] = torch.full(p.shape, group["initial_accumulator_value"],
                                           dtype=torch.float32)  # fmt: skip

    def _rule(self, group: dict[str, Any]) -> str:
        return "adagrad"

    def _torch_step(self) -> None:
        torch.optim.Adagrad.step(self)


class Adam(_Front, torch.optim.Adam):
    """torch.optim.Adam stepped by refcore kernels (module doc); ``decoupled_weight_decay``
    makes it AdamW, as in torch."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, torch.optim.Adam, params, args, kwargs)

    def _rule(self, group: dict[str, Any]) -> str:
        return "adamw" if group.get("decoupled_weight_decay") else "adam"

    def _torch_step(self) -> None:
        torch.optim.Adam.step(self)


class AdamW(_Front, torch.optim.AdamW):
    """torch.optim.AdamW stepped by refcore kernels (module doc)."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, torch.optim.AdamW, params, args, kwargs)

    def _rule(self, group: dict[str, Any]) -> str:
        return "adamw"

    def _torch_step(self) -> None:
        torch.optim.AdamW.step(self)


class Lamb(_Front, oracles.Lamb):
    """Lamb (specs/optim.yaml) stepped by refcore kernels; torch has no Lamb, so its torch step
    is refcore.oracles.Lamb's plain torch one."""

    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, oracles.Lamb, params, args, kwargs)

    def _rule(self, group: dict[str, Any]) -> str:
        return "lamb"

    def _torch_step(self) -> None:
        oracles.Lamb.step(self)


__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Lamb"]
