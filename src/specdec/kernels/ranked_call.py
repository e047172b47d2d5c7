"""A ranked tree policy's call as one Triton kernel (`policies.shapes._ranked_call`).

At each draft depth but the last, an EAGLE-2 style policy scores the frontier's candidates
(path score + cleaned log-probability), keeps the `width` best as the next frontier and
records every candidate in its history. Compiled from PyTorch that is 3-4 GPU kernels and a
stable sort per call (`examples/count_launches.py --names tree-48`: the scores, the sort's
keys, the parents' copy, `aten.sort`, the gathers); here it is one program per batch row,
the row's F * K candidates in registers:

    scores        s = fr_score[row] + clean(logq), clean = NaN -> -inf, clamped at 0
    history       s, the tokens and each candidate's parent history index, [B, F * K]
    next frontier `width` rounds of max-and-take over s (NaN ranks as -inf; ties, -inf
                  ones included, to the lower index: a stable sort's order), then each
                  winner's token, score, history index (offset + index) and frontier row.

The reference is the PyTorch body of `_ranked_call` (same outputs, bit for bit). `width` is a
compile-time constant (the rounds unroll), at most MAX_WIDTH; a row holds at most MAX_ROW
candidates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton

__all__ = ["MAX_ROW", "MAX_WIDTH", "ranked_call_triton"]

MAX_WIDTH = 64  # frontier nodes a call keeps (the rounds unroll)
MAX_ROW = 4096  # candidates of a call per batch row (held in registers)


@triton.jit
def _ranked_call_kernel(
    fr_score_ptr, logq_ptr, tok_ptr, fr_hist_ptr,  # [B, F] f32, [B, F, K] float, [B, F, K] i64, [B, F] i64
    score_ptr, flat_tok_ptr, parent_ptr,  # history [B, M] f32 / i64 / i64, M = F * K
    nxt_tok_ptr, nxt_score_ptr, nxt_hist_ptr, nxt_row_ptr,  # next frontier [B, WIDTH] i64 / f32 / i64 / i64
    F, K, offset,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    M = F * K
    i = tl.arange(0, BLOCK)
    ok = i < M
    row = i // K  # [BLOCK] frontier row of each candidate
    lq = tl.load(logq_ptr + b * M + i, mask=ok, other=0.0).to(tl.float32)
    lq = tl.where(lq == lq, tl.minimum(lq, 0.0), float("-inf"))  # NaN -> -inf, +inf -> 0 (clean_logq)
    s = tl.load(fr_score_ptr + b * F + row, mask=ok, other=0.0) + lq  # [BLOCK] path scores
    tok = tl.load(tok_ptr + b * M + i, mask=ok, other=0)
    tl.store(score_ptr + b * M + i, s, mask=ok)
    tl.store(flat_tok_ptr + b * M + i, tok, mask=ok)
    tl.store(parent_ptr + b * M + i, tl.load(fr_hist_ptr + b * F + row, mask=ok, other=0), mask=ok)
    key = tl.where(s == s, s, float("-inf"))  # NaN ranks as -inf
    taken = i >= M  # padding is never picked
    for r in tl.static_range(WIDTH):
        best = tl.max(tl.where(taken, float("-inf"), key), axis=0)
        pos = tl.min(tl.where((~taken) & (key == best), i, BLOCK), axis=0)  # the lowest index of the best
        hit = i == pos
        taken = taken | hit
        tl.store(nxt_tok_ptr + b * WIDTH + r, tl.sum(tl.where(hit, tok, 0), axis=0))
        tl.store(nxt_score_ptr + b * WIDTH + r, tl.sum(tl.where(hit, s, 0.0), axis=0))
        tl.store(nxt_hist_ptr + b * WIDTH + r, (offset + pos).to(tl.int64))
        tl.store(nxt_row_ptr + b * WIDTH + r, (pos // K).to(tl.int64))


@triton_op("specdec::ranked_call", mutates_args={})  # a custom op: torch.compile calls it, not traces its launcher
def ranked_call_triton(
    fr_score: torch.Tensor, logq: torch.Tensor, tokens: torch.Tensor, fr_hist: torch.Tensor, width: int, offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """fr_score [B, F] float32, logq [B, F, K] float, tokens [B, F, K] int64, fr_hist [B, F] int64
    (all contiguous) -> (score, flat tokens, parents) [B, F * K] and the next frontier's (tokens,
    scores, history indices, rows) [B, width]; 1 <= width <= min(MAX_WIDTH, F * K), F * K <= MAX_ROW."""
    B, F, K = logq.shape
    M = F * K
    if not 1 <= width <= min(MAX_WIDTH, M) or M > MAX_ROW:
        raise ValueError(f"ranked_call_triton: width={width} must be in [1, {min(MAX_WIDTH, M)}] and F * K = {M} at "
                         f"most {MAX_ROW}")
    dev = logq.device
    score = torch.empty(B, M, device=dev, dtype=torch.float32)
    flat_tok = torch.empty(B, M, device=dev, dtype=torch.int64)
    parent = torch.empty(B, M, device=dev, dtype=torch.int64)
    nxt_tok = torch.empty(B, width, device=dev, dtype=torch.int64)
    nxt_score = torch.empty(B, width, device=dev, dtype=torch.float32)
    nxt_hist = torch.empty(B, width, device=dev, dtype=torch.int64)
    nxt_row = torch.empty(B, width, device=dev, dtype=torch.int64)
    block = max(16, triton.next_power_of_2(M))
    wrap_triton(_ranked_call_kernel)[(B,)](
        fr_score, logq, tokens, fr_hist, score, flat_tok, parent, nxt_tok, nxt_score, nxt_hist, nxt_row,
        F, K, offset, WIDTH=width, BLOCK=block, num_warps=4 if block <= 1024 else 8,
    )
    return score, flat_tok, parent, nxt_tok, nxt_score, nxt_hist, nxt_row
