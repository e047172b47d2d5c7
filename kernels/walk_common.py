"""Shared pieces of the tree walks: the acceptance buffers every verifier fills.

Owns only the output layout (`specdec.types.Acceptance`): accept_length [B] int64,
accept_nodes [B, N] int64 (root first, then -1), accept_tokens [B, N] int64 (-1 filled),
for the references (`empty_acceptance`) and the kernels (`init_acceptance_row`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["empty_acceptance", "init_acceptance_row"]


def empty_acceptance(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh outputs for a batch shaped like `tokens` [B, N]: length 0, path [0, -1, ...]."""
    B, N = tokens.shape
    accept_length = torch.zeros(B, dtype=torch.int64, device=tokens.device)  # [B]
    accept_nodes = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    accept_nodes[:, 0] = 0
    accept_tokens = torch.full((B, N), -1, dtype=torch.int64, device=tokens.device)  # [B, N]
    return accept_length, accept_nodes, accept_tokens


@triton.jit
def init_acceptance_row(nodes_row, tokens_row, N, CHUNK: tl.constexpr = 64):
    """Write one request's "nothing accepted yet" rows: nodes [0, -1, ...], tokens all -1.

    Ends with a barrier, so the walk's later single-value stores to the same rows land last.
    """
    offs = tl.arange(0, CHUNK)
    k0 = 0
    while k0 < N:
        idx = k0 + offs
        tl.store(nodes_row + idx, tl.where(idx == 0, 0, -1).to(tl.int64), mask=idx < N)
        tl.store(tokens_row + idx, tl.full([CHUNK], -1, tl.int64), mask=idx < N)
        k0 += CHUNK
    tl.debug_barrier()
