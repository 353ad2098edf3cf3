"""NumPy references, one module per spec family: the meaning of every op.

Each op ``name`` in ``specs/<family>.yaml`` has ``refcore.ops.<family>.name`` (the reference) and
``refcore.ops.<family>.check_name`` (strict validation, run before any kernel). References compute
in float64 and round once to the output dtype (bf16 round-to-nearest-even, as torch does).
"""
