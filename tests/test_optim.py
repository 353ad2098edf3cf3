"""The optimizer rules of specs/optim.yaml, generated from the registry: each NumPy reference
against its torch oracle over several steps with drawn hyper-parameters, and the split-BF16
master against the float32 one, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refcore.ops import optim
from refcore.optim import call as calls
from refcore.provider import installed
from refcore.registry import default_registry, resolve
from refcore.tensors import BFLOAT16, numpy_dtype

REG = default_registry()
OPTIMIZERS = sorted(REG.optimizers)
# float32 torch against a float64 reference, each rounding once: a few ulps of the update a
# step, compounding over the steps
RTOL, ATOL = 2e-5, 1e-6


def _draw_hp(draw, name: str) -> dict:
    hps = {}
    for hp, raw in REG.optimizers[name].hyperparameters.items():
        if "choice" in raw:
            hps[hp] = draw(st.sampled_from(raw["choice"]))
        else:
            lo, hi = raw["range"]
            hps[hp] = draw(st.floats(lo, hi))
    if "betas" in hps:
        hps["betas"] = tuple(hps["betas"])
    if hps.get("nesterov"):  # torch's rule (specs/optim.yaml): momentum > 0, no dampening
        hps["momentum"], hps["dampening"] = max(hps["momentum"], 0.1), 0.0
    return hps


@st.composite
def _case(draw, name: str) -> tuple[dict, list[tuple[int, ...]], int, int]:
    shapes = draw(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple),
                           min_size=1, max_size=3))  # fmt: skip
    return _draw_hp(draw, name), shapes, draw(st.integers(1, 5)), draw(st.integers(0, 2**31))


def _torch_optimizer(name: str, params: list[torch.Tensor], hps: dict) -> torch.optim.Optimizer:
    cls = resolve(REG.optimizers[name].torch)
    if cls.__module__.startswith("torch.optim"):
        return cls(params, foreach=False, **hps)
    return cls(params, **hps)


@pytest.mark.parametrize("name", OPTIMIZERS)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_reference_is_torchs_optimizer(name: str, data) -> None:
    """Several steps of the reference on each of a few parameters give torch's parameters and
    state (same names) within a few float32 ulps."""
    hps, shapes, steps, seed = data.draw(_case(name))
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tparams = [torch.tensor(p, requires_grad=True) for p in params]
    opt = _torch_optimizer(name, tparams, hps)
    rule, states = resolve(REG.optimizers[name].reference), [{} for _ in params]
    for n in range(1, steps + 1):
        for i, (p, tp) in enumerate(zip(params, tparams)):
            g = rng.standard_normal(p.shape).astype(np.float32)
            tp.grad = torch.from_numpy(g.copy())
            params[i], states[i] = rule(p, g, states[i], step=n, **hps)
        opt.step()
    for p, tp, state in zip(params, tparams, states):
        np.testing.assert_allclose(p, tp.detach().numpy(), rtol=RTOL, atol=ATOL)
        theirs = {k: v for k, v in opt.state[tp].items() if k != "step"}
        theirs = {k: v for k, v in theirs.items() if v is not None}
        assert set(state) <= set(REG.optimizers[name].state)
        assert set(state) == set(theirs), (state.keys(), theirs.keys())
        for k, v in state.items():
            np.testing.assert_allclose(v, theirs[k].numpy(), rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS
                                  if "split_bf16" in REG.optimizers[n].masters])  # fmt: skip
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_split_bf16_master_is_the_float32_master(name: str, data) -> None:
    """Steps on a split-BF16 master (bf16 top half + trailing 16 bits) keep the float32 master
    bit for bit, and the top half is always the master's bf16 truncation."""
    hps, shapes, steps, seed = data.draw(_case(name))
    rng = np.random.default_rng(seed)
    rule = resolve(REG.optimizers[name].reference)
    master = rng.standard_normal(shapes[0]).astype(np.float32)
    top, bottom = optim.split_bf16(master)
    s32, s16 = {}, {}
    for n in range(1, steps + 1):
        g = rng.standard_normal(master.shape).astype(np.float32)
        master, s32 = rule(master, g, s32, step=n, **hps)
        top, bottom, s16 = optim.step_split_bf16(rule, top, bottom, g, s16, step=n, **hps)
        assert optim.join_bf16(top, bottom).tobytes() == master.tobytes()
        trunc = (master.view(np.uint32) >> 16).astype(np.uint16)
        assert top.tobytes() == trunc.tobytes()


