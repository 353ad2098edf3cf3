"""Fused-op references: each is the composition of its pattern's references (specs/fusions.yaml).

Precision policy: exactly that of the composition, intermediate rounding included: the
intermediate is rounded to the input dtype between the two ops, as torch does when it runs the
unfused ops. A fused kernel that keeps the intermediate in fp32 differs by at most the rounding of
that intermediate, which the spec tolerances allow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np

from refcore.ops import conv, elementwise, linalg, norm


def _stand_in(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` for a check that reads only shapes and dtypes: a zero-stride view of
    one element, so checking a chain's later link allocates nothing."""
    return np.broadcast_to(np.zeros((), dtype), shape)


@contextlib.contextmanager
def _named(fused: str) -> Iterator[None]:
    """Re-raise a component's validation error with the fused op's name in front."""
    try:
        yield
    except (ValueError, TypeError, IndexError) as e:
        raise type(e)(f"{fused}: {e}") from None


def check_add_relu(input: np.ndarray, other: np.ndarray) -> None:
    with _named("add_relu"):
        elementwise.check_add(input, other)


def add_relu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    """relu(input + other)."""
    check_add_relu(input, other)
    return elementwise.relu(elementwise.add(input, other))


def check_add_gelu(input: np.ndarray, other: np.ndarray, *, approximate: str = "none") -> None:
    with _named("add_gelu"):
        elementwise.check_add(input, other)


def add_gelu(input: np.ndarray, other: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """gelu(input + other) (bias + GELU of a BERT intermediate layer)."""
    check_add_gelu(input, other, approximate=approximate)
    return elementwise.gelu(elementwise.add(input, other), approximate=approximate)


def check_add_silu(input: np.ndarray, other: np.ndarray) -> None:
    with _named("add_silu"):
        elementwise.check_add(input, other)


def add_silu(input: np.ndarray, other: np.ndarray) -> np.ndarray:
    """silu(input + other)."""
    check_add_silu(input, other)
    return elementwise.silu(elementwise.add(input, other))


def check_add_layer_norm(
    input: np.ndarray,
    other: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> None:
    with _named("add_layer_norm"):
        elementwise.check_add(input, other)
        shape = np.broadcast_shapes(input.shape, other.shape)
        norm.check_layer_norm(_stand_in(shape, input.dtype), normalized_shape, weight, bias, eps)


def add_layer_norm(
    input: np.ndarray,
    other: np.ndarray,
    normalized_shape: Sequence[int],
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    eps: float = 1e-5,
) -> np.ndarray:
    """layer_norm(input + other) (the residual add + norm of a post-LN transformer block)."""
    check_add_layer_norm(input, other, normalized_shape, weight, bias, eps)
    return norm.layer_norm(elementwise.add(input, other), normalized_shape, weight, bias, eps)


def check_linear_relu(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> None:
    with _named("linear_relu"):
        linalg.check_linear(input, weight, bias)


def linear_relu(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """relu(linear(input, weight, bias))."""
    check_linear_relu(input, weight, bias)
    return elementwise.relu(linalg.linear(input, weight, bias))


def check_linear_gelu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    approximate: str = "none",
) -> None:
    with _named("linear_gelu"):
        linalg.check_linear(input, weight, bias)


def linear_gelu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    approximate: str = "none",
) -> np.ndarray:
    """gelu(linear(input, weight, bias))."""
    check_linear_gelu(input, weight, bias, approximate=approximate)
    return elementwise.gelu(linalg.linear(input, weight, bias), approximate=approximate)


def check_linear_silu(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> None:
    with _named("linear_silu"):
        linalg.check_linear(input, weight, bias)


def linear_silu(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """silu(linear(input, weight, bias))."""
    check_linear_silu(input, weight, bias)
    return elementwise.silu(linalg.linear(input, weight, bias))


def check_linear_add(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, other: np.ndarray
) -> None:
    with _named("linear_add"):
        linalg.check_linear(input, weight, bias)
        out_shape = (*input.shape[:-1], weight.shape[0])
        elementwise.check_add(_stand_in(out_shape, input.dtype), other)


def linear_add(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, other: np.ndarray
) -> np.ndarray:
    """linear(input, weight, bias) + other (a residual add in the GEMM epilogue)."""
    check_linear_add(input, weight, bias, other)
    return elementwise.add(linalg.linear(input, weight, bias), other)


def check_conv2d_relu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: conv.IntPair = 1,
    padding: conv.IntPair | str = 0,
    dilation: conv.IntPair = 1,
    groups: int = 1,
) -> None:
    with _named("conv2d_relu"):
        conv.check_conv2d(input, weight, bias, stride, padding, dilation, groups)


def conv2d_relu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    stride: conv.IntPair = 1,
    padding: conv.IntPair | str = 0,
    dilation: conv.IntPair = 1,
    groups: int = 1,
) -> np.ndarray:
    """relu(conv2d(input, weight, bias, stride, padding, dilation, groups))."""
    check_conv2d_relu(input, weight, bias, stride, padding, dilation, groups)
    return elementwise.relu(conv.conv2d(input, weight, bias, stride, padding, dilation, groups))


def check_conv2d_add_relu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    other: np.ndarray,
    stride: conv.IntPair = 1,
    padding: conv.IntPair | str = 0,
    dilation: conv.IntPair = 1,
    groups: int = 1,
) -> None:
    with _named("conv2d_add_relu"):
        conv.check_conv2d(input, weight, bias, stride, padding, dilation, groups)
        out = conv.output_shape(input, weight, stride, padding, dilation)
        elementwise.check_add(_stand_in(out, input.dtype), other)


def conv2d_add_relu(
    input: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray | None,
    other: np.ndarray,
    stride: conv.IntPair = 1,
    padding: conv.IntPair | str = 0,
    dilation: conv.IntPair = 1,
    groups: int = 1,
) -> np.ndarray:
    """relu(conv2d(input, weight, bias, ...) + other) (ResNet's residual block tail)."""
    check_conv2d_add_relu(input, weight, bias, other, stride, padding, dilation, groups)
    y = conv.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return elementwise.relu(elementwise.add(y, other))
