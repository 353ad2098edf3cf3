"""refcore's optimizers under torch.distributed: DistributedDataParallel with the gloo backend in
two processes gives, after N steps, the weights one process reaches on the combined batch.
(Scale-out beyond one machine is torch.distributed's own and unchanged.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS, BATCH = 6, 16


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(2 * BATCH, 20, generator=g), torch.randint(0, 4, (2 * BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def _optimizer(name: str, params, master: str):
    import refcore.optim as ro

    hp = {"AdamW": dict(lr=0.01), "SGD": dict(lr=0.05, momentum=0.9), "Lamb": dict(lr=0.01)}[name]
    return getattr(ro, name)(params, master=master, **hp)


def _train(model, opt, batches, rank: int | None, dtype) -> None:
    for x, y in batches:
        if rank is not None:  # each process its half of the combined batch
            x, y = x[rank * BATCH : (rank + 1) * BATCH], y[rank * BATCH : (rank + 1) * BATCH]
        loss = torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


CASES = [("AdamW", "float32"), ("SGD", "split_bf16"), ("Lamb", "float32")]


def _worker(rank: int, store: str, out: str) -> None:
    """Every case in one process group (spawning costs more than the training). The group meets
    through a file, not a TCP port picked beforehand: another process (an xdist worker's test)
    could take that port first, and rank 0's TCPStore then aborted the process."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        weights = {}
        for name, master in CASES:
            model = _model()
            opt = _optimizer(name, model.parameters(), master)  # split: params become bf16 first
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            dtype = torch.bfloat16 if master == "split_bf16" else torch.float32
            _train(ddp, opt, _batches(), rank, dtype)
            weights[name, master] = [opt.master_weight(p) for p in model.parameters()]
        if rank == 0:
            torch.save(weights, out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_weights(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ddp")
    out = str(tmp / "weights.pt")
    mp.start_processes(_worker, args=(str(tmp / "store"), out), nprocs=2, start_method="spawn")
    return torch.load(out)


@pytest.mark.parametrize(("name", "master"), CASES)
def test_ddp_two_processes_match_one_process_on_the_combined_batch(name, master, ddp_weights):
    model = _model()
    opt = _optimizer(name, model.parameters(), master)
    dtype = torch.bfloat16 if master == "split_bf16" else torch.float32
    _train(model, opt, _batches(), None, dtype)
    for a, p in zip(ddp_weights[name, master], model.parameters()):
        # the mean of two half-batch gradients is the full batch's up to rounding
        tol = dict(rtol=2e-2, atol=2e-3) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a, opt.master_weight(p), **tol)
