"""Prepacked layouts (specs/layouts.yaml): pack / unpack references and how a PackedWeight binds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import refcore
from refcore.packed import PackedWeight, unpack
from refcore.registry import default_registry, resolve
from refcore.tensors import numpy_dtype

REG = default_registry()
LAYOUTS = sorted(REG.layouts)


@pytest.mark.parametrize("layout", LAYOUTS)
@given(n=st.integers(1, 70), k=st.integers(1, 100), seed=st.integers(0, 2**32 - 1))
def test_unpack_of_pack_is_identity(layout: str, n: int, k: int, seed: int) -> None:
    spec = REG.layouts[layout]
    rng = np.random.default_rng(seed)
    # a weight of the layout's rank (len(block)): (N, K), or (O, C, kH, kW) for a conv layout
    shape = (n, k, *rng.integers(1, 4, len(spec.block) - 2))
    for dt in spec.dtypes:
        w = rng.standard_normal(shape).astype(numpy_dtype(dt))
        w.flat[seed % w.size] = np.nan
        p = resolve(spec.pack)(w)
        p = p[0] if isinstance(p, tuple) else p  # (data, held forms): see refcore.packed.pack
        assert p.dtype == w.dtype and p.flags.c_contiguous
        whole = [-(-d // b) * b for d, b in zip(shape, spec.block)]
        assert p.size == np.prod(whole)  # whole blocks, nothing more
        back = resolve(spec.unpack)(p, shape)
        assert back.tobytes() == w.tobytes()
        assert (p.view(np.uint8) != 0).sum() <= w.view(np.uint8).size  # padding is zeros


def test_amx_layout_element_formula() -> None:
    w = np.arange(20 * 40, dtype=np.float32).reshape(20, 40).astype(numpy_dtype("bfloat16"))
    p = resolve(REG.layouts["amx_bf16_vnni2"].pack)(w)
    assert p.shape == (2, 2, 16, 16, 2)
    for nb, kb, r, c, t in [(0, 0, 0, 0, 1), (1, 1, 3, 2, 0), (0, 1, 2, 5, 1)]:
        assert p[nb, kb, r, c, t] == w[16 * nb + c, 32 * kb + 2 * r + t]
    assert p[1, 1, 4, 4, 0] == 0  # row 20 (past N = 20) is padding


def test_packed_weight_binds_as_its_logical_shape() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    w = rng.standard_normal((3, 7)).astype(np.float32)
    pw = refcore.pack("linear", w, "avx512_f32_panel32")
    assert isinstance(pw, PackedWeight) and pw.shape == (3, 7)
    np.testing.assert_array_equal(unpack(pw), w)
    got = refcore.run("linear", x, pw, provider="reference")
    np.testing.assert_array_equal(got, refcore.run("linear", x, w, provider="reference"))
    with pytest.raises(ValueError, match=r"'weight' expected shape \(N, 6\)"):
        refcore.run("linear", x[:, :6], pw, provider="reference")


def test_pack_errors_name_op_argument_and_layout() -> None:
    w = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="unknown layout 'nope'"):
        refcore.pack("linear", w, "nope")
    with pytest.raises(TypeError, match="'weight' expected dtype bfloat16 for layout"):
        refcore.pack("linear", w, "amx_bf16_vnni2")
    with pytest.raises(ValueError, match="'weight' expected one of the arguments of layout"):
        refcore.pack("layer_norm", w, "avx512_f32_panel32")
    with pytest.raises(ValueError, match="'weight' expected a 2-D tensor"):
        refcore.pack("linear", np.zeros(3, np.float32), "avx512_f32_panel32")
    pw = refcore.pack("linear", w, "avx512_f32_panel32")
    with pytest.raises(TypeError, match="'other' expected a plain array"):
        refcore.run("matmul", np.zeros((2, 4), np.float32), pw)


def test_kernels_without_the_layout_decline_it() -> None:
    w = np.zeros((3, 4), np.float32)
    pw = refcore.pack("linear", w, "avx512_f32_panel32")
    k = refcore.Kernel(op="linear", name="any", fn=lambda **a: None, dtypes=frozenset({"float32"}))
    from refcore.call import bind

    verdict = k.supports(bind(REG.op("linear"), (np.zeros((2, 4), np.float32), pw), {}))
    assert not verdict and "packed as avx512_f32_panel32" in verdict.reason
