"""Run an op: normalise the call once, rank candidate kernels, run the first that accepts.

`explain` uses the same ranking as `run`, so what it prints is what runs. Ranking is deterministic:
provider priority, then kernel priority, then names; the reference provider comes last, as the
fallback of last resort. With ``provider="auto"`` a declined kernel is a recorded fallback (shown by
`explain`); with an explicit provider that cannot run the call, `run` raises and says why.

Example:
    >>> import numpy as np
    >>> run("relu", np.array([-1.0, 2.0], np.float32), provider="reference")
    array([0., 2.], dtype=float32)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from refcore import cpu
from refcore.call import Call, Plan, bind, plan, structure_key
from refcore.provider import Kernel, Provider, installed
from refcore.registry import default_registry

AUTO = "auto"


class ProviderUnavailableError(RuntimeError):
    """An explicitly requested provider cannot run the call (unavailable, or all declined)."""


@dataclass(frozen=True)
class Candidate:
    provider: str
    kernel: str
    verdict: str  # "chosen", "declined: <reason>", "not tried", "provider unavailable: <reason>"


@dataclass(frozen=True)
class Explanation:
    op: str
    requested: str
    dtype: str
    chosen: tuple[str, str] | None
    candidates: tuple[Candidate, ...]

    def __str__(self) -> str:
        head = f"{self.op} [{self.dtype}] provider={self.requested}: "
        head += f"runs {self.chosen[0]}/{self.chosen[1]}" if self.chosen else "no kernel can run it"
        width = max((len(f"{c.provider}/{c.kernel}") for c in self.candidates), default=0)
        rows = [f"  {c.provider + '/' + c.kernel:<{width}}  {c.verdict}" for c in self.candidates]
        return "\n".join([head, *rows])


def _candidates(op: str, requested: str) -> list[tuple[Provider, Kernel | None]]:
    provs = installed()
    if requested != AUTO and requested not in provs:
        raise ValueError(
            f"{op}: unknown provider {requested!r}; known: {', '.join([AUTO, *sorted(provs)])}"
        )
    chosen = [provs[requested]] if requested != AUTO else list(provs.values())
    chosen.sort(key=lambda p: (-p.priority, p.name))
    out: list[tuple[Provider, Kernel | None]] = []
    for p in chosen:
        kernels = p.kernels_for(op)
        if not kernels and requested == AUTO:
            continue  # never probe (or build) a provider that has nothing for this op
        if not p.availability().available:
            out.append((p, None))
            continue
        out.extend((p, k) for k in kernels)
    return out


def select(call: Call, requested: str = AUTO) -> tuple[Kernel | None, Explanation]:
    """Rank candidates for ``call`` and return the first kernel that accepts, with the reasons."""
    chosen: Kernel | None = None
    rows: list[Candidate] = []
    for prov, kern in _candidates(call.op.name, requested):
        if kern is None:
            rows.append(
                Candidate(prov.name, "*", f"provider unavailable: {prov.availability().reason}")
            )
            continue
        if chosen is not None:
            rows.append(Candidate(prov.name, kern.name, "not tried"))
            continue
        verdict = kern.supports(call)
        if verdict:
            chosen = kern
            rows.append(Candidate(prov.name, kern.name, "chosen"))
        else:
            rows.append(Candidate(prov.name, kern.name, f"declined: {verdict.reason}"))
    if requested != AUTO and not any(r.provider == requested for r in rows):
        rows.append(Candidate(requested, "*", f"implements no kernel for {call.op.name}"))
    pick = None
    if chosen is not None:
        pick = next((r.provider, r.kernel) for r in rows if r.verdict == "chosen")
    return chosen, Explanation(call.op.name, requested, call.dtype, pick, tuple(rows))


def first(call: Call, requested: str = AUTO) -> Kernel | None:
    """The kernel `select` would choose, without building the explanation (the hot path)."""
    found = first_with_provider(call, requested)
    return found[1] if found else None


def first_with_provider(call: Call, requested: str = AUTO) -> tuple[str, Kernel] | None:
    """(provider name, kernel) of `first`, or None."""
    for prov, kern in _candidates(call.op.name, requested):
        if kern is not None and kern.supports(call):
            return prov.name, kern
    return None


def accepting(call: Call, requested: str = AUTO) -> tuple[list[tuple[str, Kernel]], list[str]]:
    """For routing: the first kernel of each provider (``requested``, or every one but the
    reference under auto) that accepts ``call`` and is no correctness fallback (`Kernel.fallback`),
    best provider first; and why each fallback that accepted was passed over."""
    found: list[tuple[str, Kernel]] = []
    passed: list[str] = []
    declined: dict[str, str] = {}  # per provider: why its first fast kernel declined
    for prov, kern in _candidates(call.op.name, requested):
        if kern is None or any(p == prov.name for p, _ in found):
            continue
        if requested == AUTO and prov.name == "reference":
            continue
        verdict = kern.supports(call)
        if not verdict:
            if not kern.fallback:
                declined.setdefault(prov.name, f"{kern.name} declined: {verdict.reason}")
            continue
        if kern.fallback and prov.name != "reference":
            # the telling reason is the fast kernel's refusal, not the fallback's existence
            why = f"; {declined[prov.name]}" if prov.name in declined else ""
            passed.append(f"{prov.name}/{kern.name} is a correctness fallback, not a speed "
                          f"choice{why}")  # fmt: skip
            continue
        found.append((prov.name, kern))
    return found, passed


def run(op: str, *args: Any, provider: str = AUTO, **kwargs: Any) -> Any:
    """Run ``op`` on NumPy arrays or torch CPU tensors; return the same kind.

    ``provider`` is ``"auto"`` (best kernel that accepts the call) or a provider name; an explicit
    provider that cannot run the call raises `ProviderUnavailableError` with the reasons.
    """
    provs = installed()
    key = structure_key((op, provider, cpu.level(), id(provs)), args, kwargs)
    known = _runs.get(key) if key is not None else None
    if known is not None and known[0] is provs:  # seen before (same providers): no checks
        call = known[2].bind(args, kwargs)
        return call.wrap(known[1](call))
    call = bind(default_registry().op(op), args, kwargs)
    kernel = first(call, provider)
    if kernel is None:
        raise ProviderUnavailableError(str(select(call, provider)[1]))
    p = plan(call, args, kwargs) if key is not None else None
    if p is not None:
        if len(_runs) > 4096:  # a bound, for programs with ever-changing shapes
            _runs.clear()
        _runs[key] = (provs, kernel, p)  # holding provs keeps its id from being reused
    return call.wrap(kernel(call))


# run's memo: structure key -> (the provider set it was chosen in, kernel, Plan). A kernel's
# verdict depends only on the call's structure, so a call of a seen structure goes straight to it.
_runs: dict[Any, tuple[dict[str, Provider], Kernel, Plan]] = {}


def explain(op: str, *args: Any, provider: str = AUTO, **kwargs: Any) -> Explanation:
    """Which kernel `run` would choose for this call, and why each other candidate was not."""
    call = bind(default_registry().op(op), args, kwargs)
    return select(call, provider)[1]
