"""refcore.optim's torch optimizers: the same steps and checkpoints as torch's own, split-BF16
masters that are the float32 masters bit for bit, and routing that says what ran."""

from __future__ import annotations

import copy

import pytest
import torch

import refcore.optim as ro
from refcore import dispatch, oracles
from refcore.optim import call as calls
from refcore.provider import installed

# name, hyper-parameters (non-defaults that exercise each rule's branches)
CASES = [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.1, maximize=True)),
    ("Adagrad", dict(lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, betas=(0.8, 0.99), maximize=True)),
    ("Lamb", dict(lr=0.01, weight_decay=0.01)),
]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


def _torch_class(name: str) -> type:
    return getattr(torch.optim, name, None) or oracles.Lamb


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.Tanh(), torch.nn.Linear(17, 3))


def _feed(models: list[torch.nn.Module], step: int, dtype=torch.float32) -> None:
    """The same gradients into every model (drawn per step, not from backward: no feedback that
    would amplify float32 differences)."""
    g = torch.Generator().manual_seed(step)
    for ps in zip(*(m.parameters() for m in models)):
        grad = torch.randn(ps[0].shape, generator=g).to(dtype)
        for p in ps:
            p.grad = grad.to(p.dtype).clone()


def _route_ok(route: str) -> None:
    assert route.startswith("group ") and (": torch (" in route or "/" in route), route


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_steps_are_torchs(name: str, hp: dict) -> None:
    """Six steps of refcore's optimizer (whatever kernel routing picks here) and of torch's own
    give the same parameters and state within float32 rounding."""
    ours_m, theirs_m = _model(), _model()
    ours = getattr(ro, name)(ours_m.parameters(), **hp)
    theirs = _torch_class(name)(theirs_m.parameters(), **hp)
    for n in range(6):
        _feed([ours_m, theirs_m], n)
        ours.step()
        theirs.step()
        for r in ours.routes:
            _route_ok(r)
    for a, b in zip(ours_m.parameters(), theirs_m.parameters()):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
        sa, sb = ours.state[a], theirs.state[b]
        assert {k for k, v in sa.items() if v is not None} == {
            k for k, v in sb.items() if v is not None
        }
        for k, v in sa.items():
            if v is not None:
                torch.testing.assert_close(v, sb[k], rtol=2e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_checkpoints_move_between_torch_and_refcore(name: str, hp: dict) -> None:
    """A state_dict saved by either optimizer loads into the other, and both continue alike."""
    m0 = _model()
    first = getattr(ro, name)(m0.parameters(), **hp)
    for n in range(2):
        _feed([m0], n)
        first.step()
    for src_cls, dst_cls in ((getattr(ro, name), _torch_class(name)),
                             (_torch_class(name), getattr(ro, name))):  # fmt: skip
        a, b = copy.deepcopy(m0), copy.deepcopy(m0)
        src = src_cls(a.parameters(), **hp)
        src.load_state_dict(copy.deepcopy(first.state_dict()))  # as saved and loaded
        dst = dst_cls(b.parameters(), **hp)
        dst.load_state_dict(copy.deepcopy(src.state_dict()))
        for n in range(2, 5):
            _feed([a, b], n)
            src.step()
            dst.step()
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pa, pb, rtol=2e-5, atol=1e-6)


def _explicit_provider(name: str, hp: dict, master: str) -> str:
    """The provider `auto` runs a split-BF16 step of ``name`` with here."""
    p = torch.zeros(8, dtype=torch.bfloat16)
    rule = {"SGD": "sgd", "Adagrad": "adagrad", "Lamb": "lamb"}.get(name)
    rule = rule or ("adamw" if name == "AdamW" or hp.get("decoupled_weight_decay") else "adam")
    spec = calls.default_registry().optimizers[rule]
    hps = {k: v for k, v in hp.items() if k in spec.hyperparameters}
    from refcore.ops import optim as rules

    states = [rules.initial_state(rule, (8,), **calls.hyperparameters(spec, hps))]
    c = calls.bind(rule, [p], [p.clone()], states, step=1, fresh=True,
                   bottoms=[torch.zeros(8, dtype=torch.int16)], **hps)  # fmt: skip
    return dispatch.first_with_provider(c)[0]


