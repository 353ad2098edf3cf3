"""Optimizer update rules (specs/optim.yaml): one step of each, as NumPy references.

Each reference takes one parameter tensor, its gradient, its state (a dict of the spec's
``state`` names; empty before the first step) and the hyper-parameters, and returns the new
parameter and the new state. The arithmetic is float64 on the stored values, and each stored
value (the parameter, every state tensor) is rounded once to float32 when it is stored; a later
line of the same step reads the stored (rounded) value, as a kernel that writes a state and
reads it back does. ``step`` is the 1-based count of the step being taken.

The rules are torch.optim's (SGD, Adagrad, Adam, AdamW: the same formulas and the same state
names, so a state moves between them and torch's optimizers) and, for Lamb, which torch lacks,
the layer-wise rule of You et al. (2019) as Intel's extension fused it: Adam's bias-corrected
update plus weight decay, scaled per tensor by the trust ratio ||w|| / ||update||, with the
paper's clamp of ||w|| to [clamp_min, clamp_max] and a ratio of 1 where either norm is 0.

**Split-BF16 masters** (`split_bf16` / `join_bf16`): a float32 master weight kept as two 16-bit
halves: its top half is a bfloat16 (the float32 truncated: what the model computes with), its
bottom half the remaining 16 bits of mantissa. The pair is the float32 bit for bit, so an
optimizer that joins, steps in float32 and splits again keeps exactly the float32 master at
half the extra memory of a float32 copy beside bf16 weights (`step_split_bf16`).

Example:
    >>> import numpy as np
    >>> p, s = sgd(np.float32([1.0, 2.0]), np.float32([0.5, -1.0]), {}, step=1, lr=0.1)
    >>> p.tolist(), s
    ([0.949999988079071, 2.0999999046325684], {})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from refcore.ops import _checks

f64 = np.float64


def _store(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, f64).astype(np.float32)


def _inputs(op: str, param: Any, grad: Any) -> tuple[np.ndarray, np.ndarray]:
    p, g = np.asarray(param), np.asarray(grad)
    if p.dtype != np.float32:
        _checks.fail(op, "param", "a float32 array (the master weight)", p.dtype)
    if g.shape != p.shape:
        _checks.fail(op, "grad", f"shape {p.shape}", g.shape)
    return p.astype(f64), g.astype(f64)


def sgd(param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray], *, step: int,
        lr: float, momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, maximize: bool = False) -> tuple[np.ndarray, dict]:  # fmt: skip
    """torch.optim.SGD: d = -g if maximize else g, d += weight_decay * p; with momentum the
    buffer b = d on the first step, else momentum * b + (1 - dampening) * d, and d = d +
    momentum * b (nesterov) or b; p -= lr * d."""
    p, g = _inputs("sgd", param, grad)
    d = -g if maximize else g
    if weight_decay:
        d = d + weight_decay * p
    out: dict[str, np.ndarray] = {}
    if momentum:
        prev = state.get("momentum_buffer")
        buf = _store(d if prev is None else momentum * f64(prev) + (1 - dampening) * d)
        out["momentum_buffer"] = buf
        d = d + momentum * f64(buf) if nesterov else f64(buf)
    return _store(p - lr * d), out


def adagrad(param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray], *, step: int,
            lr: float, lr_decay: float = 0.0, weight_decay: float = 0.0,
            initial_accumulator_value: float = 0.0, eps: float = 1e-10,
            maximize: bool = False) -> tuple[np.ndarray, dict]:  # fmt: skip
    """torch.optim.Adagrad: g = -g if maximize, g += weight_decay * p; sum += g^2 (from
    initial_accumulator_value); p -= lr / (1 + (step - 1) * lr_decay) * g / (sqrt(sum) + eps)."""
    p, g = _inputs("adagrad", param, grad)
    g = -g if maximize else g
    if weight_decay:
        g = g + weight_decay * p
    prev = state.get("sum")
    acc = np.full(p.shape, initial_accumulator_value, f64) if prev is None else f64(prev)
    acc = _store(acc + g * g)
    clr = lr / (1 + (step - 1) * lr_decay)
    return _store(p - clr * g / (np.sqrt(f64(acc)) + eps)), {"sum": acc}


def _moments(p: np.ndarray, g: np.ndarray, state: dict, betas: tuple[float, float],
             amsgrad: bool) -> tuple[dict[str, np.ndarray], np.ndarray]:  # fmt: skip
    b1, b2 = betas
    zeros = np.zeros(p.shape, f64)
    m = _store(b1 * f64(state.get("exp_avg", zeros)) + (1 - b1) * g)
    v = _store(b2 * f64(state.get("exp_avg_sq", zeros)) + (1 - b2) * g * g)
    out = {"exp_avg": m, "exp_avg_sq": v}
    if amsgrad:
        out["max_exp_avg_sq"] = np.maximum(np.asarray(state.get("max_exp_avg_sq", v)), v)
    return out, out["max_exp_avg_sq" if amsgrad else "exp_avg_sq"]


def _adam(op: str, param: np.ndarray, grad: np.ndarray, state: dict, step: int, lr: float,
          betas: tuple[float, float], eps: float, weight_decay: float, amsgrad: bool,
          maximize: bool, decoupled: bool) -> tuple[np.ndarray, dict]:  # fmt: skip
    p, g = _inputs(op, param, grad)
    g = -g if maximize else g
    if weight_decay and decoupled:
        p = p * (1 - lr * weight_decay)
    elif weight_decay:
        g = g + weight_decay * p
    out, v = _moments(p, g, state, betas, amsgrad)
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    denom = np.sqrt(f64(v)) / np.sqrt(bc2) + eps
    return _store(p - (lr / bc1) * f64(out["exp_avg"]) / denom), out


def adam(param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray], *, step: int,
         lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
         weight_decay: float = 0.0, amsgrad: bool = False,
         maximize: bool = False) -> tuple[np.ndarray, dict]:  # fmt: skip
    """torch.optim.Adam: g += weight_decay * p; m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2
    (amsgrad: the running maximum of v); p -= lr / (1 - b1^step) * m / (sqrt(v) /
    sqrt(1 - b2^step) + eps)."""
    return _adam("adam", param, grad, state, step, lr, betas, eps, weight_decay, amsgrad,
                 maximize, decoupled=False)  # fmt: skip


def adamw(param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray], *, step: int,
          lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 0.01, amsgrad: bool = False,
          maximize: bool = False) -> tuple[np.ndarray, dict]:  # fmt: skip
    """torch.optim.AdamW: Adam with decoupled weight decay, p * (1 - lr * weight_decay) in
    place of p in the update (not stored on its own)."""
    return _adam("adamw", param, grad, state, step, lr, betas, eps, weight_decay, amsgrad,
                 maximize, decoupled=True)  # fmt: skip


def lamb(param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray], *, step: int,
         lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
         weight_decay: float = 0.0, clamp_min: float = 0.0,
         clamp_max: float = 10.0) -> tuple[np.ndarray, dict]:  # fmt: skip
    """Lamb: m, v as Adam's; u = (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps) +
    weight_decay * p; r = clamp(||p||, clamp_min, clamp_max) / ||u|| per tensor (1 where
    either norm is 0); p -= lr * r * u."""
    p, g = _inputs("lamb", param, grad)
    out, v = _moments(p, g, state, betas, False)
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    u = (f64(out["exp_avg"]) / bc1) / (np.sqrt(f64(v) / bc2) + eps) + weight_decay * p
    w_norm, u_norm = np.sqrt(np.sum(p * p)), np.sqrt(np.sum(u * u))
    ratio = min(max(w_norm, clamp_min), clamp_max) / u_norm if w_norm and u_norm else 1.0
    return _store(p - lr * ratio * u), out


def split_bf16(master: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float32 array -> (top, bottom): top its bfloat16 truncation (the upper 16 bits, as a
    uint16 array), bottom the lower 16 bits (uint16)."""
    m = np.ascontiguousarray(master, np.float32)
    bits = m.view(np.uint32)
    return (bits >> 16).astype(np.uint16), (bits & 0xFFFF).astype(np.uint16)


