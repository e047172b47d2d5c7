"""Target-only tree rejection sampling: Triton kernel, PyTorch reference, `specdec::verify_target_only`.

The rule (SGLang / EAGLE "target-only", thresholds 1), over the shared walk of
`walk_common`: at node u with target p = p_u, keep a
residual r (p with the tokens of already rejected children of u removed) and its float64
mass R (R starts as the float64 sum of p_u). Test u's children in `next_token` /
`next_sibling` order; child c with token x and coin uniforms[b, c, 0]:

    accept  iff  coin * R < r(x)          (probability r(x) / R)
    reject  ->   r(x) = 0,  R = R - r(x)

A child whose token repeats an earlier (hence rejected) sibling's has r(x) = 0 and is never
accepted: duplicates are skipped. On acceptance the walk continues from c with a fresh
residual. When u's children are exhausted (or u is a leaf) the bonus / correction token is
drawn from r with uniforms[b, u, 1] and threshold draw * R (`sample_rule`).

Exactness: for distinct children fixed before the draws, the emitted token at u follows p_u
(inverse-CDF over the tried children, then the untried remainder), whatever q was.

This file never computes probabilities (`specdec.ops.sampling` does) and never builds trees.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton
from .sample_rule import row_sum_f64, sample_index_ref, sample_row
from .walk_common import TreeWalkRef, init_acceptance_row, walk_advance, walk_finish

__all__ = ["verify_target_only_ref", "verify_target_only_triton"]


def verify_target_only_ref(
    tokens: torch.Tensor,  # [B, N] int64
    next_token: torch.Tensor,  # [B, N] int64
    next_sibling: torch.Tensor,  # [B, N] int64
    target_probs: torch.Tensor,  # [B, N, V] float
    uniforms: torch.Tensor,  # [B, N, 2] float32/float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference: the rule above over the shared walk (`TreeWalkRef`), vectorized over the batch."""
    B, N, V = target_probs.shape
    dev = tokens.device
    u = uniforms.to(torch.float64)  # [B, N, 2]
    walk = TreeWalkRef(tokens, next_token, next_sibling)
    rows = walk.rows
    mass = target_probs[:, 0].to(torch.float64).sum(-1)  # [B] residual mass R
    rejected = torch.full((B, N), -1, dtype=torch.int64, device=dev)  # tokens rejected at cur
    num_rejected = torch.zeros(B, dtype=torch.int64, device=dev)
    for live, c, x in walk.rounds():
        dup = (rejected == x[:, None]).any(-1)
        px = torch.where(dup, 0.0, target_probs[rows, walk.cur, x].to(torch.float64))  # r(x)
        accept = live & (u[rows, c, 0] * mass < px)
        reject = live & ~accept
        rejected[rows, num_rejected] = torch.where(reject, x, rejected[rows, num_rejected])
        num_rejected = num_rejected + reject
        mass = torch.where(reject, mass - px, mass)
        walk.advance(live, c, x, accept)
        mass = torch.where(accept, target_probs[rows, walk.cur].to(torch.float64).sum(-1), mass)
        rejected = torch.where(accept[:, None], -1, rejected)
        num_rejected = torch.where(accept, 0, num_rejected)

    p_cur = target_probs[rows, walk.cur].to(torch.float64)  # [B, V]
    slot = torch.where(rejected >= 0, rejected, V)  # [B, N]; V = the spare column
    w = torch.cat([p_cur, p_cur.new_zeros(B, 1)], 1).scatter(1, slot, 0.0)[:, :V]  # children removed
    return walk.finish(sample_index_ref(w, u[rows, walk.cur, 1] * mass, base=p_cur))


@triton.jit(do_not_specialize=["N"])
def _verify_target_only_kernel(
    tokens_ptr,
    next_tok_ptr,
    next_sib_ptr,
    probs_ptr,
    u_ptr,
    len_ptr,
    nodes_ptr,
    out_tok_ptr,
    N,
    V,
    BLOCK_V: tl.constexpr,
):
    """One program per request (the shared walk of `walk_common`); reads full vocab rows only
    at the nodes of its path."""
    b = tl.program_id(0).to(tl.int64)
    nodes_row = nodes_ptr + b * N
    out_row = out_tok_ptr + b * N
    init_acceptance_row(nodes_row, out_row, N)
    tok_row = tokens_ptr + b * N
    nt_row = next_tok_ptr + b * N
    ns_row = next_sib_ptr + b * N
    u_row = u_ptr + b * N * 2
    p_base = probs_ptr + b * N * V

    cur = tl.zeros([], tl.int64)
    n = tl.zeros([], tl.int64)
    mass = tl.zeros([], tl.float64)
    cand = tl.load(nt_row)  # the next child to test
    steps = 0  # children tested, at most N (a malformed tree cannot loop)
    descend = True
    while descend:  # one depth per pass (see verify_greedy: no V-wide loop under `if taken:`)
        mass = row_sum_f64(p_base + cur * V, V, BLOCK_V)  # the residual mass R at the new node
        taken = cand != cand  # False
        while (cand >= 0) & (steps < N) & (taken == 0):
            x = tl.load(tok_row + cand)
            dup = 0  # does an earlier (rejected) sibling carry the same token?
            s = tl.load(nt_row + cur)
            k = 0
            while (s != cand) & (s >= 0) & (k < N):
                dup = tl.where(tl.load(tok_row + s) == x, 1, dup)
                s = tl.load(ns_row + s)
                k += 1
            px = tl.load(p_base + cur * V + x).to(tl.float64)
            px = tl.where(dup != 0, 0.0, px)
            coin = tl.load(u_row + cand * 2).to(tl.float64)
            taken, cur, n, cand = walk_advance(coin * mass < px, cand, x, cur, n, nodes_row, out_row, nt_row, ns_row, N)
            mass = tl.where(taken, mass, mass - px)
            steps += 1
        descend = taken

    thr = tl.load(u_row + cur * 2 + 1).to(tl.float64) * mass
    t = sample_row(p_base + cur * V, thr, V, tok_row, ns_row, tl.load(nt_row + cur), N, True, BLOCK_V)
    walk_finish(out_row, len_ptr + b, n, t)  # the bonus / correction token


@triton_op("specdec::verify_target_only", mutates_args=())
def verify_target_only_triton(
    tokens: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel launcher, same signature as `verify_target_only_ref` (all tensors contiguous)."""
    B, N, V = target_probs.shape
    accept_length = torch.empty(B, dtype=torch.int64, device=tokens.device)
    accept_nodes = torch.empty(B, N, dtype=torch.int64, device=tokens.device)
    accept_tokens = torch.empty(B, N, dtype=torch.int64, device=tokens.device)
    wrap_triton(_verify_target_only_kernel)[(B,)](
        tokens,
        next_token,
        next_sibling,
        target_probs,
        uniforms,
        accept_length,
        accept_nodes,
        accept_tokens,
        N,
        V,
        BLOCK_V=4096,
        num_warps=16,
    )
    return accept_length, accept_nodes, accept_tokens
