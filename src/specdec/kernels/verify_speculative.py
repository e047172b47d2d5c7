"""Standard speculative sampling on trees: Triton kernel, PyTorch reference, `specdec::verify_speculative`.

The rule (Leviathan et al. for chains; SpecInfer's multi-draft recursive rejection for
siblings), over the shared walk of `walk_common`: node u's children were drawn i.i.d. from the draft q = draft_probs[b, u]
(duplicates allowed). Keep a residual w with float64 mass W (so r = w / W); w starts as the
target row p_u and W as its float64 sum. Test the children in `next_token` / `next_sibling`
order; child c with token x and coin uniforms[b, c, 0]:

    accept  iff  coin * q(x) * W < w(x)          (probability min(1, r(x) / q(x)))
    reject  ->   w' = float32(max(w / W - q, 0)),  W' = float64 sum of w'
                 (if W' == 0 -- only when r <= q everywhere, e.g. a child q could not draw --
                  the residual is left unchanged)

q(x) = 0 accepts exactly when r(x) > 0, with no division. On acceptance the walk continues
from c with w = p_c. When u's children are exhausted (or u is a leaf) the correction / bonus
token is drawn from w with uniforms[b, u, 1] and threshold draw * W (`sample_rule`).
Arithmetic is float64 with IEEE division (no fused multiply-add), the residual stored as
float32, so the kernel and the reference agree bit for bit on integer outputs.

Greedy rows (one-hot p) give the greedy walk: the argmax child is always accepted, any other
rejected, and the residual stays on the argmax.

The kernel keeps the residual in a launcher-allocated scratch [B, 2, V] float32 (ping-pong:
a rejection reads one slot and writes the other). This file never computes probabilities.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton
from .sample_rule import row_sum_f64, sample_index_ref, sample_row
from .walk_common import TreeWalkRef, init_acceptance_row, walk_advance, walk_finish

__all__ = ["verify_speculative_ref", "verify_speculative_triton"]


def verify_speculative_ref(
    tokens: torch.Tensor,  # [B, N] int64
    next_token: torch.Tensor,  # [B, N] int64
    next_sibling: torch.Tensor,  # [B, N] int64
    target_probs: torch.Tensor,  # [B, N, V] float
    draft_probs: torch.Tensor,  # [B, N, V] float, row u = distribution u's children were drawn from
    uniforms: torch.Tensor,  # [B, N, 2] float32/float64 in [0, 1)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference: the rule above over the shared walk (`TreeWalkRef`), vectorized over the batch."""
    u = uniforms.to(torch.float64)  # [B, N, 2]
    walk = TreeWalkRef(tokens, next_token, next_sibling)
    rows = walk.rows
    w = target_probs[:, 0].to(torch.float64)  # [B, V] residual (unnormalized)
    mass = w.sum(-1)  # [B] W
    for live, c, x in walk.rounds():
        q = draft_probs[rows, walk.cur].to(torch.float64)  # [B, V]
        accept = live & (u[rows, c, 0] * q[rows, x] * mass < w[rows, x])
        reject = live & ~accept
        w_new = (w / mass[:, None] - q).clamp_min(0.0).to(torch.float32).to(torch.float64)  # [B, V]
        mass_new = w_new.sum(-1)
        update = reject & (mass_new > 0)
        w = torch.where(update[:, None], w_new, w)
        mass = torch.where(update, mass_new, mass)
        walk.advance(live, c, x, accept)
        p_new = target_probs[rows, walk.cur].to(torch.float64)  # [B, V]
        w = torch.where(accept[:, None], p_new, w)
        mass = torch.where(accept, p_new.sum(-1), mass)
    return walk.finish(sample_index_ref(w, u[rows, walk.cur, 1] * mass))


