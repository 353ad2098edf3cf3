"""PyTorch Geometric models and offline graphs for the GNN tests and benchmarks (extra ``gnn``).

- `sbm`: a stochastic-block-model graph from a fixed seed, communities as labels and noisy
  community indicators as features, with train / validation / test masks: a node-classification
  task whose accuracy is real (a model must use the edges: the features alone are noisy).
- `power_law`: an R-MAT graph (the Graph500 generator's recursive quadrant split), heavy-tailed
  degrees as real graphs have, at any size (100k nodes / 1.6M edges for the speed rows).
- `model`: a two-layer GCN, GraphSAGE (mean) or GIN of PyG's own layers.
- `adjacency`: the ``torch.sparse_csr`` ``adj_t`` PyG's layers take in place of ``edge_index``
  (row i holds the sources of the edges into node i). With it a layer aggregates through
  ``torch.sparse.mm(adj_t, x, reduce)``, which refcore routes as ``spmm_reduce``; with an
  ``edge_index`` it gathers an E x F message tensor and scatters it, which stays on torch.

Graphs are coalesced, symmetric and free of self-loops, so both inputs give PyG's layers the
same graph (GCN adds its self-loops itself, differently for the two inputs when one is there).

Example:
    >>> g = sbm(nodes=200, classes=4, seed=0)
    >>> g.x.shape, int(g.y.max()) + 1, bool((g.edge_index[0] != g.edge_index[1]).all())
    (torch.Size([200, 16]), 4, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MODELS = ("gcn", "sage", "gin")


@dataclass
class Graph:
    """Node features ``x`` (N, F), labels ``y`` (N,), ``edge_index`` (2, E), masks (N,) bool."""

    x: Any
    y: Any
    edge_index: Any
    train: Any
    val: Any
    test: Any

    @property
    def nodes(self) -> int:
        return int(self.x.shape[0])

    def adj_t(self) -> Any:
        return adjacency(self.edge_index, self.nodes)


def _undirected(src: Any, dst: Any, n: int) -> Any:
    """Both directions of every edge, duplicates and self-loops dropped, sorted by (src, dst)."""
    import torch

    keep = src != dst
    src, dst = src[keep], dst[keep]
    key = torch.cat([src * n + dst, dst * n + src]).unique()
    return torch.stack([key // n, key % n])


def sbm(nodes: int = 2000, classes: int = 7, features: int = 16, degree: float = 8.0,
        inside: float = 0.8, noise: float = 1.5, seed: int = 0) -> Graph:  # fmt: skip
    """A stochastic-block-model graph: ``classes`` equal communities, about ``degree`` edges
    per node of which a share ``inside`` stay within the community, features the community's
    one-hot code (repeated to ``features`` columns) plus N(0, ``noise``) noise; 20% of the nodes
    train, 20% validate, the rest test."""
    import torch

    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (nodes,), generator=g)
    half = int(nodes * degree / 2)  # undirected edges; both directions are stored
    src = torch.randint(0, nodes, (half,), generator=g)
    within = torch.rand(half, generator=g) < inside
    # an edge inside the community goes to a random member of the source's community
    members = torch.argsort(y, stable=True)
    starts = torch.searchsorted(y[members], torch.arange(classes))
    counts = torch.bincount(y, minlength=classes)
    c = y[src]
    pick = starts[c] + (torch.rand(half, generator=g) * counts[c]).long().clamp(max=counts[c] - 1)
    dst = torch.where(within, members[pick], torch.randint(0, nodes, (half,), generator=g))
    code = torch.nn.functional.one_hot(y, classes).float().repeat(1, -(-features // classes))
    x = code[:, :features] + noise * torch.randn(nodes, features, generator=g)
    order = torch.randperm(nodes, generator=g)
    cut1, cut2 = nodes // 5, 2 * nodes // 5
    masks = [torch.zeros(nodes, dtype=torch.bool) for _ in range(3)]
    masks[0][order[:cut1]], masks[1][order[cut1:cut2]], masks[2][order[cut2:]] = True, True, True
    return Graph(x, y, _undirected(src, dst, nodes), *masks)


#: R-MAT's quadrant probabilities a, b, c (d = 1 - a - b - c): Graph500's
RMAT = (0.57, 0.19, 0.19)


def power_law(nodes: int = 100_000, edges: int = 1_600_000, features: int = 64,
              seed: int = 0) -> Graph:  # fmt: skip
    """An R-MAT graph of about ``edges`` directed edges (both directions of ``edges / 2``
    draws; duplicates and self-loops dropped), N(0, 1) features, labels ``degree % 7`` (no task:
    for speed), every node in every mask."""
    import torch

    g = torch.Generator().manual_seed(seed)
    scale = max(1, (nodes - 1).bit_length())
    half = edges // 2
    src = torch.zeros(half, dtype=torch.long)
    dst = torch.zeros(half, dtype=torch.long)
    a, b, c = RMAT
    for _ in range(scale):  # one bit of each endpoint per level: pick a quadrant
        r = torch.rand(half, generator=g)
        down = r >= a + b  # quadrants c, d: the source's bit is 1
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b, d
        src = src * 2 + down.long()
        dst = dst * 2 + right.long()
    perm = torch.randperm(1 << scale, generator=g)  # scatter the hubs over the ids
    src, dst = perm[src] % nodes, perm[dst] % nodes
    ei = _undirected(src, dst, nodes)
    x = torch.randn(nodes, features, generator=g)
    y = torch.bincount(ei[1], minlength=nodes) % 7
    every = torch.ones(nodes, dtype=torch.bool)
    return Graph(x, y, ei, every, every, every)


def adjacency(edge_index: Any, nodes: int) -> Any:
    """PyG's ``adj_t`` as a ``torch.sparse_csr`` tensor: row i lists the sources of the edges
    into node i (``edge_index[1] == i``), values 1."""
    import torch
    from torch_geometric.utils import to_torch_csr_tensor

    return to_torch_csr_tensor(edge_index.flip(0), size=(nodes, nodes)).to(torch.float32)


def model(kind: str, features: int, classes: int, hidden: int = 128, seed: int = 0) -> Any:
    """A two-layer ``kind`` (gcn, sage, gin) of PyG layers: conv, relu, conv; called as
    ``m(x, edge_index)`` or ``m(x, adj_t)``."""
    import torch
    from torch_geometric import nn as gnn

    if kind not in MODELS:
        raise ValueError(f"gnn.model: kind expected one of {MODELS}, got {kind!r}")

    def layer(i: int, o: int) -> Any:
        if kind == "gcn":
            return gnn.GCNConv(i, o)
        if kind == "sage":
            return gnn.SAGEConv(i, o, aggr="mean")
        return gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(),
                                               torch.nn.Linear(o, o)))  # fmt: skip

    class TwoLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = layer(features, hidden), layer(hidden, classes)

        def forward(self, x: Any, adj: Any) -> Any:
            return self.conv2(self.conv1(x, adj).relu(), adj)

    torch.manual_seed(seed)
    m = TwoLayer()
    return m.eval()


def train(m: Any, graph: Graph, adj: Any, epochs: int = 60, lr: float = 0.01) -> float:
    """Full-graph training (cross-entropy on the train mask, Adam), then the test accuracy."""
    import torch

    opt = torch.optim.Adam(m.parameters(), lr=lr, weight_decay=5e-4)
    m.train()
    for _ in range(epochs):
        opt.zero_grad()
        out = m(graph.x, adj)
        torch.nn.functional.cross_entropy(out[graph.train], graph.y[graph.train]).backward()
        opt.step()
    m.eval()
    return accuracy(m(graph.x, adj), graph)


def accuracy(logits: Any, graph: Graph) -> float:
    return float((logits.argmax(1)[graph.test] == graph.y[graph.test]).float().mean())