def join_bf16(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """The float32 array whose halves `split_bf16` gave, bit for bit."""
    bits = (np.asarray(top, np.uint32) << 16) | np.asarray(bottom, np.uint32)
    return bits.astype(np.uint32).view(np.float32)


def step_split_bf16(rule: Callable[..., tuple[np.ndarray, dict]], top: np.ndarray,
                    bottom: np.ndarray, grad: np.ndarray, state: dict, **hp: Any
                    ) -> tuple[np.ndarray, np.ndarray, dict]:  # fmt: skip
    """One step of ``rule`` on a split-BF16 master: join, step in float32, split again. The
    gradient may be bfloat16 (widened exactly) or float32."""
    p, new_state = rule(join_bf16(top, bottom), np.asarray(grad, np.float32), state, **hp)
    return (*split_bf16(p), new_state)


# --- what a step call holds (refcore.optim.StepCall): the state it needs, its first value ----


def state_names(name: str, **hp: Any) -> tuple[str, ...]:
    """The state tensors optimizer ``name`` keeps under hyper-parameters ``hp`` (a subset of the
    spec's ``state``): SGD keeps a momentum buffer only with momentum, Adam / AdamW a running
    maximum only with amsgrad."""
    if name == "sgd":
        return ("momentum_buffer",) if hp.get("momentum") else ()
    if name in ("adam", "adamw"):
        return ("exp_avg", "exp_avg_sq", *(("max_exp_avg_sq",) if hp.get("amsgrad") else ()))
    return {"adagrad": ("sum",), "lamb": ("exp_avg", "exp_avg_sq")}[name]


def initial_state(name: str, shape: tuple[int, ...], **hp: Any) -> dict[str, np.ndarray]:
    """The state before the first step, as float32 arrays: zeros, or Adagrad's
    ``initial_accumulator_value``. (SGD's buffer is not read on its first step: the step call's
    ``fresh`` flag says so.)"""
    fill = float(hp.get("initial_accumulator_value", 0.0)) if name == "adagrad" else 0.0
    return {k: np.full(shape, fill, np.float32) for k in state_names(name, **hp)}


def in_place(rule: Callable[..., tuple[np.ndarray, dict]]) -> Callable[..., None]:
    """``rule`` as a step kernel's function (the reference provider's; see refcore.optim):
    ``fn(params, bottoms, grads, states, step, fresh, **hp)`` steps every tensor of the call and
    writes the new parameter (split again where ``bottoms`` holds the trailing halves) and state
    into the given arrays. A ``fresh`` state is not read: the rule starts it."""

    def reference(params: list, bottoms: list | None, grads: list, states: list, step: int,
                  fresh: bool, **hp: Any) -> None:  # fmt: skip
        for i, (p, g, s) in enumerate(zip(params, grads, states)):
            g32 = np.asarray(g, np.float32)  # bf16 widens exactly
            prev = {} if fresh else s
            if bottoms is None:
                new, out = rule(p, g32, prev, step=step, **hp)
                p[...] = new
            else:
                top, bottom, out = step_split_bf16(rule, p.view(np.uint16), bottoms[i], g32,
                                                   prev, step=step, **hp)  # fmt: skip
                p.view(np.uint16)[...], bottoms[i][...] = top, bottom
            for k, v in out.items():
                s[k][...] = v

    reference.__wrapped__ = rule  # type: ignore[attr-defined]
    return reference
