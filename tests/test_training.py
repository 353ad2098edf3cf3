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
