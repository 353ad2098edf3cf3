"""PyTorch Geometric models under refcore (extra ``gnn``; `refcore.models.gnn`).

PyG's layers aggregate a ``torch.sparse_csr`` ``adj_t`` through ``torch.sparse.mm(adj_t, x,
reduce)``, which routing runs as ``spmm_reduce``; an ``edge_index`` input gathers and scatters on
torch. Every provider's outputs must equal PyG on torch within spmm_reduce's tolerance, and the
report must say which kernel ran, as the registry says it should.
"""

from __future__ import annotations

import pytest
import torch

import refcore
from refcore.models import gnn
from refcore.provider import installed
from refcore.registry import default_registry

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

TOL = default_registry().op("spmm_reduce").tolerance_for("float32")


@pytest.fixture(scope="module")
def graph() -> gnn.Graph:
    return gnn.sbm(nodes=600, classes=5, seed=3)


def _providers() -> list[str]:
    return [n for n, p in installed().items() if p.availability().available]


def _sparse_rows(rep: refcore.RoutingReport) -> list[str]:
    return [o for f, _, o in rep.rows() if f == "torch.sparse.mm"]


def _expected_kernel(provider: str, op: str = "spmm_reduce"):
    """The provider's best-ranked float32 ``op`` kernel on this CPU (its kernels are those of
    the levels the CPU has), which rules mode runs; None when it has none (torch runs)."""
    prov = installed()[provider]
    found = [k for k in prov.kernels if k.op == op and "float32" in k.dtypes]
    return max(found, key=lambda k: k.priority) if found else None


@pytest.mark.parametrize("kind", gnn.MODELS)
@pytest.mark.parametrize("provider", _providers())
def test_a_pyg_model_under_enable_matches_pyg_on_torch(graph, kind, provider) -> None:
    m = gnn.model(kind, graph.x.shape[1], 5, hidden=32)
    adj = graph.adj_t()
    with torch.no_grad():
        want = m(graph.x, adj)
        # the two inputs are the same graph (coalesced, symmetric, no self-loops)
        torch.testing.assert_close(m(graph.x, graph.edge_index), want, atol=TOL.atol, rtol=1e-4)
        with refcore.enabled(provider) as rep:
            got = m(graph.x, adj)
    torch.testing.assert_close(got, want, atol=TOL.atol * 10, rtol=TOL.rtol)
    ran = _sparse_rows(rep)
    assert len(ran) >= 1, str(rep)  # both layers' aggregations were routed
    kernel = _expected_kernel(provider)
    for outcome in ran:
        if kernel is None:
            assert outcome == "torch: implements no kernel for spmm_reduce", str(rep)
        elif kernel.fallback and provider != "reference":  # portable C: never a speed choice
            head = f"torch: {provider}/{kernel.name} is a correctness fallback, not a speed choice"
            assert outcome == head or outcome.startswith(head + "; "), str(rep)
        else:  # tests choose by rules: the provider's kernel runs wherever it accepts the call
            assert outcome == f"{provider}/{kernel.name}", str(rep)


@pytest.mark.parametrize("kind", gnn.MODELS)
@pytest.mark.parametrize("adj_kind", ["edge_index", "adj_t"])
def test_a_pyg_model_under_optimize_matches_pyg_on_torch(graph, kind, adj_kind) -> None:
    m = gnn.model(kind, graph.x.shape[1], 5, hidden=32)
    adj = graph.edge_index if adj_kind == "edge_index" else graph.adj_t()
    with torch.no_grad():
        want = m(graph.x, adj)
        fast = refcore.optimize(m, provider="auto")
        got = fast(graph.x, adj)
        again = fast(graph.x, adj)
    torch.testing.assert_close(got, want, atol=TOL.atol * 10, rtol=TOL.rtol)
    torch.testing.assert_close(again, want, atol=TOL.atol * 10, rtol=TOL.rtol)
    if adj_kind == "adj_t":  # dynamo takes strided tensors only: routed op by op, and said so
        assert any("torch.sparse_csr" in n and "routed one by one" in n for n in fast.notes)
        rows = _sparse_rows(refcore.explain(fast, graph.x, adj))
        assert rows and all("spmm_reduce" in o for o in rows), rows


#: the fusion each model's edge_index aggregation matches (specs/fusions.yaml)
EDGE_FUSION = {
    "gcn": "gather_scatter_sum", "sage": "gather_scatter_mean", "gin": "gather_scatter_sum"
}