@pytest.mark.parametrize(("name", "hp"), CASES, ids=IDS)
def test_split_bf16_masters_are_the_float32_masters(name: str, hp: dict) -> None:
    """bfloat16 parameters with split-BF16 masters, fed bf16 gradients, keep exactly the float32
    parameters an optimizer on float32 masters reaches from the same gradients (the same
    provider's kernel for both); the model computes with the masters' top halves."""
    f32_m, split_m = _model(), _model()
    provider = _explicit_provider(name, hp, "split_bf16")
    f32 = getattr(ro, name)(f32_m.parameters(), provider=provider, **hp)
    split = getattr(ro, name)(split_m.parameters(), master="split_bf16", provider=provider, **hp)
    for a, b in zip(f32_m.parameters(), split_m.parameters()):  # converted, master kept
        assert b.dtype == torch.bfloat16 and torch.equal(split.master_weight(b), a)
    for n in range(8):
        _feed([f32_m, split_m], n, dtype=torch.bfloat16)
        f32.step()
        split.step()
        assert all(f"{provider}/" in r for r in split.routes), split.routes
    for a, b in zip(f32_m.parameters(), split_m.parameters()):
        assert torch.equal(split.master_weight(b), a)
        top = (a.detach().view(torch.int32) >> 16).to(torch.int16)
        assert torch.equal(b.detach().view(torch.int16), top)


def test_split_bf16_checkpoint_keeps_float32_state_and_masters() -> None:
    """torch would cast the state to the bf16 parameters' dtype on loading; refcore keeps the
    float32 moments and the trailing halves, so training resumes on the exact masters."""
    m = _model()
    opt = ro.AdamW(m.parameters(), master="split_bf16", lr=0.01)
    for n in range(3):
        _feed([m], n, dtype=torch.bfloat16)
        opt.step()
    m2 = copy.deepcopy(m)
    opt2 = ro.AdamW(m2.parameters(), master="split_bf16", lr=0.01)
    opt2.load_state_dict(opt.state_dict())
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(opt2.master_weight(q), opt.master_weight(p))
        assert opt2.state[q]["exp_avg"].dtype == torch.float32
        assert torch.equal(opt2.state[q]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])


def test_sparse_gradients_go_to_torch_and_say_so() -> None:
    emb = torch.nn.Embedding(10, 4, sparse=True)
    ref = copy.deepcopy(emb)
    ours = ro.Adagrad(emb.parameters(), lr=0.1)
    theirs = torch.optim.Adagrad(ref.parameters(), lr=0.1)
    for e, o in ((emb, ours), (ref, theirs)):
        e(torch.tensor([1, 3, 3])).sum().backward()
        o.step()
    assert ours.routes == ["group 0: torch (sparse gradients or complex parameters)"]
    assert torch.equal(emb.weight, ref.weight)


def test_bad_master_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"SGD: argument 'master' expected one of"):
        ro.SGD(_model().parameters(), lr=0.1, master="bf16")
    with pytest.raises(TypeError, match="split_bf16 master needs float32 or bfloat16"):
        ro.SGD([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], lr=0.1,
               master="split_bf16")  # fmt: skip


def test_functional_step_on_torch_tensors_is_in_place() -> None:
    p, g = torch.ones(5), torch.full((5,), 2.0)
    got = calls.step("sgd", [p], [g], [{}], step=1, lr=0.25)
    assert got in {(n, k.name) for n, prov in installed().items() for k in prov.kernels_for("sgd")}
    assert torch.equal(p, torch.full((5,), 0.5))


def test_a_step_after_state_or_parameter_swaps_uses_the_new_tensors() -> None:
    """Later steps re-bind only the gradients while nothing else changed; replacing a state
    tensor, a parameter's data or the gradient dtype between steps is seen, as torch sees it."""
    ours_m, theirs_m = _model(), _model()
    ours = ro.AdamW(ours_m.parameters(), lr=0.01)
    theirs = torch.optim.AdamW(theirs_m.parameters(), lr=0.01)
    for n in range(6):
        _feed([ours_m, theirs_m], n)
        if n == 2:  # a new moment tensor
            for o, m in ((ours, ours_m), (theirs, theirs_m)):
                p = next(m.parameters())
                o.state[p]["exp_avg"] = torch.full_like(p, 0.5)
        if n == 3:  # new parameter memory
            for m in (ours_m, theirs_m):
                p = next(m.parameters())
                p.data = p.data.clone() * 0.5
        if n == 4:  # a non-contiguous gradient
            for m in (ours_m, theirs_m):
                p = next(m.parameters())
                p.grad = p.grad.t().contiguous().t()
        ours.step()
        theirs.step()
    for a, b in zip(ours_m.parameters(), theirs_m.parameters()):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)


def test_switching_adams_weight_decay_mode_mid_training_switches_the_rule() -> None:
    """Adam's decoupled_weight_decay flag picks adam or adamw per step, as in torch."""
    ours_m, theirs_m = _model(), _model()
    ours = ro.Adam(ours_m.parameters(), lr=0.01, weight_decay=0.1)
    theirs = torch.optim.Adam(theirs_m.parameters(), lr=0.01, weight_decay=0.1)
    for n in range(4):
        if n == 2:
            for o in (ours, theirs):
                o.param_groups[0]["decoupled_weight_decay"] = True
        _feed([ours_m, theirs_m], n)
        ours.step()
        theirs.step()
    assert "adamw" in ours.routes[0] or "torch" in ours.routes[0], ours.routes
    for a, b in zip(ours_m.parameters(), theirs_m.parameters()):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6)
