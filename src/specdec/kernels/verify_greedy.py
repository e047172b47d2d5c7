"""Greedy tree verification: Triton kernel, PyTorch reference, `specdec::verify_greedy`.

The rule, over the shared walk of `walk_common`: at node u let a = argmax of the target at u
(ties -> lowest index, as `torch.argmax`); accept the first child of u, in `next_token` /
`next_sibling` order, whose token is a, and continue from it; when no child matches, emit a
as the bonus token. So on duplicate sibling tokens the first sibling wins. NaN logits are
undefined input.

`target` is either logits [B, N, V] (any float dtype; the kernel reads only the rows on the
accepted path) or a precomputed argmax [B, N] int64.

Outputs (`specdec.types.Acceptance`): accept_length [B], accept_nodes [B, N] (path root
first, then -1), accept_tokens [B, N] (accepted draft tokens, bonus, then -1).
This file never builds trees or samples.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton
from .walk_common import TreeWalkRef, init_acceptance_row, walk_advance, walk_finish

__all__ = ["verify_greedy_ref", "verify_greedy_triton"]


def verify_greedy_ref(
    tokens: torch.Tensor,  # [B, N] int64
    next_token: torch.Tensor,  # [B, N] int64
    next_sibling: torch.Tensor,  # [B, N] int64
    target: torch.Tensor,  # [B, N, V] logits or [B, N] int64 argmax
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference: argmax everywhere, then the shared walk (`TreeWalkRef`): accept a child iff
    its token is the argmax at its parent."""
    pred = target if target.dim() == 2 else target.argmax(-1)  # [B, N] int64
    walk = TreeWalkRef(tokens, next_token, next_sibling)
    for live, c, x in walk.rounds():
        walk.advance(live, c, x, live & (x == pred[walk.rows, walk.cur]))
    return walk.finish(pred[walk.rows, walk.cur])


@triton.jit
def _row_argmax(row_ptr, V, BLOCK_V: tl.constexpr):
    """Index of the maximum of a row; ties -> lowest index.

    Each lane keeps its own running maximum (strict >, so its earliest index) while
    streaming; one reduction at the end picks the lowest index among the lanes holding the
    maximum. The streaming loop has no cross-thread reduction.
    """
    offs = tl.arange(0, BLOCK_V)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_idx = offs
    v0 = 0
    while v0 < V:
        idx = v0 + offs
        x = tl.load(row_ptr + idx, mask=idx < V, other=float("-inf")).to(tl.float32)
        take = x > best
        best_idx = tl.where(take, idx, best_idx)
        best = tl.where(take, x, best)
        v0 += BLOCK_V
    top = tl.max(best, axis=0)
    return tl.min(tl.where(best == top, best_idx, V), axis=0).to(tl.int64)


# The walk goes one depth per pass of the outer loop: the target's choice at the current node
# first, then that node's children in order. The row argmax sits at the top of the pass, never
# inside a branch of the child loop: that shape (a V-wide loop under `if taken:` in the walk)
# failed Triton 3.6's coalescing pass on sm_90 whenever N was the constant 1, which is how a
# one-node tree (target-only) reaches the compiler inside a torch.compile graph (Inductor makes
# every int argument equal to 1 a constant, whatever `do_not_specialize` says).
@triton.jit(do_not_specialize=["N"])
def _verify_greedy_kernel(
    tokens_ptr,
    next_tok_ptr,
    next_sib_ptr,
    target_ptr,
    len_ptr,
    nodes_ptr,
    out_tok_ptr,
    N,
    V,
    FROM_ARGMAX: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per request walks its accepted path (`walk_common`)."""
    b = tl.program_id(0).to(tl.int64)
    nodes_row = nodes_ptr + b * N
    out_row = out_tok_ptr + b * N
    init_acceptance_row(nodes_row, out_row, N)
    tok_row = tokens_ptr + b * N
    nt_row = next_tok_ptr + b * N
    ns_row = next_sib_ptr + b * N
    cur = tl.zeros([], tl.int64)
    n = tl.zeros([], tl.int64)
    cand = tl.load(nt_row)  # the next child to test
    steps = 0  # children tested, at most N (a malformed tree cannot loop)
    want = tl.zeros([], tl.int64)
    descend = True
    while descend:
        if FROM_ARGMAX:
            want = tl.load(target_ptr + b * N + cur)
        else:
            want = _row_argmax(target_ptr + (b * N + cur) * V, V, BLOCK_V)
        taken = cand != cand  # False
        while (cand >= 0) & (steps < N) & (taken == 0):
            x = tl.load(tok_row + cand)
            taken, cur, n, cand = walk_advance(x == want, cand, x, cur, n, nodes_row, out_row, nt_row, ns_row, N)
            steps += 1
        descend = taken
    walk_finish(out_row, len_ptr + b, n, want)


@triton_op("specdec::verify_greedy", mutates_args=())
def verify_greedy_triton(
    tokens: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel launcher, same signature as `verify_greedy_ref` (all tensors contiguous)."""
    B, N = tokens.shape
    V = 1 if target.dim() == 2 else target.shape[-1]
    accept_length = torch.empty(B, dtype=torch.int64, device=tokens.device)
    accept_nodes = torch.empty(B, N, dtype=torch.int64, device=tokens.device)
    accept_tokens = torch.empty(B, N, dtype=torch.int64, device=tokens.device)
    wrap_triton(_verify_greedy_kernel)[(B,)](
        tokens,
        next_token,
        next_sibling,
        target,
        accept_length,
        accept_nodes,
        accept_tokens,
        N,
        V,
        FROM_ARGMAX=target.dim() == 2,
        BLOCK_V=8192,
        num_warps=16,
    )
    return accept_length, accept_nodes, accept_tokens