@pytest.fixture(scope="module")
def big_graph() -> gnn.Graph:
    """Large enough that no call is a "small call" routing leaves to torch."""
    return gnn.sbm(nodes=2000, classes=5, seed=4)


@pytest.mark.parametrize("kind", gnn.MODELS)
@pytest.mark.parametrize("provider", _providers())
def test_an_edge_index_model_under_optimize_runs_gather_scatter(big_graph, kind, provider) -> None:
    """PyG's default path (gather an E x F message, scatter it) becomes one gather_scatter call
    per layer, run by the provider's kernel as the registry and the CPU say."""
    g = big_graph
    m = gnn.model(kind, g.x.shape[1], 5, hidden=32)
    with torch.no_grad():
        want = m(g.x, g.edge_index)
        fast = refcore.optimize(m, provider=provider)
        got = fast(g.x, g.edge_index)
        rep = refcore.explain(fast, g.x, g.edge_index)
    torch.testing.assert_close(got, want, atol=TOL.atol * 10, rtol=TOL.rtol)
    fusion = EDGE_FUSION[kind]
    assert any(n.startswith(f"{fusion}: ") and n.endswith("-> gather_scatter")
               for n in fast.notes), fast.notes  # fmt: skip
    _ran(rep, provider, "gather_scatter")


@pytest.mark.parametrize("aggr", ["max", "min", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_pyg_aggregation_of_an_edge_list_fuses_and_matches(big_graph, aggr, dtype) -> None:
    """SAGEConv with each of PyG's aggregations (scatter_reduce_ amax / amin without self,
    scatter_add_, mean by count): one gather_scatter each, equal to PyG within the op's
    tolerance for the dtype (bf16: the op rounds once where PyG rounds every message)."""
    from torch_geometric.nn import SAGEConv

    g = big_graph
    torch.manual_seed(0)
    m = SAGEConv(g.x.shape[1], 24, aggr=aggr).to(dtype).eval()
    x = g.x.to(dtype)
    with torch.no_grad():
        want = m(x, g.edge_index)
        fast = refcore.optimize(m, provider="auto")
        got = fast(x, g.edge_index)
    assert any("-> gather_scatter" in n for n in fast.notes), fast.notes
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=TOL.atol * 10, rtol=TOL.rtol)
        return
    # bf16: PyG rounds every message, the sum and the mean; the op rounds once. Against the
    # same layer in float64 (the bf16 parameters widened) ours is no further off than PyG's.
    with torch.no_grad():
        exact = m.double()(x.double(), g.edge_index)
    err = (got.double() - exact).abs().max()
    assert err <= 1.5 * (want.double() - exact).abs().max() + 1e-3, err


def _ran(rep: refcore.RoutingReport, provider: str, op: str, suffixes: tuple = ("",)) -> bool:
    """True when the report's rows for ``op``'s calls say what ran as the registry and the CPU
    say it should (the `test_a_pyg_model_under_enable_matches_pyg_on_torch` rules), a kernel's
    outcome followed by each of ``suffixes`` at least once and nothing else."""
    func = {"spmm_reduce": "torch.sparse.mm", "segment_reduce": "torch.segment_reduce",
            "index_add": "torch.index_add"}.get(op, op)
    ran = {o for f, _, o in rep.rows() if f == func}
    kernel = _expected_kernel(provider, op)
    if kernel is None:
        want = {f"torch: implements no kernel for {op}"}
    elif kernel.fallback and provider != "reference":
        # (followed by the faster kernel's refusal where one declined)
        head = f"torch: {provider}/{kernel.name} is a correctness fallback, not a speed choice"
        assert ran and all(o == head or o.startswith(head + "; ") for o in ran), (head, str(rep))
        return False
    else:
        want = {f"{provider}/{kernel.name}{s}" for s in suffixes}
    assert ran == want, (want, str(rep))
    return kernel is not None and (not kernel.fallback or provider == "reference")


@pytest.mark.parametrize("kind", gnn.MODELS)
@pytest.mark.parametrize("provider", _providers())
def test_a_training_step_under_enable_gives_torchs_gradients(graph, kind, provider) -> None:
    """A call that needs autograd runs the provider's spmm_reduce kernel forward when the spec
    names a gradient op for every argument needing a gradient (dense: spmm_reduce_backward),
    and the backward pass routes that op's call: the parameters' gradients are torch's."""
    m = gnn.model(kind, graph.x.shape[1], 5, hidden=32).train()
    adj = graph.adj_t()

    def grads() -> list[torch.Tensor]:
        m.zero_grad()
        out = m(graph.x, adj)
        torch.nn.functional.cross_entropy(out, graph.y).backward()
        return [p.grad.clone() for p in m.parameters()]

    want = grads()
    with refcore.enabled(provider) as rep:
        got = grads()
    for (name, _), w, g in zip(m.named_parameters(), want, got):
        scale = float(w.abs().max()) or 1.0
        torch.testing.assert_close(g, w, atol=1e-4 * scale, rtol=1e-3, msg=name)
    # every second layer aggregates a tensor that needs a gradient; GCN's first aggregates
    # x @ W too, SAGE's and GIN's first aggregate x, which needs none
    suffix = " (with autograd: spmm_reduce_backward in backward)"
    if _ran(rep, provider, "spmm_reduce", (suffix,) if kind == "gcn" else ("", suffix)):
        _ran(rep, provider, "spmm_reduce_backward")
    else:
        assert all(f != "spmm_reduce_backward" for f, _, _ in rep.rows()), str(rep)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("provider", _providers())
def test_pygs_segment_over_a_pointer_routes_segment_reduce(reduce, provider) -> None:
    """torch_geometric.utils.segment (torch.segment_reduce over a CSR pointer, PyG's path
    without torch-scatter; mean with initial 0) under enable: PyG's result, the provider's
    segment_reduce kernel where the registry and the CPU say it runs."""
    from torch_geometric.utils import segment

    gen = torch.Generator().manual_seed(3)
    src = torch.randn(6000, 16, generator=gen)
    counts = torch.randint(0, 9, (1000,), generator=gen)
    counts[-1] += 6000 - int(counts.sum())  # the last segment takes the rest (counts sum to 6000)
    counts = counts.clamp(min=0)
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).clamp(max=6000)
    want = segment(src, ptr, reduce)
    with refcore.enabled(provider) as rep:
        got = segment(src, ptr, reduce)
    torch.testing.assert_close(got, want, atol=TOL.atol, rtol=TOL.rtol)
    _ran(rep, provider, "segment_reduce")


