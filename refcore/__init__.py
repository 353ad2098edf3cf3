"""refcore: declarative op specs, NumPy references, and pluggable CPU kernel providers.

Every op has one declared meaning (``specs/*.yaml`` plus its NumPy reference in ``refcore.ops``);
providers add fast kernels that are tested against that meaning.

Example:
    >>> import numpy as np, refcore
    >>> refcore.run("softmax", np.zeros((1, 4), np.float32), dim=-1)
    array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from refcore import cpu, dispatch, library, ops
from refcore.buffers import MemoryStats, memory_stats, set_memory_limit
from refcore.dispatch import Explanation, ProviderUnavailableError, run
from refcore.integration import disable, enable, enabled
from refcore.optimize import optimize
from refcore.packed import PackedWeight, pack
from refcore.provider import Availability, Kernel, Provider, Verdict
from refcore.quantize import quantize
from refcore.registry import default_registry
from refcore.runtime import get_num_threads, set_num_threads, threads
from refcore.spec import OpSpec

__all__ = [
    "Availability",
    "Explanation",
    "Kernel",
    "MemoryStats",
    "PackedWeight",
    "Provider",
    "ProviderUnavailableError",
    "Verdict",
    "cpu",
    "disable",
    "enable",
    "enabled",
    "explain",
    "get_num_threads",
    "library",
    "memory_stats",
    "ops",
    "optimize",
    "pack",
    "providers",
    "quantize",
    "reference",
    "run",
    "set_memory_limit",
    "set_num_threads",
    "spec",
    "threads",
]
__version__ = "0.1.0"


def explain(what: Any = None, *args: Any, provider: str | None = None, **kwargs: Any) -> Any:
    """Say what runs, and why the alternatives do not.

    - ``explain("layer_norm", x, (768,))``: which kernel `run` would choose for this call.
    - ``explain()``: the routing report of the last `enable`/`enabled` (torch call, count, kernel
      or the reason torch ran it).
    - ``explain(model, *inputs)``: run ``model`` with routing on and return that report.
    """
    from refcore import integration

    if what is None:
        rep = integration.report()
        return rep if rep is not None else integration.RoutingReport("none (routing never enabled)")
    if isinstance(what, str):
        return dispatch.explain(what, *args, provider=provider or dispatch.AUTO, **kwargs)
    return integration.explain_model(what, *args, provider=provider, **kwargs)


def providers() -> dict[str, Availability]:
    """Every known provider: name -> availability, reason, and the ops it implements."""
    from refcore.provider import installed

    return {name: p.availability() for name, p in installed().items()}


def spec(name: str) -> OpSpec:
    """The declared spec of op ``name``."""
    return default_registry().op(name)


def reference(name: str) -> Callable[..., Any]:
    """The reference of op ``name``, callable on NumPy arrays or torch tensors.

    Example:
        >>> import numpy as np, refcore
        >>> refcore.reference("relu")(np.array([-1.0, 1.0], np.float32))
        array([0., 1.], dtype=float32)
    """
    from refcore.registry import resolve

    fn = resolve(spec(name).reference)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return run(name, *args, provider="reference", **kwargs)

    return call
