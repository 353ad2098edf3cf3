"""NumPy references, one module per spec family: the meaning of every op.

Each op ``name`` in ``specs/<family>.yaml`` has ``refcore.ops.<family>.name`` (the reference) and
``refcore.ops.<family>.check_name`` (strict validation, run before any kernel). References compute
in float64 and round once to the output dtype (bf16 round-to-nearest-even, as torch does).

``refcore.ops`` is also the public function listing every op name: calling this package, as in
``refcore.ops()``, returns the sorted op names declared in the specs.

Example:
    >>> import refcore
    >>> "layer_norm" in refcore.ops()
    True
"""

from __future__ import annotations

import sys
import types


class _OpsPackage(types.ModuleType):
    # The package name `refcore.ops` and the public API `refcore.ops()` coincide: Python binds a
    # subpackage to its parent's attribute on import, which would shadow a plain function, so the
    # package itself answers the call.
    def __call__(self) -> list[str]:
        """All op names declared in the specs, sorted."""
        from refcore.registry import default_registry

        return sorted(default_registry().ops)


sys.modules[__name__].__class__ = _OpsPackage