@pytest.mark.parametrize("provider", _providers())
def test_an_index_add_aggregation_routes_index_add(big_graph, provider) -> None:
    """Messages summed into their target nodes with torch.index_add (PyG's index-based
    aggregation of a 1-D index) under enable: torch's result, and the provider's index_add
    kernel where the registry and the CPU say it runs."""
    g = big_graph
    src, dst = g.edge_index
    msg = g.x.index_select(0, src)
    want = torch.index_add(torch.zeros_like(g.x), 0, dst, msg)
    with refcore.enabled(provider) as rep:
        got = torch.index_add(torch.zeros_like(g.x), 0, dst, msg)
    torch.testing.assert_close(got, want, atol=TOL.atol, rtol=TOL.rtol)
    _ran(rep, provider, "index_add")


@pytest.mark.parametrize("kind", gnn.MODELS)
@pytest.mark.parametrize("provider", _providers())
def test_an_edge_index_training_step_through_the_compile_backend(big_graph, kind, provider) -> None:
    """torch.compile with refcore's backend on PyG's edge_index path: each layer's message
    passing is one gather_scatter (the fusion), whose call that needs autograd runs the
    provider's kernel forward and routes gather_scatter_backward in the backward pass (x's
    gradient); the parameters' gradients are eager PyG's."""
    from refcore.compile_backend import backend

    g = big_graph
    torch.manual_seed(0)
    m = gnn.model(kind, g.x.shape[1], 5, hidden=32).train()

    def grads(net: torch.nn.Module) -> list[torch.Tensor]:
        m.zero_grad()
        torch.nn.functional.cross_entropy(net(g.x, g.edge_index), g.y).backward()
        return [p.grad.clone() for p in m.parameters()]

    want = grads(m)
    torch._dynamo.reset()  # the models share PyG's code objects: no recompile limit reached
    got = grads(torch.compile(m, backend=backend(provider), dynamic=True))
    rep = refcore.explain()  # the compiled call's report, its backward's rows included
    for (name, _), w, gr in zip(m.named_parameters(), want, got):
        scale = float(w.abs().max()) or 1.0
        torch.testing.assert_close(gr, w, atol=1e-4 * scale, rtol=1e-3, msg=name)
    # GCN's first layer aggregates x @ W, which needs a gradient; SAGE's and GIN's aggregate x
    suffix = " (with autograd: gather_scatter_backward in backward)"
    if _ran(rep, provider, "gather_scatter", (suffix,) if kind == "gcn" else ("", suffix)):
        _ran(rep, provider, "gather_scatter_backward")
    else:
        assert all(f != "gather_scatter_backward" for f, _, _ in rep.rows()), str(rep)