def test_split_bf16_round_trips_every_bit_pattern_class() -> None:
    x = np.float32([0.0, -0.0, 1.0, -3.4e38, 1e-45, np.inf, -np.inf, np.nan, 1.0000001])
    top, bottom = optim.split_bf16(x)
    assert optim.join_bf16(top, bottom).tobytes() == x.tobytes()
    assert top.dtype == np.uint16 and bottom.dtype == np.uint16


def test_references_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="sgd: argument 'param' expected a float32 array"):
        optim.sgd(np.float64([1.0]), np.float64([1.0]), {}, step=1, lr=0.1)
    with pytest.raises(ValueError, match=r"adam: argument 'grad' expected shape \(2,\)"):
        optim.adam(np.float32([1.0, 2.0]), np.float32([1.0]), {}, step=1, lr=0.1)


def test_lamb_trust_ratio_is_one_at_zero_norms_and_clamps_the_weight_norm() -> None:
    """A zero weight takes the plain Adam-like step (ratio 1); a large one is clamped to
    clamp_max before the ratio."""
    g = np.float32([1.0, -1.0])
    p, _ = optim.lamb(np.zeros(2, np.float32), g, {}, step=1, lr=0.1, betas=(0.0, 0.0), eps=0)
    np.testing.assert_allclose(p, [-0.1, 0.1], rtol=1e-6)
    big = np.float32([300.0, 400.0])  # ||w|| = 500, clamped to 10
    p, _ = optim.lamb(big, g, {}, step=1, lr=0.1, betas=(0.0, 0.0), eps=0, clamp_max=10.0)
    u_norm = np.sqrt(2.0)
    want = 0.1 * 10 / u_norm * np.float32([1, -1])
    np.testing.assert_allclose(big - p, want, atol=4e-5)  # the float32 ulp of 300: 3e-5


# --- every provider's step kernels against the reference (generated from the providers) ------

GRAD_DTYPES = ("float32", "bfloat16")
SIZES = (0, 1, 7, 8, 9, 31, 33, 1000, 4099)


def step_kernels() -> list:
    """(provider, kernel, master, grad dtype) for every optimizer-step kernel installed."""
    out = []
    for pname, prov in sorted(installed().items()):
        if pname == "reference" or not prov.availability().available:
            continue
        for k in prov.kernels:
            if k.op not in REG.optimizers:
                continue
            for master in sorted(k.dtypes & set(REG.optimizers[k.op].masters)):
                for gd in GRAD_DTYPES:
                    pid = f"{pname}-{k.name}-{master}-{gd}"
                    out.append(pytest.param(pname, k, master, gd, id=pid))
    return out


STEPS = step_kernels()


def test_step_suite_collected_every_kernel() -> None:
    expected = sum(
        len(k.dtypes & set(REG.optimizers[k.op].masters)) * len(GRAD_DTYPES)
        for n, p in installed().items() if n != "reference" and p.availability().available
        for k in p.kernels if k.op in REG.optimizers
    )  # fmt: skip
    assert len(STEPS) == expected


def _reference_kernel(name: str):
    return next(k for k in installed()["reference"].kernels_for(name))


