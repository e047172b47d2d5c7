"""Candidate children from a draft log-distribution: top-K (greedy policies) or K i.i.d.
draws (sampling policies), the one piece of a draft step that a drafter shares with every
tree policy.

A model drafter computes the draft log-distribution at each frontier node and hands it to
`top_candidates` or `sampled_candidates`; the result is the `Candidates` record a
`TreePolicy` consumes. Fixed shapes, no host sync, compile-friendly. Never looks at a model.
"""

from __future__ import annotations

import torch

from ..ops.sampling import sample_from_probs
from ..ops.top_logprobs import clean_logq, nan_to_minus_inf
from ..types import Candidates

__all__ = ["clean_logq", "stable_topk", "top_candidates", "sampled_candidates"]


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values along the last dim; ties -> lower index; NaN ranks lowest.

    Args:
        scores: [..., M] float.
    Returns:
        [..., k] int64, best first.
    """
    return torch.sort(-nan_to_minus_inf(scores), dim=-1, stable=True).indices[..., :k]


def top_candidates(logq: torch.Tensor, k: int, *, probs: bool = False) -> Candidates:
    """The k most likely children of each node (distinct tokens; ties as `torch.topk`).

    Args:
        logq: [B, F, Vd] draft log-distributions at the frontier nodes.
        k: candidates per node (<= Vd).
        probs: also return the distributions (`Candidates.probs`).
    """
    lq = clean_logq(logq.float())
    lp, tok = lq.topk(k, dim=-1)  # [B, F, k]
    return Candidates(tokens=tok, logq=lp, probs=lq.exp() if probs else None)


def sampled_candidates(logq: torch.Tensor, k: int, uniforms: torch.Tensor, *, probs: bool = False) -> Candidates:
    """k i.i.d. draws with replacement from each node's draft distribution.

    Args:
        logq: [B, F, Vd] draft log-distributions (tempered as the drafter wants).
        k: draws per node.
        uniforms: [B, F, k] draws in [0, 1) (counter-based: `specdec.ops.random`).
        probs: also return the distributions (`Candidates.probs`), for `draft_probs`.
    """
    B, F, V = logq.shape
    lq = clean_logq(logq.float())
    p = lq.exp()  # [B, F, Vd]
    tok = sample_from_probs(p[:, :, None, :].expand(B, F, k, V), uniforms)  # [B, F, k]
    return Candidates(tokens=tok, logq=torch.gather(lq, 2, tok), probs=p if probs else None)