@triton.jit
def _residual_update(src_ptr, q_ptr, dst_ptr, mass, V, BLOCK_V: tl.constexpr):
    """dst = float32(max(src / mass - q, 0)) over a row; returns the float64 sum of dst."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.zeros([BLOCK_V], tl.float64)
    v0 = 0
    while v0 < V:
        idx = v0 + offs
        in_row = idx < V
        w = tl.load(src_ptr + idx, mask=in_row, other=0.0).to(tl.float64)
        q = tl.load(q_ptr + idx, mask=in_row, other=0.0).to(tl.float64)
        r = tl.maximum(w / mass - q, 0.0).to(tl.float32)
        tl.store(dst_ptr + idx, r, mask=in_row)
        acc += tl.where(in_row, r.to(tl.float64), 0.0)
        v0 += BLOCK_V
    return tl.sum(acc, axis=0)


@triton.jit(do_not_specialize=["N"])
def _verify_speculative_kernel(
    tokens_ptr,
    next_tok_ptr,
    next_sib_ptr,
    probs_ptr,
    draft_ptr,
    u_ptr,
    scratch_ptr,
    len_ptr,
    nodes_ptr,
    out_tok_ptr,
    N,
    V,
    BLOCK_V: tl.constexpr,
):
    """One program per request (the shared walk of `walk_common`); the residual lives in p's
    row until the first rejection."""
    b = tl.program_id(0).to(tl.int64)
    nodes_row = nodes_ptr + b * N
    out_row = out_tok_ptr + b * N
    init_acceptance_row(nodes_row, out_row, N)
    tok_row = tokens_ptr + b * N
    nt_row = next_tok_ptr + b * N
    ns_row = next_sib_ptr + b * N
    u_row = u_ptr + b * N * 2
    p_base = probs_ptr + b * N * V
    q_base = draft_ptr + b * N * V
    scr = scratch_ptr + b * 2 * V  # two residual slots of V

    cur = tl.zeros([], tl.int64)
    n = tl.zeros([], tl.int64)
    mass = tl.zeros([], tl.float64)
    in_scratch = 0  # 0: the residual is p's row of cur; 1: scratch slot `slot`
    slot = 0
    cand = tl.load(nt_row)  # the next child to test
    steps = 0  # children tested, at most N (a malformed tree cannot loop)
    descend = True
    while descend:  # one depth per pass (see verify_greedy: no V-wide loop under `if taken:`)
        mass = row_sum_f64(p_base + cur * V, V, BLOCK_V)
        in_scratch = 0
        taken = cand != cand  # False
        while (cand >= 0) & (steps < N) & (taken == 0):
            x = tl.load(tok_row + cand)
            coin = tl.load(u_row + cand * 2).to(tl.float64)
            qx = tl.load(q_base + cur * V + x).to(tl.float64)
            if in_scratch != 0:
                wx = tl.load(scr + slot * V + x).to(tl.float64)
            else:
                wx = tl.load(p_base + cur * V + x).to(tl.float64)
            parent = cur
            taken, cur, n, cand = walk_advance(coin * qx * mass < wx, cand, x, cur, n, nodes_row, out_row, nt_row, ns_row, N)
            if taken == 0:  # rejected: the residual norm(max(0, w - q)) at the parent replaces w
                if in_scratch != 0:
                    new_mass = _residual_update(scr + slot * V, q_base + parent * V, scr + (1 - slot) * V, mass, V, BLOCK_V)
                else:
                    new_mass = _residual_update(p_base + parent * V, q_base + parent * V, scr + (1 - slot) * V, mass, V, BLOCK_V)
                tl.debug_barrier()  # the new slot is read by other threads below
                if new_mass > 0.0:
                    mass = new_mass
                    slot = 1 - slot
                    in_scratch = 1
            steps += 1
        descend = taken

    thr = tl.load(u_row + cur * 2 + 1).to(tl.float64) * mass
    if in_scratch != 0:
        t = sample_row(scr + slot * V, thr, V, tok_row, ns_row, cand, N, False, BLOCK_V)
    else:
        t = sample_row(p_base + cur * V, thr, V, tok_row, ns_row, cand, N, False, BLOCK_V)
    walk_finish(out_row, len_ptr + b, n, t)  # the bonus / correction token


@triton_op("specdec::verify_speculative", mutates_args=())
def verify_speculative_triton(
    tokens: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel launcher, same signature as `verify_speculative_ref` (all tensors contiguous)."""
    B, N, V = target_probs.shape
    dev = tokens.device
    accept_length = torch.empty(B, dtype=torch.int64, device=dev)
    accept_nodes = torch.empty(B, N, dtype=torch.int64, device=dev)
    accept_tokens = torch.empty(B, N, dtype=torch.int64, device=dev)
    scratch = torch.empty(B, 2, V, dtype=torch.float32, device=dev)  # residual ping-pong
    wrap_triton(_verify_speculative_kernel)[(B,)](
        tokens,
        next_token,
        next_sibling,
        target_probs,
        draft_probs,
        uniforms,
        scratch,
        accept_length,
        accept_nodes,
        accept_tokens,
        N,
        V,
        BLOCK_V=4096,
        num_warps=8,
    )
    return accept_length, accept_nodes, accept_tokens