class _Run:
    """One optimizer's tensors, as a float32 master or a split-BF16 one, stepped in place."""

    def __init__(self, name: str, masters: list[np.ndarray], master: str, hps: dict) -> None:
        self.name, self.hps, self.split = name, hps, master == "split_bf16"
        if self.split:
            halves = [optim.split_bf16(m) for m in masters]
            self.params = [t.view(BFLOAT16) for t, _ in halves]
            self.bottoms = [b for _, b in halves]
        else:
            self.params, self.bottoms = [m.copy() for m in masters], None
        self.states = [optim.initial_state(name, m.shape, **hps) for m in masters]

    def step(self, kernel, grads: list[np.ndarray], n: int) -> None:
        c = calls.bind(self.name, self.params, grads, self.states, step=n, bottoms=self.bottoms,
                       fresh=n == 1, **self.hps)  # fmt: skip
        verdict = kernel.supports(c)
        assert verdict, f"{kernel.name} declined a contiguous {c.dtype} step: {verdict.reason}"
        calls.run(c, kernel)

    def masters(self) -> list[np.ndarray]:
        if not self.split:
            return self.params
        return [optim.join_bf16(p.view(np.uint16), b) for p, b in zip(self.params, self.bottoms)]


def _grads(rng, shapes, dtype: str) -> list[np.ndarray]:
    scale = rng.choice([1e-3, 1.0, 30.0])
    return [(rng.standard_normal(s) * scale).astype(numpy_dtype(dtype)) for s in shapes]


@pytest.mark.parametrize(("provider", "kernel", "master", "grad_dtype"), STEPS)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_step_kernel_matches_reference(provider, kernel, master, grad_dtype, data) -> None:
    """The kernel's parameters (masters) and state after 1-5 steps are the reference's within a
    few float32 ulps of each step's update, on several tensors of drawn sizes (tails, empty)."""
    name = kernel.op
    hps, shapes, steps, seed = data.draw(_case(name))
    shapes = [*shapes, (data.draw(st.sampled_from(SIZES)),)]
    rng = np.random.default_rng(seed)
    masters = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    mine, ref = _Run(name, masters, master, hps), _Run(name, masters, master, hps)
    for n in range(1, steps + 1):
        grads = _grads(rng, shapes, grad_dtype)
        mine.step(kernel, grads, n)
        ref.step(_reference_kernel(name), grads, n)
    for a, b in zip(mine.masters(), ref.masters()):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=_scaled_atol(b))
    for sa, sb in zip(mine.states, ref.states):
        for k in sa:
            np.testing.assert_allclose(sa[k], sb[k], rtol=RTOL, atol=_scaled_atol(sb[k]), err_msg=k)


def _scaled_atol(ref: np.ndarray) -> float:
    """An element that cancels (p - lr * d with both ~|p|) keeps the float32 error of its
    operands, not of its small result: a few ulps of the tensor's largest value (torch's own
    float32 SGD needs this too: lr 0.29, momentum 0.95, gradients ~30, 5 steps)."""
    finite = np.abs(ref[np.isfinite(ref)]) if ref.size else ref
    return ATOL + 4e-6 * float(finite.max()) if finite.size else ATOL


SPLIT_STEPS = [p for p in STEPS if p.values[2] == "split_bf16"]


