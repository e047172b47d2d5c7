"""Random draft trees for the tree-op suites, plus naive Python oracles.

Hypothesis draws only shapes and seeds; trees are then built in plain Python from a seeded
`random.Random`, so failures replay from the printed seed. Shapes: random, recent-parent
(EAGLE-like), chain, star, deep-narrow, layered top-K, and rows of mixed shapes; sizes are
biased towards the 32-bit word boundaries. Padding rows carry garbage parents (they must be
ignored).

Sizes read the hypothesis profile: under `gpu` the Triton kernels see the full ranges
(bs 1..8, N 1..256); under `ci` (CPU, Triton interpreter) kernel cases stay small.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")  # (a module constant: hypothesis forbids function fixtures)
FULL = PROFILE == "gpu" or ON_GPU  # the interpreter is too slow for full-size kernel cases

BOUNDARY_SIZES = (1, 2, 3, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256)
SHAPES = ("random", "recent", "chain", "star", "deep_narrow", "layered", "mixed")


@dataclass
class Trees:
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

    def to(self, device) -> "Trees":
        return Trees(self.parents.to(device), self.num_nodes.to(device), self.seed, self.shape)


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


def make_trees(batch: int, slots: int, shape: str, seed: int, padded: bool = True) -> Trees:
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
    return Trees(torch.tensor(parents, dtype=torch.int64), torch.tensor(num_nodes, dtype=torch.int64), seed, shape)


@st.composite
def trees(draw, max_batch: int = 8, max_slots: int = 256) -> Trees:
    """Hypothesis strategy: a batch of random trees (shapes and seed drawn, tensors built)."""
    batch = draw(st.integers(1, max_batch))
    near = [n for n in BOUNDARY_SIZES if n <= max_slots]
    slots = draw(st.one_of(st.sampled_from(near), st.integers(1, max_slots)))
    shape = draw(st.sampled_from(SHAPES))
    seed = draw(st.integers(0, 2**31 - 1))
    return make_trees(batch, slots, shape, seed, padded=draw(st.booleans()))


def ci_examples(count: int, gpu: int | None = None) -> settings:
    """Settings for a test whose examples are slow: `count` examples on CPU (interpreted
    kernels); on a CUDA machine the profile's number, capped at `gpu`."""
    profile = settings.default.max_examples
    return settings(max_examples=min(profile, gpu or profile) if FULL else count)


def kernel_sizes(full: tuple[int, int], small: tuple[int, int]) -> tuple[int, int]:
    """(max_batch, max_slots) for cases that run a kernel: `full` on GPU, `small` interpreted."""
    return full if FULL else small


# ----------------------------------------------------------------------------- oracles
def children_lists(parents: list[int], n: int) -> list[list[int]]:
    """children[u] = nodes whose parent is u, ascending (valid nodes only)."""
    kids = [[] for _ in range(n)]
    for i in range(1, n):
        kids[parents[i]].append(i)
    return kids


def ancestors_or_self(parents: list[int], i: int) -> set[int]:
    out = set()
    while i >= 0:
        out.add(i)
        i = parents[i]
    return out


def naive_greedy_walk(parents: list[int], n: int, tokens: list[int], argmax: list[int]) -> tuple[list[int], list[int]]:
    """(path root first, emitted tokens) of the greedy rule, from parent pointers alone."""
    kids = children_lists(parents, n)
    path, emitted, u = [0], [], 0
    while True:
        want = argmax[u]
        match = [c for c in kids[u] if tokens[c] == want]
        emitted.append(want)
        if not match:
            return path, emitted
        u = match[0]
        path.append(u)


def unpack_mask(packed: torch.Tensor) -> torch.Tensor:
    """[B, N, W] int32 -> [B, N, 32 W] bool, bit j % 32 of word j // 32."""
    shifts = torch.arange(32, device=packed.device, dtype=torch.int32)
    bits = (packed[..., None] >> shifts) & 1  # arithmetic shift keeps bit 31 readable
    return bits.flatten(-2).bool()
