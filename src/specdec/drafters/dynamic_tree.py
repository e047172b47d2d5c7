"""Growing a draft tree from draft distributions: EAGLE-2 top-K expansion, and sampled groups.

Owns *which* nodes a draft tree holds, as fixed-shape tensor functions that never look at
model weights: the neural part is a callback ``step(tokens [B, F], parent_slot [B, F]) ->
logq [B, F, Vd]`` that returns the draft log-distribution at each of the F frontier nodes
(F rows per request; ``parent_slot`` says which row of the previous call is each node's
parent, all 0 for the children of the root). Ids are draft-vocabulary ids throughout.

Two growers:

- `eagle2_tree` (greedy drafts): depth 1 = top-K children of the root; each later depth
  expands top-K children of each of the K frontier nodes (K*K candidates, score = sum of
  log-probabilities along the path), keeps the best K as the next frontier, and records
  each candidate's parent. After D depths a global rerank keeps the best `budget` nodes of
  the whole history. Ties anywhere are broken by the lower history index (children come
  after their parents in the history, and a child's score never exceeds its parent's, so
  the kept set is ancestor-closed). The children of a node are distinct tokens.
- `sampled_tree` (for verifiers that need the draft probabilities): each expanded node gets
  a *group* of c_t i.i.d. draws (with replacement) from its draft distribution, and every
  group is kept whole: no draw is ever kept or dropped by its own value, which is what
  makes multi-draft speculative sampling exact. At each depth one node is expanded: the
  best (by path log-probability) of the group just drawn. Group sizes come from
  `group_sizes(budget, depth, topk)` (static). With topk = 1 this is a sampled chain.

Both return a `GrownTree`: nodes in topological order (history order), parents as tree
indices (0 = root), and, for sampled trees, the distribution each node's children were
drawn from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["GrownTree", "eagle2_tree", "expand_frontier", "sampled_tree", "group_sizes", "stable_topk", "history_size"]

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class GrownTree:
    """Draft nodes 1..S of each request's tree (the root, node 0, is not included).

    tokens:     [B, S] int64 draft-vocabulary ids, topological order
    parents:    [B, S] int64 tree index of each node's parent (0 = root, i + 1 = tokens[:, i])
    dist_index: [B, S] int64 row of `dists` its children were drawn from, -1 = no children
                (sampled trees only; None for eagle2_tree)
    dists:      [B, E, Vd] float32 draft distributions of the expanded nodes, row 0 = the
                root's (sampled trees only)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    dist_index: torch.Tensor | None = None
    dists: torch.Tensor | None = None