@pytest.mark.parametrize(("provider", "kernel", "master", "grad_dtype"), SPLIT_STEPS)
@pytest.mark.parametrize("seed", [0, 1])
def test_split_bf16_kernel_keeps_the_float32_masters_bits(provider, kernel, master, grad_dtype,
                                                          seed) -> None:  # fmt: skip
    """Twelve steps of the kernel on split-BF16 masters give the float32 masters (and state) of
    the same kernel on float32 masters, bit for bit, with default hyper-parameters plus the
    draw's flags."""
    name = kernel.op
    rng = np.random.default_rng(seed)
    hps = {k: v["default"] for k, v in REG.optimizers[name].hyperparameters.items()}
    hps = {k: tuple(v) if isinstance(v, list) else v for k, v in hps.items()}
    hps |= {k: v for k, v in {"momentum": 0.9, "amsgrad": bool(seed)}.items() if k in hps}
    shapes = [(s,) for s in SIZES] + [(3, 5, 7)]
    masters = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    split, f32 = _Run(name, masters, "split_bf16", hps), _Run(name, masters, "float32", hps)
    for n in range(1, 13):
        grads = _grads(rng, shapes, grad_dtype)
        split.step(kernel, grads, n)
        f32.step(kernel, [np.asarray(g, np.float32) for g in grads], n)
        for a, b in zip(split.masters(), f32.masters()):
            assert a.tobytes() == b.tobytes()
    for sa, sb in zip(split.states, f32.states):
        assert all(sa[k].tobytes() == sb[k].tobytes() for k in sa)


@pytest.mark.parametrize(("provider", "kernel", "master", "grad_dtype"),
                         [p for p in STEPS if p.values[3] == "float32"])  # fmt: skip
def test_step_kernel_does_not_depend_on_the_thread_count(provider, kernel, master,
                                                         grad_dtype) -> None:  # fmt: skip
    """One and two threads give the same bits (Lamb's norms are summed in a fixed order), on
    tensors large enough for a parallel step."""
    name, rng = kernel.op, np.random.default_rng(3)
    hps = {k: v["default"] for k, v in REG.optimizers[name].hyperparameters.items()}
    hps = {k: tuple(v) if isinstance(v, list) else v for k, v in hps.items()}
    shapes = [(300_001,), (5,), (70_000,)]
    masters = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    runs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            r, g = _Run(name, masters, master, hps), np.random.default_rng(4)
            for n in (1, 2):
                r.step(kernel, _grads(g, shapes, grad_dtype), n)
            runs.append(r)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(runs[0].masters(), runs[1].masters()):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("provider", "kernel", "master", "grad_dtype"),
                         [p for p in STEPS if p.values[3] == "float32"])  # fmt: skip
def test_step_kernel_declines_strided_arrays_with_a_reason(provider, kernel, master,
                                                            grad_dtype) -> None:  # fmt: skip
    """A strided parameter (a view of every other element) is either read as it is or declined
    with a reason naming it; `step` under auto then runs a kernel that gives the reference's
    result."""
    name, rng = kernel.op, np.random.default_rng(5)
    hps = {k: v["default"] for k, v in REG.optimizers[name].hyperparameters.items()}
    hps = {k: tuple(v) if isinstance(v, list) else v for k, v in hps.items()}
    base = rng.standard_normal(20).astype(np.float32)
    p, g = base.copy()[::2], rng.standard_normal(10).astype(np.float32)
    want, _ = resolve(REG.optimizers[name].reference)(
        np.ascontiguousarray(p), g, {}, step=1, **hps
    )  # fmt: skip
    states = [optim.initial_state(name, p.shape, **hps)]
    c = calls.bind(name, [p], [g], states, step=1, fresh=True, **hps)
    verdict = kernel.supports(c)
    if not verdict:
        assert "params[0]" in verdict.reason
    calls.step(name, [p], [g], states, step=1, fresh=True, **hps)
    np.testing.assert_allclose(p, want, rtol=RTOL, atol=ATOL)


# --- the step call: arguments checked once, errors that say what is wrong ----------------------


