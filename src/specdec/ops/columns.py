"""`cat_columns`: `torch.cat(parts, dim=1)` written as one pointwise expression.

Why: inside a compiled piece, Inductor lowers a `torch.cat` whose inputs are the graph's own
inputs (a policy's per-call tokens, the root token) to one copy kernel per input, then the
consumers read the result: a chain of 5 drafts cost 5 kernels to concatenate 5 [B, 1]
columns. Written as selects over the output column (each part read through a clamped
gather), the concatenation is a pointwise expression that fuses with whatever reads it:
one kernel for the whole piece (`examples/count_launches.py --kernels` counts them). Same
values as `torch.cat`; meant for a handful of narrow parts, the glue of a draft step.
"""

from __future__ import annotations

import torch

__all__ = ["cat_columns"]


def cat_columns(parts: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """`torch.cat(parts, 1)` of 2-D parts [B_i, w_i] (w_i >= 1, B_i equal or 1: broadcast over
    the batch), one dtype; returns [B, sum w_i]."""
    if not parts:
        raise ValueError("cat_columns needs at least one part")
    if any(p.dim() != 2 or p.shape[1] < 1 for p in parts):
        raise ValueError(f"cat_columns takes 2-D parts of width >= 1, got shapes {[tuple(p.shape) for p in parts]}")
    B = max(p.shape[0] for p in parts)
    W = sum(p.shape[1] for p in parts)
    col = torch.arange(W, device=parts[0].device)[None, :]  # [1, W]
    out, start = None, 0
    for p in parts:
        w = p.shape[1]
        if w == 1:
            piece = p.expand(B, W)
        else:  # column c of the output reads column c - start of this part (clamped outside it)
            piece = torch.gather(p.expand(B, w), 1, (col - start).clamp(0, w - 1).expand(B, W))
        out = piece if out is None else torch.where(col >= start, piece, out)
        start += w
    return out