@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("provider", _providers())
def test_an_amax_or_amin_gradient_goes_to_torchs_winner(graph, reduce, provider) -> None:
    """The gradient of an extreme goes to the nonzero torch's rule picks (the first of equal
    products): features of few distinct values make ties in most rows."""
    adj = graph.adj_t()
    x = torch.randint(-2, 3, (graph.nodes, 6)).float()
    g = torch.randn(graph.nodes, 6)

    def grad() -> torch.Tensor:
        d = x.clone().requires_grad_()
        torch.sparse.mm(adj, d, reduce).backward(g)
        return d.grad

    want = grad()
    with refcore.enabled(provider) as rep:
        got = grad()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    suffix = " (with autograd: spmm_reduce_backward in backward)"
    if _ran(rep, provider, "spmm_reduce", (suffix,)):
        _ran(rep, provider, "spmm_reduce_backward")


def test_a_gradient_of_the_sparse_operand_stays_on_torch(graph) -> None:
    """spmm_reduce names a gradient op for dense only: a CSR operand that needs a gradient
    keeps the whole call on torch, which says so, and autograd gives torch's gradients."""
    adj = graph.adj_t().requires_grad_()
    x = torch.randn(graph.nodes, 4, requires_grad=True)
    with refcore.enabled("reference") as rep:
        torch.sparse.mm(adj, x, "sum").sum().backward()
    assert _sparse_rows(rep) == ["torch: needs autograd (no gradient op for values)"], str(rep)
    ones = torch.ones(graph.nodes, 4)
    torch.testing.assert_close(x.grad, adj.detach().to_dense().t() @ ones)
    assert adj.grad is not None and adj.grad.layout == torch.sparse_csr


@pytest.mark.model_scale
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_training_through_refcore_reaches_torch_accuracy(kind) -> None:
    """Node classification on the block-model graph: the features alone reach about 36% on its
    7 communities, so an accuracy near torch's needs the edges. The training forward's
    aggregations run refcore's kernel where one measures faster, and so do their gradients."""
    g = gnn.sbm()
    adj = g.adj_t()
    theirs = gnn.train(gnn.model(kind, g.x.shape[1], 7, hidden=32), g, adj)
    with refcore.enabled("auto"):
        ours = gnn.train(gnn.model(kind, g.x.shape[1], 7, hidden=32), g, adj)
    assert theirs > 0.7, theirs
    assert abs(ours - theirs) <= 0.01, (ours, theirs)


@pytest.mark.parametrize(
    "case",
    ["coo", "csc", "two_sparse", "max_spelling"],
)
def test_sparse_mm_calls_that_are_not_spmm_reduce_stay_on_torch(case) -> None:
    """torch.sparse.mm on other layouts or spellings runs on torch, with torch's own outcome."""
    torch.manual_seed(0)
    dense = torch.randn(6, 4)
    csr = (torch.rand(5, 6) < 0.4).float().to_sparse_csr()
    a, b, reduce = {
        "coo": (csr.to_sparse_coo(), dense, "sum"),
        "csc": (csr.to_sparse_csc(), dense, "sum"),
        "two_sparse": (csr, csr.t().to_sparse_csr(), "sum"),
        "max_spelling": (csr, dense, "max"),  # torch's alias of amax; refcore's choices differ
    }[case]

    def call() -> object:
        try:
            return torch.sparse.mm(a, b, reduce)
        except Exception as e:  # torch's own error, which routing must leave as it is
            return type(e)

    want = call()
    with refcore.enabled("reference") as rep:
        got = call()
    if isinstance(want, type):
        assert got is want
    else:
        torch.testing.assert_close(got.to_dense(), want.to_dense())
    assert all(o.startswith("torch:") for o in _sparse_rows(rep)), str(rep)


