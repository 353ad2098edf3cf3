"""Dispatch: provider discovery, deterministic ranking, explain, explicit-provider errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refcore
from refcore import provider as prov_mod
from refcore.dispatch import ProviderUnavailableError
from refcore.provider import Kernel, Provider, Verdict, disabled, using_providers

X = np.array([[-1.0, 0.5], [2.0, -3.0]], np.float32)


def _kernel(name: str, value: float, **kw) -> Kernel:
    return Kernel(op="relu", name=name, fn=lambda input: np.full_like(input, value),
                  dtypes=frozenset({"float32"}), **kw)  # fmt: skip


def test_public_api_names() -> None:
    for name in ("run", "explain", "providers", "spec", "ops", "reference", "cpu"):
        assert hasattr(refcore, name)
    assert "relu" in refcore.ops() and refcore.spec("relu").name == "relu"


def test_builtin_providers_report_themselves() -> None:
    provs = refcore.providers()
    assert provs["reference"].available and "relu" in provs["reference"].ops
    for name in ("numba", "native"):  # installed stubs, found through entry points
        assert name in provs, f"{name} provider not discovered"
        assert provs[name].reason, f"{name} gives no reason"
    assert "implements" in str(provs["numba"])


def test_numpy_in_numpy_out_torch_in_torch_out() -> None:
    out = refcore.run("relu", X)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    t = torch.from_numpy(X).to(torch.bfloat16)
    out_t = refcore.run("relu", t)
    assert isinstance(out_t, torch.Tensor) and out_t.dtype == torch.bfloat16
    assert torch.equal(out_t, torch.relu(t))


def test_reference_callable_accepts_both_kinds() -> None:
    ref = refcore.reference("relu")
    assert ref.__name__ == "relu" and ref.__doc__
    np.testing.assert_array_equal(ref(X), np.maximum(X, 0))
    assert isinstance(ref(torch.from_numpy(X)), torch.Tensor)


def test_sparse_csr_tensor_in_place_of_three_arguments() -> None:
    if "spmm_reduce" not in refcore.ops():
        pytest.fail("spmm_reduce is not declared")
    dense = torch.randn(3, 4)
    csr = torch.tensor([[1.0, 0, 2], [0, 0, 0]]).to_sparse_csr()
    got = refcore.run("spmm_reduce", csr, dense, "sum")
    torch.testing.assert_close(got, torch.sparse.mm(csr, dense, "sum"))


def test_priority_ranking_is_deterministic_and_explained() -> None:
    fast = Provider(name="fast", kernels=(_kernel("k_hi", 1.0, priority=5), _kernel("k_lo", 2.0)),
                    priority=5)  # fmt: skip
    slow = Provider(name="slow", kernels=(_kernel("k", 3.0),), priority=1)
    with using_providers(slow, fast):
        assert refcore.run("relu", X)[0, 0] == 1.0
        why = refcore.explain("relu", X)
        assert why.chosen == ("fast", "k_hi")
        assert [(c.provider, c.kernel) for c in why.candidates] == [
            ("fast", "k_hi"),
            ("fast", "k_lo"),
            ("slow", "k"),
            ("reference", "reference"),
        ]
        assert refcore.run("relu", X, provider="slow")[0, 0] == 3.0


def test_declined_kernel_falls_back_and_explain_says_why() -> None:
    picky = Provider(name="picky", kernels=(
        _kernel("needs_big", 1.0, rule=lambda c: Verdict(False, "input smaller than 64 elements")),
    ), priority=5)  # fmt: skip
    with using_providers(picky):
        np.testing.assert_array_equal(refcore.run("relu", X), np.maximum(X, 0))
        text = str(refcore.explain("relu", X))
        assert "runs reference/reference" in text
        assert "declined: input smaller than 64 elements" in text
        with pytest.raises(ProviderUnavailableError, match="input smaller than 64 elements"):
            refcore.run("relu", X, provider="picky")


def test_layout_and_dtype_declines() -> None:
    contig = Provider(
        name="contig", kernels=(_kernel("c", 1.0, layouts=frozenset({"contiguous"})),)
    )
    with using_providers(contig):
        why = refcore.explain("relu", X.T)
        assert "declined: input is strided" in str(why)
        why = refcore.explain("relu", X.astype(refcore.tensors.BFLOAT16))
        assert "declined: dtype bfloat16 not in ['float32']" in str(why)


def test_isa_level_decline(monkeypatch) -> None:
    amx = Provider(name="amx", kernels=(_kernel("tiles", 1.0, isa="amx"),))
    monkeypatch.setenv("REFCORE_CPU_CAPABILITY", "avx2")
    with using_providers(amx):
        assert "declined: needs ISA level amx, CPU offers" in str(refcore.explain("relu", X))


def test_explicit_provider_without_kernel_raises() -> None:
    with using_providers(Provider(name="empty")):
        with pytest.raises(ProviderUnavailableError, match="empty.*implements no kernel for relu"):
            refcore.run("relu", X, provider="empty")


def test_unavailable_provider_is_reported_not_raised() -> None:
    broken = Provider(
        name="broken", kernels=(_kernel("k", 1.0),), probe=lambda: (False, "compiler exploded")
    )
    with using_providers(broken):
        assert refcore.providers()["broken"].reason == "compiler exploded"
        assert "provider unavailable: compiler exploded" in str(refcore.explain("relu", X))
        with pytest.raises(ProviderUnavailableError, match="compiler exploded"):
            refcore.run("relu", X, provider="broken")


def test_disabled_scope() -> None:
    fast = Provider(name="fast", kernels=(_kernel("k", 1.0),), priority=5)
    with using_providers(fast):
        with disabled("fast"):
            assert refcore.providers()["fast"].reason == "disabled in this scope"
            np.testing.assert_array_equal(refcore.run("relu", X), np.maximum(X, 0))
        assert refcore.run("relu", X)[0, 0] == 1.0
    with pytest.raises(ValueError, match="cannot be disabled"):
        with disabled("reference"):
            pass


class _EP:
    def __init__(self, name, value, loader):
        self.name, self.value, self._loader = name, value, loader

    def load(self):
        return self._loader()


def test_broken_entry_points_become_unavailable(monkeypatch) -> None:
    def boom():
        raise ImportError("no module named shiny")

    eps = [
        _EP("shiny", "shiny:make", boom),
        _EP("liar", "liar:make", lambda: lambda: Provider(name="other")),
        _EP("good", "good:make", lambda: lambda: Provider(name="good")),
        _EP("good", "dupe:make", lambda: lambda: Provider(name="good")),
    ]
    monkeypatch.setattr(prov_mod.metadata, "entry_points", lambda group: eps)
    found = prov_mod.discover()
    assert "failed to load shiny:make" in found["shiny"].availability().reason
    assert "did not return a Provider named 'liar'" in found["liar"].availability().reason
    assert found["good"].availability().available
    assert "already taken" in found["good@dupe:make"].availability().reason


def test_run_remembers_its_choice_per_structure_and_provider_set() -> None:
    """A repeated call structure skips selection, but never across provider sets or dtypes."""
    one = Provider(name="one", kernels=(_kernel("k", 1.0),), priority=5)
    two = Provider(name="two", kernels=(_kernel("k", 2.0),), priority=5)
    for _ in range(2):
        with using_providers(one):
            assert refcore.run("relu", X)[0, 0] == 1.0
            assert refcore.run("relu", torch.from_numpy(X))[0, 0] == 1.0  # torch in, torch out
            assert isinstance(refcore.run("relu", torch.from_numpy(X)), torch.Tensor)
        with using_providers(two):
            assert refcore.run("relu", X)[0, 0] == 2.0
        with using_providers(one), disabled("one"):
            np.testing.assert_array_equal(refcore.run("relu", X), np.maximum(X, 0))
    y = X * 3  # same structure, new values: the result follows the values
    np.testing.assert_array_equal(refcore.run("relu", y, provider="reference"), np.maximum(y, 0))
    np.testing.assert_array_equal(refcore.run("relu", X, provider="reference"), np.maximum(X, 0))


# A call's outcome never depends on the calls before it: run's memo and the router's are keyed by
# `refcore.call.structure_key`, which must tell apart whatever a check or a kernel's verdict reads.


def _unaligned(shape: tuple, dtype=torch.float32, channels_last: bool = False) -> torch.Tensor:
    """A tensor one byte past an aligned address (torch.frombuffer(offset=1)), random values."""
    n = int(np.prod(shape))
    size = torch.tensor([], dtype=dtype).element_size()
    t = torch.frombuffer(bytearray(n * size + 1), dtype=dtype, count=n, offset=1)
    if channels_last:
        s = (shape[0], shape[2], shape[3], shape[1])
        t = t.view(s).permute(0, 3, 1, 2)
    else:
        t = t.view(shape)
    t.copy_(torch.randn(shape))
    assert t.data_ptr() % size != 0
    return t


@pytest.mark.parametrize("order", ["int first", "float first"])
def test_attribute_types_are_checked_whatever_ran_before(order: str) -> None:
    """1 == 1.0 == True in Python: the memo must not let softmax(x, 1.0) ride on softmax(x, 1)."""
    x = torch.randn(3, 4)
    calls = [lambda: refcore.run("softmax", x, 1), lambda: refcore.run("softmax", x, 1.0)]
    for _ in range(2):
        for i in [0, 1] if order == "int first" else [1, 0]:
            if i == 0:
                torch.testing.assert_close(calls[0](), torch.softmax(x, 1))
            else:
                with pytest.raises(TypeError, match="softmax: argument 'dim' expected int"):
                    calls[1]()
    y = torch.randn(3, 4)
    for _ in range(2):
        torch.testing.assert_close(refcore.run("add", x, y, alpha=1), x + y)
        with pytest.raises(TypeError, match="add: argument 'alpha' expected float; got bool"):
            refcore.run("add", x, y, alpha=True)


def test_signed_zero_attributes_are_distinct_calls() -> None:
    """0.0 == -0.0 (and hash alike): alpha=-0.0 after alpha=0.0 must still give -0.0 + -0.0."""
    x, y = torch.full((4,), -0.0), torch.ones(4)
    for _ in range(2):
        assert not torch.signbit(refcore.run("add", x, y, alpha=0.0)).any()
        assert torch.signbit(refcore.run("add", x, y, alpha=-0.0)).all()


@pytest.mark.parametrize("provider", ["auto", "native"])
def test_unaligned_channels_last_conv_after_an_aligned_one(provider: str) -> None:
    """Same shape and strides, one aligned and one not: the second is checked on its own."""
    w = torch.randn(8, 4, 3, 3)
    aligned = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    odd = _unaligned((2, 4, 6, 6), channels_last=True)
    assert odd.stride() == aligned.stride()
    for x in (aligned, odd, aligned, odd):
        expect = torch.nn.functional.conv2d(x, w, None, 1, 1)
        if provider == "native" and x is odd:
            with pytest.raises(ProviderUnavailableError, match="input is unaligned"):
                refcore.run("conv2d", x, w, None, 1, 1, provider=provider)
            continue
        if provider == "native" and not refcore.providers()["native"].available:
            pytest.skip("native provider unavailable")
        got = refcore.run("conv2d", x, w, None, 1, 1, provider=provider)
        torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["relu", "gelu", "softmax", "layer_norm"])
def test_unaligned_tensors_fall_back_and_explain_says_why(op: str) -> None:
    """frombuffer(offset=1) data: kernels needing aligned memory decline, the next one runs."""
    x = _unaligned((128,))
    args = {"softmax": (0,), "layer_norm": ([128],)}.get(op, ())
    f = torch.nn.functional
    torch_fn = {"relu": torch.relu, "gelu": f.gelu, "softmax": torch.softmax,
                "layer_norm": f.layer_norm}[op]  # fmt: skip
    expect = torch_fn(x.clone(), *args)
    for _ in range(2):
        torch.testing.assert_close(refcore.run(op, x, *args), expect, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(refcore.run(op, x.clone(), *args), expect, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    for cand in refcore.explain(op, x, *args).candidates:
        if cand.verdict.startswith("declined") and "contiguous" in cand.verdict:
            assert "input is unaligned" in cand.verdict
    with refcore.enabled("auto"):
        big = _unaligned((64, 512))
        expect = torch_fn(big.clone(), *({"layer_norm": ([512],)}.get(op, args)))
        for _ in range(2):
            got = torch_fn(big, *({"layer_norm": ([512],)}.get(op, args)))
            torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
