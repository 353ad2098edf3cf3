"""Pass: apply the patterns of ``specs/fusions.yaml`` (matched by `refcore.patterns`).

One mechanism for every pattern-driven rewrite; a fusion's ``stage`` says which pass applies it:
``fold_bn`` (batch-norm recognition, `refcore.passes.fold_bn`), ``attention`` (eager attention ->
SDPA, `fuse_attention`) and ``fuse`` (everything else, `fuse`). A match becomes:

- a fused op (tag ``fused``): one node calling `refcore.integration.FusedOp`, only when a
  provider has a kernel routing runs here (``implemented``), else the pattern is left unfused
  and noted;
- a plain spec'd op (SDPA, rms_norm): a call of its torch function, which routing sends to a
  provider's kernel when one accepts it; where that function is an adapter of refcore.oracles
  (gather_scatter), a `refcore.integration.RoutedOp` node for the op routes it;
- with ``rewrite``: whatever that callable returns (None: no change);
- without ``op``: nothing; the matches are counted and noted.

With ``outputs`` the replacement returns a tuple: its first item replaces the root, the others
the named intermediates. Matches that fail a ``where`` condition or their containment check are
noted with the reason; so are fused-op arguments a pattern captured as Python numbers where the
op takes a tensor (``x + 1.0``).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable
from typing import Any

from torch import fx

from refcore.dispatch import AUTO
from refcore.passes import eliminate_dead_code
from refcore.patterns import Match, Unknown, evaluate, match, op_calls, plays
from refcore.registry import default_registry, resolve
from refcore.spec import FusionSpec


def rewrite(gm: fx.GraphModule, stage: str, provider: str = AUTO,
            implemented: Iterable[str] | None = None, notes: list[str] | None = None,
            fusions: Iterable[FusionSpec] | None = None) -> dict[str, int]:  # fmt: skip
    """Apply the fusions of ``stage`` to ``gm`` (in place); return {fusion: replaced count}.

    ``implemented``: the fused ops a match may become (None: all). ``fusions``: the patterns
    to choose from (default: those of specs/fusions.yaml).
    """
    reg = default_registry()
    notes = notes if notes is not None else []
    have = None if implemented is None else set(implemented)
    pool = reg.fusions.values() if fusions is None else fusions
    order = [f for f in pool if f.stage == stage]
    order.sort(key=lambda f: -f.pattern.nodes())  # larger patterns first; else file order
    done: dict[str, int] = {}
    for fusion in order:
        count, reported, declined, first = 0, 0, Counter[str](), {}
        fused = fusion.op is not None and "fused" in reg.op(fusion.op).tags
        roots = [op_calls(o) for o in fusion.pattern.ops]
        for node in list(gm.graph.nodes):
            if node.graph is not gm.graph or not any(plays(r, node) for r in roots):
                continue  # erased by an earlier match, or not the root's op
            m, why = match(fusion, node, gm)
            if m is None:
                if why.startswith("where "):  # a full match the graph's facts decided against
                    declined[why.split("': ")[0] + "'"] += 1
                    first.setdefault(why.split("': ")[0] + "'", why)
                continue
            if fusion.op is None and fusion.rewrite is None:
                reported += 1
                continue
            if fused and have is not None and fusion.op not in have:
                why = f"no provider has a {fusion.op} kernel this CPU runs other than a fallback"
                notes.append(f"{fusion.name}: left unfused ({why})")
                break
            why = _replace(gm, fusion, m, provider)
            if why:
                declined[why] += 1
                first.setdefault(why, why)
            else:
                count += 1
        if count:
            done[fusion.name] = count
            if fused:
                notes.append(f"{fusion.name}: fused {count} chain(s) into {fusion.op}")
            else:
                notes.append(f"{fusion.name}: {count} match(es) -> {fusion.op or fusion.rewrite}")
        if reported:
            notes.append(f"{fusion.name}: {reported} match(es) found, left as they are "
                         "(no fused op declared)")  # fmt: skip
        for why, n in declined.items():
            notes.append(f"{fusion.name}: {n} match(es) left ({first[why]})")
    gm.graph.lint()
    gm.recompile()
    return done


def _replace(gm: fx.GraphModule, fusion: FusionSpec, m: Match, provider: str) -> str:
    """Replace the match in the graph; return "" or why it was not replaced."""
    g = gm.graph
    with g.inserting_before(m.root):
        if fusion.rewrite is not None:
            new = resolve(fusion.rewrite)(gm, m)
            if isinstance(new, str) or new is None:
                return new or "the rewrite declined"
        else:
            call = _call(gm, fusion, m, provider)
            if isinstance(call, str):
                return call
            target, args, kwargs = call
            new = g.call_function(target, args, kwargs)
            new.meta.update(m.root.meta)
    inside = set(m.nodes)
    if fusion.outputs:
        outs = [m.root, *(m.captures[o] for o in fusion.outputs)]
        for i, old in reversed(list(enumerate(outs))):
            with g.inserting_after(new):
                item = g.call_function(operator.getitem, (new, i))
            old.replace_all_uses_with(item, delete_user_cb=lambda u: u not in inside)
    elif new is not m.root:
        m.root.replace_all_uses_with(new)
    position = {n: i for i, n in enumerate(g.nodes)}
    for n in sorted(m.nodes, key=position.__getitem__, reverse=True):  # users before inputs
        if n is not new and not n.users:
            g.erase_node(n)
    return ""


def _call(gm: fx.GraphModule, fusion: FusionSpec, m: Match, provider: str
          ) -> tuple[Any, tuple, dict] | str:  # fmt: skip
    """(target, args, kwargs) of the replacing node, or why there is none."""
    from refcore.integration import FusedOp

    spec = default_registry().op(fusion.op)
    values: dict[str, Any] = {}
    for a in spec.signature.args:
        if a.name in dict(fusion.args):
            try:
                values[a.name] = _expr(dict(fusion.args)[a.name], m.captures, gm)
            except Unknown as e:
                return f"{a.name}: unknown, {e}"
        elif a.name in m.captures:
            v = m.captures[a.name]
            if a.has_default and not isinstance(v, fx.Node) and v == a.default:
                continue  # left at its default, as the graph wrote it
            values[a.name] = v
    if "fused" in spec.tags:
        for a in spec.signature.tensor_args:
            v = values.get(a.name)
            if v is not None and not isinstance(v, fx.Node):
                return f"{a.name} is the number {v!r} where {fusion.op} takes a tensor"
        return FusedOp(fusion.op, provider), (), values
    lead = []
    for a in spec.signature.positional:
        if a.has_default or a.name not in values:
            break
        lead.append(values.pop(a.name))
    if spec.torch.function.startswith("refcore."):  # an adapter no torch call routes through
        from refcore.integration import RoutedOp

        return RoutedOp(resolve(spec.torch.function), provider, spec), tuple(lead), values
    return resolve(spec.torch.function), tuple(lead), values


def _expr(expr: str, captures: dict[str, Any], gm: fx.GraphModule) -> Any:
    """An ``args`` expression; graph nodes in it take part as fx proxies, so arithmetic on them
    becomes graph nodes (inserted where the caller set the insertion point)."""
    tracer = fx.proxy.GraphAppendingTracer(gm.graph)
    proxied = {k: fx.Proxy(v, tracer) if isinstance(v, fx.Node) else v for k, v in captures.items()}
    plain = {k: v for k, v in captures.items()}
    try:
        out = evaluate(expr, plain, gm)  # shapes and dtypes read from the graph's records
    except TypeError:  # arithmetic on a graph node: build it in the graph
        out = evaluate(expr, proxied, gm)
    return out.node if isinstance(out, fx.Proxy) else out


def fuse(gm: fx.GraphModule, provider: str, implemented: Iterable[str],
         notes: list[str] | None = None) -> fx.GraphModule:  # fmt: skip
    """Apply the ``fuse`` patterns; fused ops only where ``implemented`` (in place; returns gm)."""
    rewrite(gm, "fuse", provider, implemented, notes)
    return gm


def fuse_attention(gm: fx.GraphModule, notes: list[str] | None = None) -> fx.GraphModule:
    """Rewrite eager attention (``softmax(q @ k^T * s + mask) @ v``) as SDPA calls (in place)."""
    done = rewrite(gm, "attention", notes=notes)
    eliminate_dead_code(gm)
    gm.recompile()
    gm.refcore_attention = sum(done.values())  # type: ignore[attr-defined]
    return gm
