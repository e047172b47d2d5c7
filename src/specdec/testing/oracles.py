"""Naive oracles the property checks compare against: parent walks, the greedy walk, a
table "draft model" keyed by path, the EAGLE-2 brute force, and the distribution test.

Everything here is plain Python (or the simplest torch), written for obviousness, not speed.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..policies.candidates import stable_topk
from ..types import Candidates, Frontier

__all__ = [
    "children_lists",
    "ancestors_or_self",
    "depths",
    "naive_greedy_walk",
    "unpack_mask",
    "PathTable",
    "naive_dynamic",
    "tv_bound",
    "assert_follows",
    "DELTA",
]

DELTA = 1e-6  # chance that a correct sampler fails one distribution assertion
EPS_NUM = 1e-4  # slack for float32 probabilities


# ----------------------------------------------------------------------------- trees
def children_lists(parents: list[int], n: int) -> list[list[int]]:
    """children[u] = nodes whose parent is u, ascending (valid nodes 0..n-1 only)."""
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


def depths(parents: list[int], n: int) -> list[int]:
    """Depth of each valid node (root 0), for topological parents."""
    d = [0] * n
    for i in range(1, n):
        d[i] = d[parents[i]] + 1
    return d


def naive_greedy_walk(parents: list[int], n: int, tokens: list[int], argmax: list[int]) -> tuple[list[int], list[int]]:
    """(path root first, emitted tokens) of the greedy rule, from parent pointers alone: at
    each node take the first child (lowest index) whose token is the argmax there."""
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


# ----------------------------------------------------------------------------- draft oracle
class PathTable:
    """A "draft model" without a model: the log-distribution at a node is row
    ``hash(path) % rows`` of a fixed random table, so tensor code and plain Python see the same
    distributions. ``hash(root of request b) = root_hash[b]``, ``hash(child) = (31 h + tok + 1) % P``.

    Args:
        vocab: V. seed: of the table. scale: logit scale (larger = peakier).
        integer: round logits to small integers (many exact ties).
    """

    P = 1_000_003

    def __init__(self, vocab: int, seed: int, *, rows: int = 61, scale: float = 3.0, integer: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(rows, vocab, generator=g) * scale
        if integer:
            logits = logits.round().clamp(-2, 2)
        self.rows = rows
        self.table = torch.log_softmax(logits, -1).clamp(max=0.0)  # [rows, V] float32
        self._on = {self.table.device: self.table}

    def child(self, h, tok):
        return (h * 31 + tok + 1) % self.P

    def logq(self, h: torch.Tensor) -> torch.Tensor:
        """[..., V] log-distributions at the nodes of path hashes `h` (on h's device)."""
        if h.device not in self._on:
            self._on[h.device] = self.table.to(h.device)
        return self._on[h.device][h % self.rows]

    def row(self, h: int) -> np.ndarray:
        return self.table[h % self.rows].numpy()

    def expander(self, root_hash: torch.Tensor, *, sample: bool, generator: torch.Generator | None = None, probs: bool = True):
        """`expand(Frontier) -> Candidates` over the table for rows with `root_hash` [B]; top-K
        candidates (exact ties -> the lower token, so the brute force sees the same ones), or K i.i.d. draws (torch.multinomial with `generator`) when `sample`.

        The returned function records every call in `expand.calls`: dicts with depth, k, the
        frontier hashes [B, F] and the candidates.
        """
        state = {"h": root_hash.to(torch.int64)[:, None]}  # [B, F] path hash of the frontier rows
        calls: list[dict] = []

        def expand(frontier: Frontier) -> Candidates:
            if frontier.depth == 0:
                h = state["h"]
            else:
                h = self.child(torch.gather(state["h"], 1, frontier.parent_slot), frontier.tokens)
            state["h"] = h
            logq = self.logq(h)  # [B, F, V]
            if sample:
                B, F, V = logq.shape
                draws = torch.multinomial(logq.exp().reshape(B * F, V), frontier.k, replacement=True, generator=generator)
                tok = draws.reshape(B, F, frontier.k)
                cand = Candidates(tokens=tok, logq=torch.gather(logq, 2, tok), probs=logq.exp() if probs else None)
            else:
                tok = stable_topk(logq, frontier.k)  # [B, F, k]; ties -> lower token, as `naive_dynamic`
                cand = Candidates(tokens=tok, logq=torch.gather(logq, 2, tok), probs=logq.exp() if probs else None)
            calls.append(dict(depth=frontier.depth, k=frontier.k, hashes=h.clone(), cand=cand,
                              width=h.shape[1], tokens=None if frontier.tokens is None else frontier.tokens.clone()))
            return cand

        expand.calls = calls
        return expand


def naive_dynamic(table: PathTable, root: int, K: int, D: int, budget: int):
    """EAGLE-2 on Python lists for one request with root hash `root`.

    Returns (tokens, parents) of the kept nodes 1..budget (history order, parents as tree
    indices) and the frontier of every call (lists of path hashes, best first).
    """
    f32 = np.float32
    nodes = []  # dicts: tok, score, parent (history index or -1), h

    def top(lq):
        return sorted(range(len(lq)), key=lambda v: (-lq[v], v))[:K]

    lq = table.row(root)
    for tok in top(lq):
        nodes.append(dict(tok=tok, score=f32(lq[tok]), parent=-1, h=table.child(root, tok)))
    frontier = list(range(K))
    frontiers = [[root]]
    for _ in range(2, D + 1):
        frontiers.append([nodes[f]["h"] for f in frontier])
        start = len(nodes)
        for f in frontier:
            node = nodes[f]
            lq = table.row(node["h"])
            for tok in top(lq):
                nodes.append(dict(tok=tok, score=f32(node["score"] + f32(lq[tok])), parent=f, h=table.child(node["h"], tok)))
        cands = list(range(start, len(nodes)))
        frontier = sorted(cands, key=lambda i: (-nodes[i]["score"], i))[:K]
    keep = sorted(sorted(range(len(nodes)), key=lambda i: (-nodes[i]["score"], i))[:budget])
    tree_index = {h: i + 1 for i, h in enumerate(keep)}
    tokens = [nodes[h]["tok"] for h in keep]
    parents = [0 if nodes[h]["parent"] < 0 else tree_index[nodes[h]["parent"]] for h in keep]
    return tokens, parents, frontiers


# ----------------------------------------------------------------------------- distributions
def tv_bound(categories: int, samples: int, delta: float = DELTA) -> float:
    """Threshold on the total-variation distance between the empirical law of `samples`
    i.i.d. draws over `categories` outcomes and the true law:

        tau = 1/2 sqrt((K - 1) / n) + sqrt(ln(1 / delta) / (2 n)) + eps
              (bound on E[TV])        (McDiarmid: each draw moves TV by <= 1/n)

    so a correct sampler fails with probability <= delta."""
    return 0.5 * math.sqrt((categories - 1) / samples) + math.sqrt(math.log(1 / delta) / (2 * samples)) + EPS_NUM


def assert_follows(samples: torch.Tensor, law: torch.Tensor, what: str) -> float:
    """Assert TV(empirical law of `samples` [n] int64, `law` [K]) <= `tv_bound`; returns TV."""
    K, n = law.numel(), samples.numel()
    assert int(samples.min()) >= 0 and int(samples.max()) < K, f"{what}: category out of range"
    empirical = torch.bincount(samples.flatten().cpu(), minlength=K).double() / n
    tv = 0.5 * float((empirical - law.double().cpu()).abs().sum())
    tau = tv_bound(K, n)
    assert tv <= tau, f"{what}: TV={tv:.4f} > tau={tau:.4f} (K={K}, n={n}, delta={DELTA})"
    return tv
