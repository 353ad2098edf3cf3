"""Naming a call's arguments: one mechanism (`refcore.call.Spelling`) for every layer.

Routing (torch calls), pattern matching (fx nodes), derived fused ops, custom ops' fake kernels
and prepacking all name arguments through `refcore.call.spelling`; these tests pin the rules
where the copies it replaced disagreed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refcore
from refcore.call import bind, plan, spelling, torch_spelling
from refcore.registry import default_registry


def _op(name: str):
    return default_registry().op(name)


def test_refcore_spelling_is_the_signature_with_defaults() -> None:
    gelu = spelling(_op("gelu"))
    assert gelu.arguments(("x",), {}) == {"input": "x", "approximate": "none"}
    assert gelu.arguments(("x",), {}, defaults=False) == {"input": "x"}
    with pytest.raises(TypeError, match=r"gelu\(\) takes at most 1 positional arguments \(2 given"):
        gelu.arguments(("x", "tanh"), {})  # approximate is keyword-only in the spec
    with pytest.raises(TypeError, match=r"gelu\(\) missing required argument 'input'"):
        gelu.arguments((), {"approximate": "tanh"})
    with pytest.raises(TypeError, match=r"gelu\(\) got an unexpected argument 'inplace'"):
        gelu.arguments(("x",), {"inplace": False})


def test_torch_spelling_follows_the_specs_torch_order_and_drops_torch_only_arguments() -> None:
    sm = spelling(_op("softmax"), "torch")  # F.softmax(input, dim, _stacklevel, dtype)
    assert sm.arguments(("x", 1, 5), {}) == {"input": "x", "dim": 1}
    assert sm.arguments(("x",), {"dim": 1, "_stacklevel": 5, "dtype": None}) == {
        "input": "x",
        "dim": 1,
    }
    with pytest.raises(ValueError, match=r"dtype=torch.float64 \(refcore needs None\)"):
        sm.arguments(("x", 1), {"dtype": torch.float64})
    with pytest.raises(TypeError, match="softmax as torch.nn.functional.softmax"):
        sm.arguments(("x", 1, 5, None, "more"), {})
    emb = spelling(_op("embedding"), "torch")  # nn.Embedding passes all seven positionally
    assert emb.arguments(("i", "w", 0, None, 2.0, False, False), {}) == {
        "input": "i",
        "weight": "w",
    }
    with pytest.raises(ValueError, match="max_norm"):
        emb.arguments(("i", "w", None, 1.0), {})


def test_a_value_given_twice_is_an_error_not_the_positional_one() -> None:
    """The routing copy let the positional value silently win over a keyword of the same name;
    torch (and Python) reject such a call, so refcore leaves it to torch's own error."""
    with pytest.raises(TypeError, match="multiple values for argument 'dim'"):
        spelling(_op("softmax"), "torch").arguments(("x", 1), {"dim": 0})
    with pytest.raises(TypeError, match="multiple values"):
        refcore.ops.fused.add_relu(torch.ones(2).numpy(), torch.ones(2).numpy(), input=None)


def test_torch_positional_order_is_torch_functions_alone() -> None:
    """``torch.positional`` is the order of the spec's torch function; its aliases (methods,
    operators, ``torch.softmax``) take the signature's (the pattern matcher's reading; routing
    applied it to every alias, which would read ``x.softmax(1, torch.float64)``'s dtype as
    F.softmax's ``_stacklevel`` and drop it)."""
    spec = _op("softmax")
    alias = spelling(spec, "alias")
    assert alias.positional == ("input", "dim")
    with pytest.raises(TypeError, match="at most 2 positional"):
        alias.arguments(("x", 1, torch.float64), {})
    assert torch_spelling(spec, F.softmax) is spelling(spec, "torch")
    assert torch_spelling(spec, torch.Tensor.softmax) is alias
    relu = _op("relu")  # torch.relu(x) and x.relu() take no inplace; F.relu(x, inplace) does
    assert spelling(relu, "torch").positional == ("input", "inplace")
    assert spelling(relu, "alias").positional == ("input",)


def test_fx_nodes_are_named_by_the_same_spelling() -> None:
    from refcore.patterns import named_args

    def f(x):
        return F.softmax(x, -1, _stacklevel=5) + torch.softmax(x, 0) + x.float().softmax(1)

    gm = torch.fx.symbolic_trace(f)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    by_target = {n.target: n for n in gm.graph.nodes if n.op in ("call_function", "call_method")}
    assert named_args("softmax", by_target[F.softmax]) == {"input": x, "dim": -1}
    assert named_args("softmax", by_target[torch.softmax]) == {"input": x, "dim": 0}
    method = by_target["softmax"]
    assert named_args("softmax", method) == {"input": by_target["float"], "dim": 1}
    assert named_args("cast", by_target["float"]) == {"input": x, "dtype": torch.float32}
    bad = gm.graph.call_function(F.softmax, (x, -1), {"dtype": torch.float64})
    assert "refcore needs None" in named_args("softmax", bad)


def test_a_plan_reads_a_torch_call_where_torch_spells_its_tensors() -> None:
    spec, x = _op("softmax"), torch.randn(4, 8)
    spelled = spelling(spec, "torch")
    call = bind(spec, (x, 1), {"_stacklevel": 5}, spelled)
    p = plan(call, (x, 1), {"_stacklevel": 5}, spelled)
    assert p is not None and p.tensors == (("input", 0),)
    x2 = torch.randn(4, 8)
    assert p.bind((x2, 1), {"_stacklevel": 5}).arguments["input"].ctypes.data == x2.data_ptr()


def test_a_planned_nn_softmax_replays() -> None:
    """nn.Softmax calls F.softmax(x, dim, _stacklevel=5): the plan's step re-binds that call as
    torch spells it (it looked the input up by its refcore keyword: KeyError 'input')."""

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sm = torch.nn.Softmax(dim=-1)

        def forward(self, x):
            return self.sm(x * 2.0)

    model, x = M().eval(), torch.randn(8, 64)
    fast = refcore.optimize(model, provider="reference", example_inputs=(x,))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x))
    assert ("torch.nn.functional.softmax", "reference/reference") in {
        (f, o) for f, _, o in refcore.explain().rows()
    }, refcore.explain()


def test_routed_calls_bind_through_the_spelling() -> None:
    x = torch.randn(4, 8)
    with refcore.enabled("reference") as rep:
        for _ in range(2):  # the second call replays the plan on torch's spelling
            torch.testing.assert_close(F.softmax(x, 1, _stacklevel=5), torch.softmax(x, 1))
            torch.testing.assert_close(F.softmax(x, 1, dtype=torch.float64), x.double().softmax(1))
    rows = {(f, o): n for f, n, o in rep.rows()}
    assert rows[("torch.nn.functional.softmax", "reference/reference")] == 2, rep
    assert any("refcore needs None" in o for _, o in rows), rep


def test_prepack_names_linear_nodes_through_the_spelling() -> None:
    from refcore.passes.prepack import _weight_call

    gm = torch.fx.symbolic_trace(lambda x, w, b: F.linear(x, w, bias=b))
    node = next(n for n in gm.graph.nodes if n.target is F.linear)
    x, w, b = (n for n in gm.graph.nodes if n.op == "placeholder")
    assert _weight_call(node) == ("linear", {"input": x, "weight": w, "bias": b})
    node.kwargs = {"bias": b, "other": x}
    assert _weight_call(node) is None
