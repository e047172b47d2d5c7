"""Shared pieces of the tree-walk references: the acceptance buffers every verifier fills.

Owns only the output layout (`specdec.types.Acceptance`): accept_length [B] int64,
accept_nodes [B, N] int64 (root first, then -1), accept_tokens [B, N] int64 (-1 filled).
"""

from __future__ import annotations

import torch

__all__ = ["empty_acceptance"]


def empty_acceptance(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh outputs for a batch shaped like `tokens` [B, N]: length 0, path [0, -1, ...]."""
    B, N = tokens.shape
    accept_length = torch.zeros(B, dtype=torch.int64, device=tokens.device)  # [B]
    accept_nodes = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    accept_nodes[:, 0] = 0
    accept_tokens = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    return accept_length, accept_nodes, accept_tokens
