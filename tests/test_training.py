"""Training with refcore's optimizers converges: the digits classifier (scikit-learn's bundled
data) trained in bf16 with split-BF16 AdamW ends at fp32 training's loss within 1%, where the same
training on plain bf16 parameters (torch's AdamW, no master) measurably falls behind."""

from __future__ import annotations

import pytest
import torch

import refcore.optim as ro

STEPS, LR = 300, 1e-3


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32) / 16, torch.tensor(d.target)


def _train(kind: str, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Full-data loss after STEPS minibatch steps; the same init and batches for every kind."""
    x, y = data
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    if kind == "fp32":
        opt = torch.optim.AdamW(m.parameters(), lr=LR)
    elif kind == "split_bf16":
        opt = ro.AdamW(m.parameters(), lr=LR, master="split_bf16")
    else:
        m = m.to(torch.bfloat16)
        opt = torch.optim.AdamW(m.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        idx = torch.randint(0, len(x), (64,), generator=g)
        loss = torch.nn.functional.cross_entropy(m(x[idx].to(dtype)).float(), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(m(x.to(dtype)).float(), y).item()


def test_split_bf16_adamw_trains_like_fp32_and_plain_bf16_does_not(digits) -> None:
    fp32 = _train("fp32", digits)
    split = _train("split_bf16", digits)
    plain = _train("bf16", digits)
    assert fp32 < 0.5, fp32  # it learned (chance is ln 10 = 2.3)
    assert abs(split - fp32) <= 0.01 * fp32, (split, fp32)
    assert plain > 1.05 * fp32, (plain, fp32)  # updates below bf16's resolution are lost


def test_optimize_prepares_bf16_training_with_split_masters(digits) -> None:
    """refcore.optimize(model, optimizer=..., dtype=bf16): bf16 parameters whose masters are the
    model's float32 weights bit for bit, refcore's optimizer of the same rule and hyper-
    parameters, inputs cast for the caller; the given model and optimizer are untouched."""
    import refcore

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    m, ro_opt = refcore.optimize(model, optimizer=opt, dtype=torch.bfloat16)
    assert isinstance(ro_opt, ro.AdamW) and ro_opt.param_groups[0]["master"] == "split_bf16"
    assert ro_opt.param_groups[0]["weight_decay"] == 0.05
    for p, b in zip(m.parameters(), before):
        assert p.dtype == torch.bfloat16 and torch.equal(ro_opt.master_weight(p), b)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    x, y = digits
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(m(x[:256]).float(), y[:256])  # fp32 input
        ro_opt.zero_grad()
        loss.backward()
        ro_opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses  # it trains (chance: ln 10 = 2.3)


def test_optimize_training_carries_the_optimizer_state_over() -> None:
    """Steps taken by torch's optimizer before optimize continue in refcore's: the same
    parameters after more steps as torch's optimizer continuing alone (float32)."""
    import refcore

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=g) for p in model.parameters()] for _ in range(6)]
    for gs in grads[:3]:
        for p, gr in zip(model.parameters(), gs):
            p.grad = gr.clone()
        opt.step()
    m, ours = refcore.optimize(model, optimizer=opt)
    for gs in grads[3:]:
        for p, q, gr in zip(model.parameters(), m.parameters(), gs):
            p.grad, q.grad = gr.clone(), gr.clone()
        opt.step()
        ours.step()
    for p, q in zip(model.parameters(), m.parameters()):
        torch.testing.assert_close(q, p, rtol=2e-5, atol=1e-6)


def test_optimize_training_rejects_what_it_cannot_prepare() -> None:
    import refcore

    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="optimize: optimizer expected one of"):
        refcore.optimize(model, optimizer=torch.optim.RMSprop(model.parameters()))
    with pytest.raises(TypeError, match="training dtype expected"):
        refcore.optimize(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         dtype=torch.float16)  # fmt: skip
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not the model's"):
        refcore.optimize(model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