def test_the_graphs_are_deterministic_symmetric_and_loop_free() -> None:
    a, b = gnn.sbm(nodes=300, seed=5), gnn.sbm(nodes=300, seed=5)
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    for g in (a, gnn.power_law(nodes=4096, edges=40_000, seed=1)):
        src, dst = g.edge_index
        assert bool((src != dst).all())
        n = g.nodes
        keys = src * n + dst
        assert keys.unique().numel() == keys.numel()  # no duplicate edge
        assert torch.equal(keys.sort().values, (dst * n + src).sort().values)  # symmetric
    # R-MAT's degrees are heavy-tailed: the largest far above the mean
    deg = torch.bincount(g.edge_index[1], minlength=g.nodes).float()
    assert deg.max() > 10 * deg.mean()


def test_a_call_torch_has_no_kernel_for_runs_a_kernel_that_has_one(monkeypatch) -> None:
    """torch.sparse.mm(csr, dense) on bf16 values (reduce sum) raises in torch 2.13
    ("addmm_out_sparse_csr_impl_mkl" not implemented for 'BFloat16'); the spec accepts it, so
    measured choice runs the kernel that can, and says why."""
    monkeypatch.setenv("REFCORE_CHOICE", "measure")
    g = gnn.sbm(nodes=300, seed=1)
    adj = g.adj_t().to(torch.bfloat16)
    x = torch.randn(g.nodes, 16).to(torch.bfloat16)
    with pytest.raises(RuntimeError):
        torch.sparse.mm(adj, x)
    want = refcore.run("spmm_reduce", adj, x, "sum", provider="reference")
    with refcore.enabled("auto") as rep:
        got = torch.sparse.mm(adj, x)
    (outcome,) = _sparse_rows(rep)
    assert "torch has no kernel for this call" in outcome, outcome
    bf16 = default_registry().op("spmm_reduce").tolerance_for("bfloat16")
    torch.testing.assert_close(got.float(), want.float(), atol=bf16.atol, rtol=bf16.rtol)


def test_bench_gnn_times_every_mode_against_pyg_and_checks_its_output() -> None:
    from refcore import bench_gnn

    (row,) = bench_gnn.gnn_rows(["sage"], ["float32"], repeat=1, nodes=2000, edges=16000,
                                modes=("pyg", "pyg_csr", "enable", "optimize",
                                       "optimize_ei"))  # fmt: skip
    assert set(row.ms) == {"pyg", "pyg_csr", "enable", "optimize", "optimize_ei"}
    assert all(t is not None and t > 0 for t in row.ms.values()), row
    assert row.ratio["pyg"] == 1.0
    assert not any("error" in n or "failed" in n for n in row.notes.values()), row.notes
    assert "routed one by one" in row.notes["optimize"]
    assert "gather_scatter_mean: 2 match(es) -> gather_scatter" in row.notes["optimize_ei"]
    assert bench_gnn.table([row])[0][:6] == ["model", "graph", "dtype", "mode", "ms", "x pyg"]


def test_bench_gnn_train_times_a_step_per_mode_from_the_same_parameters() -> None:
    from refcore import bench_gnn

    (row,) = bench_gnn.train_rows(["gcn"], ["float32"], repeat=1, nodes=2000, edges=16000,
                                  modes=("pyg", "pyg_csr", "enable"))  # fmt: skip
    assert set(row.ms) == {"pyg", "pyg_csr", "enable"}
    assert all(t > 0 for t in row.ms.values()) and row.ratio["pyg"] == 1.0, row
    assert not row.notes, row.notes  # every first loss is pyg's: no mode trained otherwise


def test_bench_gnn_rss_runs_each_mode_in_its_own_process() -> None:
    from refcore import bench_gnn

    rows = bench_gnn.rss_rows(["gin"], nodes=3000, edges=20000,
                              modes=("pyg", "enable", "optimize_ei"))  # fmt: skip
    assert [r.mode for r in rows] == ["pyg", "enable", "optimize_ei"]
    for r in rows:
        assert not r.error, r
        assert r.before_mb > 0 and r.peak_growth_mb >= 0 and r.seconds > 0, r
        assert r.later_growth_mb >= 0 and r.later_seconds > 0, r
    assert bench_gnn.rss_table(rows)[0][4:8] == ["1st peak +MB", "1st s", "2nd peak +MB", "2nd s"]
