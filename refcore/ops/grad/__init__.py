"""Backward references: the gradient of each differentiable op, as the op's spec declares it.

An op's spec may carry ``backward: {wrt: [args...]}``; its reference is
``refcore.ops.grad.<family>:<op>`` (or the spec's ``backward.reference``), called as
``fn(grad_output, **the forward call's arguments)`` and returning ``{arg: gradient}`` for each
``wrt`` argument: float64 arithmetic on the stored values, each gradient rounded once to its
argument's dtype, as the forward references do. tests/test_backward.py checks each against
torch's autograd in float64 on inputs drawn from the op's samples.

Example:
    >>> import numpy as np
    >>> from refcore.ops.grad import elementwise
    >>> elementwise.relu(np.float32([1.0, 2.0]), input=np.float32([-1.0, 3.0]))["input"].tolist()
    [0.0, 2.0]
"""
