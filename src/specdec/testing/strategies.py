"""Hypothesis strategies for specdec's property suites: random forests (batches of draft
trees), logits, sampling parameters, tree-policy shapes and static "choices".

Hypothesis draws only shapes and seeds; tensors are then built from a seeded
`random.Random` / `torch.Generator`, so a failure replays from the printed seed. Tree shapes:
random, recent-parent (EAGLE-like), chain, star, deep-narrow, layered top-K, and rows of
mixed shapes; sizes are biased towards the 32-bit word boundaries of the packed mask.
Padding rows carry garbage parents (every consumer must ignore them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from ..types import SamplingTensors

__all__ = [
    "BOUNDARY_SIZES",
    "SHAPES",
    "Forest",
    "make_forest",
    "forests",
    "logits_for",
    "sampling_rows",
    "choices",
]

BOUNDARY_SIZES = (1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256)
SHAPES = ("random", "recent", "chain", "star", "deep_narrow", "layered", "mixed")


@dataclass
class Forest:
    """A batch of draft trees: parents [B, N] int64 (topological, root -1; rows past
    num_nodes[b] are garbage padding), num_nodes [B] int64, and how it was drawn."""

    parents: torch.Tensor  # [B, N] int64
    num_nodes: torch.Tensor  # [B] int64
    seed: int
    shape: str

    @property
    def batch(self) -> int:
        return self.parents.shape[0]

    @property
    def slots(self) -> int:
        return self.parents.shape[1]

    def to(self, device) -> "Forest":
        return Forest(self.parents.to(device), self.num_nodes.to(device), self.seed, self.shape)

    def __repr__(self) -> str:
        return f"Forest(seed={self.seed}, shape={self.shape!r}, B={self.batch}, N={self.slots}, num_nodes={self.num_nodes.tolist()})"


def _row_parents(rng: random.Random, n: int, shape: str) -> list[int]:
    par = [-1]
    if shape == "layered":
        k = rng.randint(1, 8)
        prev, layer = [0], []
        for i in range(1, n):
            layer.append(i)
            par.append(rng.choice(prev))
            if len(layer) == k:
                prev, layer = layer, []
        return par
    for i in range(1, n):
        if shape == "chain":
            par.append(i - 1)
        elif shape == "star":
            par.append(0)
        elif shape == "deep_narrow":
            par.append(max(0, i - rng.randint(1, 2)))
        elif shape == "recent":
            par.append(rng.randint(max(0, i - 4), i - 1))
        else:
            par.append(rng.randint(0, i - 1))
    return par


def make_forest(batch: int, slots: int, shape: str, seed: int, padded: bool = True) -> Forest:
    """`batch` trees of `slots` slots; with `padded`, rows get random num_nodes in [1, slots]."""
    rng = random.Random(seed)
    parents, num_nodes = [], []
    for _ in range(batch):
        n = rng.randint(1, slots) if padded and rng.random() < 0.6 else slots
        row_shape = rng.choice(SHAPES[:-1]) if shape == "mixed" else shape
        row = _row_parents(rng, n, row_shape)
        row += [rng.randint(-1, slots + 4) for _ in range(slots - n)]  # garbage padding parents
        parents.append(row)
        num_nodes.append(n)
    return Forest(torch.tensor(parents, dtype=torch.int64), torch.tensor(num_nodes, dtype=torch.int64), seed, shape)


@st.composite
def forests(draw, max_batch: int = 8, max_slots: int = 256) -> Forest:
    """A batch of random trees (shapes and seed drawn, tensors built)."""
    batch = draw(st.integers(1, max_batch))
    near = [n for n in BOUNDARY_SIZES if n <= max_slots]
    slots = draw(st.one_of(st.sampled_from(near), st.integers(1, max_slots)))
    shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**31 - 1))
    return make_forest(batch, slots, shape, seed, padded=draw(st.booleans()))


def logits_for(tokens: torch.Tensor, children: list[list[list[int]]], vocab: int, seed: int, *, hit: float = 0.85) -> torch.Tensor:
    """Logits [B, N, V] float32 for deep walks: at most nodes the argmax is one of the node's
    children's tokens (probability `hit`), small-integer logits elsewhere (ties).

    Args:
        tokens: [B, N] int64 node tokens.
        children: children[b][u] = the child nodes of node u in row b.
    """
    g = torch.Generator().manual_seed(seed)
    B, N = tokens.shape
    logits = torch.randint(-3, 3, (B, N, vocab), generator=g).float()
    pick = torch.rand(B, N, generator=g).tolist()
    for b in range(B):
        for u, kids in enumerate(children[b]):
            if kids and pick[b][u] < hit:
                logits[b, u, tokens[b, kids[int(pick[b][u] * 1000) % len(kids)]]] = 9.0
    return logits


@st.composite
def sampling_rows(draw, batch: int, greedy: bool | None = None) -> SamplingTensors:
    """Per-row sampling parameters: a mix of greedy rows and sampled rows with temperature,
    top-k, top-p and min-p (`greedy=True`: all greedy; False: none greedy)."""
    rows = []
    for _ in range(batch):
        is_greedy = draw(st.booleans()) if greedy is None else greedy
        if is_greedy:
            rows.append((0.0, 0, 1.0, 0.0))
        else:
            rows.append((
                draw(st.sampled_from([0.5, 1.0, 1.5])),
                draw(st.sampled_from([0, 0, 3])),
                draw(st.sampled_from([1.0, 1.0, 0.9])),
                draw(st.sampled_from([0.0, 0.0, 0.05])),
            ))
    t, k, p, m = zip(*rows)
    return SamplingTensors(
        temperature=torch.tensor(t, dtype=torch.float32),
        top_k=torch.tensor(k, dtype=torch.int64),
        top_p=torch.tensor(p, dtype=torch.float32),
        min_p=torch.tensor(m, dtype=torch.float32),
        seed=torch.zeros(batch, dtype=torch.int64),
    )


@st.composite
def choices(draw, max_nodes: int = 12, max_depth: int = 4, max_rank: int = 3) -> list[list[int]]:
    """A random prefix-closed static tree in the "choices" format (each node's children may
    skip ranks, e.g. [[0], [2]])."""
    paths: list[tuple[int, ...]] = []
    frontier = [()]
    target = draw(st.integers(1, max_nodes))
    while frontier and len(paths) < target:
        parent = frontier.pop(0)
        if len(parent) >= max_depth:
            continue
        ranks = draw(st.sets(st.integers(0, max_rank), min_size=1, max_size=max_rank + 1))
        for r in sorted(ranks):
            if len(paths) >= target:
                break
            node = parent + (r,)
            paths.append(node)
            frontier.append(node)
    return [list(p) for p in paths]


def random_distributions(g: torch.Generator, shape, sparsity: float) -> torch.Tensor:
    """float32 distributions over the last axis, some entries exactly 0 (the max kept)."""
    p = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.5).softmax(-1)
    keep = (torch.rand(shape, generator=g, dtype=torch.float64) >= sparsity) | (p == p.amax(-1, keepdim=True))
    p = p * keep
    return (p / p.sum(-1, keepdim=True)).float()


def random_tree_parents(rng: random.Random, n: int) -> list[int]:
    """Parents of one n-node tree of a random shape: random, star, chain or layered (layers of
    width k, each node under a random node of the layer above)."""
    shape = rng.choice(["random", "star", "chain", "layered"])
    if shape == "star":
        return [-1] + [0] * (n - 1)
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "layered":
        k = rng.randint(2, 4)
        return [-1] + [0 if i <= k else 1 + ((i - 1) // k - 1) * k + rng.randrange(k) for i in range(1, n)]
    return [-1] + [rng.randrange(i) for i in range(1, n)]