def _adam_args(n: int = 3) -> tuple[list, list, list]:
    p, g = np.ones(n, np.float32), np.ones(n, np.float32)
    return [p], [g], [optim.initial_state("adam", p.shape)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(name="adamx"), r"step: argument 'name' expected one of \['adagrad'"),
        (dict(lr=-1.0), r"adam: argument 'lr' expected a finite number >= 0"),
        (dict(lr=float("nan")), r"adam: argument 'lr' expected a finite number >= 0"),
        (dict(betas=(0.9, 1.0)), r"adam: argument 'betas' expected two betas in \[0, 1\)"),
        (dict(momentum=0.9), r"adam: argument 'momentum' expected one of the hyper-parameters"),
        (dict(step=0), r"adam: argument 'step' expected an int >= 1"),
        (dict(grads=[np.ones(4, np.float32)]), r"adam: argument 'grads\[0\]' expected shape"),
        (dict(grads=[np.ones(3)]), r"adam: argument 'grads\[0\]' expected dtype float32 or"),
        (dict(params=[np.ones(3)]), r"adam: argument 'params\[0\]' expected dtype float32"),
        (dict(states=[{}]), r"adam: argument 'states\[0\]' expected a mapping of exactly"),
        (dict(bottoms=[np.zeros(3, np.uint16)]), r"'params\[0\]' expected dtype bfloat16"),
        (dict(name="sgd", momentum=0.0, nesterov=True, states=[{}]),
         r"sgd: argument 'nesterov' expected momentum > 0"),
    ],
)  # fmt: skip
def test_step_call_rejects_bad_arguments(change: dict, message: str) -> None:
    params, grads, states = _adam_args()
    kw = dict(name="adam", params=params, grads=grads, states=states, step=1) | change
    with pytest.raises((ValueError, TypeError), match=message):
        calls.step(kw.pop("name"), kw.pop("params"), kw.pop("grads"), kw.pop("states"), **kw)


def test_step_call_rejects_a_state_sharing_the_parameters_memory() -> None:
    p = np.ones(8, np.float32)
    states = [{"exp_avg": p[:8], "exp_avg_sq": np.zeros(8, np.float32)}]
    with pytest.raises(ValueError, match="memory shared with"):
        calls.step("adam", [p], [np.ones(8, np.float32)], states, step=1)


def test_step_call_rejects_a_read_only_parameter() -> None:
    p = np.ones(3, np.float32)
    p.flags.writeable = False
    with pytest.raises(ValueError, match=r"'params\[0\]' expected a writeable array"):
        calls.step("sgd", [p], [np.ones(3, np.float32)], [{}], step=1)


@pytest.mark.parametrize(("provider", "kernel", "master", "grad_dtype"),
                         [p for p in STEPS if p.values[3] == "float32"])  # fmt: skip
@pytest.mark.parametrize("bad", ["grad shape", "grad dtype", "short grads", "missing state",
                                 "read-only param", "strided state"])  # fmt: skip
def test_step_kernel_called_directly_rejects_bad_arrays(provider, kernel, master, grad_dtype,
                                                        bad) -> None:  # fmt: skip
    """A kernel function called directly (not through refcore.optim.call's checks) raises a
    clear error for arrays it cannot step, and writes nothing."""
    name = kernel.op
    hps = {k: v["default"] for k, v in REG.optimizers[name].hyperparameters.items()}
    hps = {k: tuple(v) if isinstance(v, list) else v for k, v in hps.items()}
    hps |= {k: 0.9 for k in ("momentum",) if k in hps}  # sgd keeps a buffer
    run = _Run(name, [np.ones(40, np.float32), np.ones(7, np.float32)], master, hps)
    grads = [np.ones(40, np.float32), np.ones(7, np.float32)]
    if bad == "grad shape":
        grads[1] = np.ones(8, np.float32)
    elif bad == "grad dtype":
        grads[1] = np.ones(7, np.float64)
    elif bad == "short grads":
        grads = grads[:1]
    elif bad == "missing state":
        run.states[1].popitem()
    elif bad == "read-only param":
        run.params[1].flags.writeable = False
    else:
        k = next(iter(run.states[1]))
        run.states[1][k] = np.ones(14, np.float32)[::2]
    before = [m.copy() for m in run.masters()]
    with pytest.raises((ValueError, TypeError), match=rf"{name}"):
        kernel.fn(run.params, run.bottoms, grads, run.states, 1, True, **hps)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(run.masters(), before))
