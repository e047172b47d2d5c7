"""Greedy tree verification: Triton kernel, PyTorch reference, `specdec::verify_greedy`.

Walk from the root; at node u let a = argmax of the target at u (ties -> lowest index, as
`torch.argmax`); accept the first child of u, in `next_token` / `next_sibling` order, whose
token is a, and continue from it; when no child matches, emit a as the bonus token. So on
duplicate sibling tokens the first sibling wins. NaN logits are undefined input.

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
from torch.library import triton_op, wrap_triton

from .walk_common import empty_acceptance, init_acceptance_row

__all__ = ["verify_greedy_torch", "verify_greedy_triton"]


def verify_greedy_torch(
    tokens: torch.Tensor,  # [B, N] int64
    next_token: torch.Tensor,  # [B, N] int64
    next_sibling: torch.Tensor,  # [B, N] int64
    target: torch.Tensor,  # [B, N, V] logits or [B, N] int64 argmax
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference: argmax everywhere, then one tested child per request per iteration.

    Loops at most N - 1 times; in eager mode it stops once every request is done (one host
    sync per iteration), under torch.compile it runs all N - 1 rounds (no sync, no graph
    break). The kernel has no sync either way.
    """
    pred = target if target.dim() == 2 else target.argmax(-1)  # [B, N] int64
    B, N = tokens.shape
    rows = torch.arange(B, device=tokens.device)
    accept_length, accept_nodes, accept_tokens = empty_acceptance(tokens)
    cur = torch.zeros(B, dtype=torch.int64, device=tokens.device)  # node whose children are tested
    cand = next_token[:, 0].clone()  # [B] child under test, -1 when exhausted
    for _ in range(N - 1):
        live = cand >= 0
        if not torch.compiler.is_compiling() and not bool(live.any()):
            break  # eager: stop when every request is done (compiled: a fixed N - 1 rounds)
        c = cand.clamp(min=0)
        want = pred[rows, cur]
        match = live & (tokens[rows, c] == want)
        n = accept_length + match  # [B]
        accept_nodes[rows, n] = torch.where(match, c, accept_nodes[rows, n])
        prev = (n - 1).clamp(min=0)
        accept_tokens[rows, prev] = torch.where(match, want, accept_tokens[rows, prev])
        accept_length = n
        cur = torch.where(match, c, cur)
        cand = torch.where(match, next_token[rows, c], torch.where(live, next_sibling[rows, c], cand))
    accept_tokens[rows, accept_length] = pred[rows, cur]
    return accept_length, accept_nodes, accept_tokens


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


@triton.jit
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
    """One program per request walks its accepted path."""
    b = tl.program_id(0).to(tl.int64)
    nodes_row = nodes_ptr + b * N
    out_row = out_tok_ptr + b * N
    init_acceptance_row(nodes_row, out_row, N)
    tok_row = tokens_ptr + b * N
    nt_row = next_tok_ptr + b * N
    ns_row = next_sib_ptr + b * N
    cur = tl.zeros([], tl.int64)
    n = tl.zeros([], tl.int64)
    done = 0
    while done == 0:
        if FROM_ARGMAX:
            want = tl.load(target_ptr + b * N + cur)
        else:
            want = _row_argmax(target_ptr + (b * N + cur) * V, V, BLOCK_V)
        c = tl.load(nt_row + cur)
        found = tl.full([], -1, tl.int64)
        k = 0
        while (c >= 0) & (found < 0) & (k < N):
            found = tl.where(tl.load(tok_row + c) == want, c, found)
            c = tl.load(ns_row + c)
            k += 1
        if (found >= 0) & (n < N - 1):
            n += 1
            tl.store(nodes_row + n, found)
            tl.store(out_row + n - 1, want)
            cur = found
        else:
            tl.store(out_row + n, want)  # the bonus token
            done = 1
    tl.store(len_ptr + b, n)


@triton_op("specdec::verify_greedy", mutates_args=())
def verify_greedy_triton(
    tokens: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel launcher, same signature as `verify_greedy_torch` (all tensors contiguous)."""
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