def history_size(topk: int, depth: int) -> int:
    """Candidates an EAGLE-2 draft scores: K + K*K*(D-1)."""
    return topk + topk * topk * (depth - 1)


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values along the last dim; ties -> lower index; NaN ranks lowest.

    Args:
        scores: [..., M] float.
    Returns:
        [..., k] int64, best first.
    """
    clean = torch.nan_to_num(scores, nan=float("-inf"))
    return torch.sort(-clean, dim=-1, stable=True).indices[..., :k]


def _clean_logq(logq: torch.Tensor) -> torch.Tensor:
    # log-probabilities are <= 0; the clamp guards rounding so path scores never increase
    return torch.nan_to_num(logq, nan=float("-inf")).clamp(max=0.0)


def _assemble(sel: torch.Tensor, hist_tok: torch.Tensor, hist_parent: torch.Tensor):
    """Selected history indices (ascending) -> tokens [B, S] and tree-index parents [B, S]."""
    B, S = sel.shape
    tokens = torch.gather(hist_tok, 1, sel)
    inv = torch.full_like(hist_tok, -1)  # [B, M] history index -> tree index
    inv.scatter_(1, sel, torch.arange(1, S + 1, device=sel.device).expand(B, S))
    ph = torch.gather(hist_parent, 1, sel)  # [B, S], -1 = child of the root
    parents = torch.where(ph < 0, 0, torch.gather(inv, 1, ph.clamp(min=0)))
    return tokens, parents


def expand_frontier(logq: torch.Tensor, fr_score: torch.Tensor, k: int):
    """One EAGLE-2 depth: the top-K children of each of the K frontier nodes, and the best K
    of those K*K candidates as the next frontier.

    Args:
        logq: [B, K, Vd] draft log-distributions at the frontier nodes.
        fr_score: [B, K] the frontier nodes' path scores.
    Returns:
        cand_tok, cand_score: [B, K*K] the candidates (frontier-major order);
        pick: [B, K] the next frontier's candidate indices, best first.
    """
    B = logq.shape[0]
    child_lp, child_tok = _clean_logq(logq).topk(k, dim=-1)  # [B, K, K]
    cand_score = (fr_score[:, :, None] + child_lp).reshape(B, k * k)
    return child_tok.reshape(B, k * k), cand_score, stable_topk(cand_score, k)


def eagle2_tree(root_logq: torch.Tensor, step: Step, *, topk: int, depth: int, budget: int, expand=None) -> GrownTree:
    """EAGLE-2 dynamic tree (greedy: top-K children, best K frontier, global rerank).

    Args:
        root_logq: [B, Vd] draft log-distribution at the root.
        step: the draft forward (see module docstring); called depth - 1 times with F = topk.
        topk: K children per expanded node (<= Vd).
        depth: D layers of drafts.
        budget: draft nodes kept, in [1, K + K*K*(D-1)].
        expand: `expand_frontier` or a compiled copy of it (None = `expand_frontier`).
    Returns:
        GrownTree with S = budget nodes.
    """
    expand = expand or expand_frontier
    B, Vd = root_logq.shape
    K = topk
    if not 1 <= K <= Vd:
        raise ValueError(f"topk={K} is out of range; allowed: [1, draft vocab {Vd}]")
    M = history_size(K, depth)
    if not 1 <= budget <= M:
        raise ValueError(f"budget={budget} is out of range; allowed: [1, {M}] for topk={K}, depth={depth}")
    device = root_logq.device
    score, tok = _clean_logq(root_logq).topk(K, dim=-1)  # [B, K] best first
    hist_tok, hist_score = [tok], [score]
    hist_parent = [torch.full((B, K), -1, dtype=torch.int64, device=device)]
    fr_hist = torch.arange(K, device=device).expand(B, K)  # [B, K] history index of frontier nodes
    fr_tok, fr_score = tok, score
    parent_slot = torch.zeros(B, K, dtype=torch.int64, device=device)
    offset = K
    for t in range(2, depth + 1):
        cand_tok, cand_score, idx = expand(step(fr_tok, parent_slot), fr_score, K)  # [B, K*K] x2, [B, K]
        hist_tok.append(cand_tok)
        hist_score.append(cand_score)
        hist_parent.append(fr_hist[:, :, None].expand(B, K, K).reshape(B, K * K))
        if t < depth:
            fr_hist = offset + idx
            fr_tok = torch.gather(cand_tok, 1, idx)
            fr_score = torch.gather(cand_score, 1, idx)
            parent_slot = idx // K
        offset += K * K
    scores = torch.cat(hist_score, dim=1)  # [B, M]
    sel = stable_topk(scores, budget).sort(dim=-1).values  # [B, S] ascending = topological
    tokens, parents = _assemble(sel, torch.cat(hist_tok, 1), torch.cat(hist_parent, 1))
    return GrownTree(tokens=tokens, parents=parents)


def group_sizes(budget: int, depth: int, topk: int) -> tuple[int, ...]:
    """Children drawn at each depth of a sampled tree: `budget` split over `depth` groups of
    1..topk draws, as evenly as possible, larger groups first."""
    if not depth <= budget <= depth * topk:
        raise ValueError(f"budget={budget} is out of range; allowed: [{depth}, {depth * topk}] (depth x topk)")
    base, extra = divmod(budget, depth)
    return tuple(base + (1 if t < extra else 0) for t in range(depth))


def sampled_tree(
    root_logq: torch.Tensor,
    step: Step,
    *,
    sizes: tuple[int, ...],
    sample: Callable[[torch.Tensor, int], torch.Tensor],
) -> GrownTree:
    """Sampled tree of whole i.i.d. groups (see module docstring).

    Args:
        root_logq: [B, Vd] draft log-distribution at the root.
        step: the draft forward; called len(sizes) - 1 times with F = 1.
        sizes: draws per depth, e.g. `group_sizes(...)`.
        sample: ``(probs [B, Vd], c) -> [B, c]`` i.i.d. draws with replacement, e.g.
            ``lambda p, c: torch.multinomial(p, c, replacement=True, generator=g)``.
    Returns:
        GrownTree with S = sum(sizes) nodes, dist_index and dists [B, len(sizes), Vd].
    """
    B, Vd = root_logq.shape
    device = root_logq.device
    logq = _clean_logq(root_logq)
    dists = [logq.exp()]  # [B, Vd] each
    tok = sample(dists[0], sizes[0])  # [B, c1]
    score = torch.gather(logq, 1, tok)
    toks, parents = [tok], [torch.zeros_like(tok)]
    dist_index = [torch.full_like(tok, -1)]
    first = 1  # tree index of the current group's first node
    for t in range(1, len(sizes)):
        best = stable_topk(score, 1)  # [B, 1] draw index of the node to expand
        dist_index[-1] = dist_index[-1].scatter(1, best, t)
        logq = _clean_logq(step(torch.gather(tok, 1, best), torch.zeros(B, 1, dtype=torch.int64, device=device)))[:, 0]
        dists.append(logq.exp())
        tok = sample(dists[-1], sizes[t])  # [B, c]
        score = torch.gather(score, 1, best) + torch.gather(logq, 1, tok)
        toks.append(tok)
        parents.append((first + best).expand(B, sizes[t]))
        dist_index.append(torch.full_like(tok, -1))
        first += sizes[t - 1]
    return GrownTree(
        tokens=torch.cat(toks, 1),
        parents=torch.cat(parents, 1),
        dist_index=torch.cat(dist_index, 1),
        dists=torch.stack(dists, 1),
    )
