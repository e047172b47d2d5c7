"""Trees from a log-distribution callback: EAGLE-2 (`eagle2_tree`) and sampled whole groups
(`sampled_tree`), as thin adapters over the `dynamic` and `sampled` tree policies.

For callers that have a draft step ``step(tokens [B, F], parent_slot [B, F]) -> logq
[B, F, Vd]`` (the draft log-distribution at each of the F frontier nodes; ``parent_slot``
says which row of the previous call is each node's parent) and the root's log-distribution.
The policies themselves, which decide which nodes a tree keeps, live in `specdec.policies`;
this module only turns log-distributions into candidates (top-K, or i.i.d. draws).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.policies.candidates import clean_logq, stable_topk, top_candidates
from specdec.policies.shapes import DynamicPolicy, SampledPolicy, group_sizes, history_size
from specdec.types import Candidates, Frontier, GrownTree

__all__ = ["GrownTree", "eagle2_tree", "sampled_tree", "group_sizes", "stable_topk", "history_size", "logq_expander"]

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def logq_expander(root_logq: torch.Tensor, step: Step, candidates: Callable[[torch.Tensor, int], Candidates]):
    """`expand(Frontier) -> Candidates` from the root's log-distribution [B, Vd] and a `step`."""

    def expand(frontier: Frontier) -> Candidates:
        logq = root_logq[:, None] if frontier.depth == 0 else step(frontier.tokens, frontier.parent_slot)
        return candidates(logq, frontier.k)

    return expand


def eagle2_tree(root_logq: torch.Tensor, step: Step, *, topk: int, depth: int, budget: int) -> GrownTree:
    """EAGLE-2 dynamic tree (`specdec.policies.DynamicPolicy`): S = budget nodes.

    Args:
        root_logq: [B, Vd] draft log-distribution at the root.
        step: the draft forward; called depth - 1 times with F = topk.
        topk: K children per expanded node (<= Vd).
        depth: D layers of drafts.
        budget: draft nodes kept, in [1, K + K*K*(D-1)].
    """
    B, Vd = root_logq.shape
    if not 1 <= topk <= Vd:
        raise ValueError(f"topk={topk} is out of range; allowed: [1, draft vocab {Vd}]")
    policy = DynamicPolicy(topk, depth, budget)
    return policy.grow(logq_expander(root_logq, step, top_candidates), B, root_logq.device)


def sampled_tree(
    root_logq: torch.Tensor,
    step: Step,
    *,
    sizes: tuple[int, ...],
    sample: Callable[[torch.Tensor, int], torch.Tensor],
) -> GrownTree:
    """Sampled tree of whole i.i.d. groups (`specdec.policies.SampledPolicy`).

    Args:
        root_logq: [B, Vd] draft log-distribution at the root.
        step: the draft forward; called len(sizes) - 1 times with F = 1.
        sizes: draws per depth, e.g. `group_sizes(...)`.
        sample: ``(probs [B, Vd], c) -> [B, c]`` i.i.d. draws with replacement, e.g.
            ``lambda p, c: torch.multinomial(p, c, replacement=True, generator=g)``.
    Returns:
        GrownTree with S = sum(sizes) nodes, dist_index and dists [B, len(sizes), Vd].
    """

    def draws(logq: torch.Tensor, k: int) -> Candidates:
        lq = clean_logq(logq.float())[:, 0]  # [B, Vd] (F = 1)
        p = lq.exp()
        tok = sample(p, k)  # [B, k]
        return Candidates(tokens=tok[:, None], logq=torch.gather(lq, 1, tok)[:, None], probs=p[:, None])

    policy = SampledPolicy(tuple(sizes))
    return policy.grow(logq_expander(root_logq, step, draws), root_logq.shape[0], root_logq.device)
