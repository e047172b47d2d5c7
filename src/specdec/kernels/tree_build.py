"""Tree metadata from parent pointers: Triton kernel, PyTorch reference, `specdec::build_tree`.

Owns parents -> (bit-packed ancestor-or-self mask, depth, first-child / next-sibling lists,
retrieve index), written into caller-provided buffers (`specdec.types.TreeMeta`). Both
implementations overwrite every word of every row, so a buffer that held a deeper tree keeps
no stale bit. Padding rows (i >= num_nodes[b]) get their self bit, position 0, links -1 and
retrieve index -1. Sibling order is ascending node index.

Bit packing: bit j % 32 of int32 word j // 32. Bit 31 makes a word negative; the reference
packs in int64 and wraps to two's complement explicitly, the kernel shifts an int32 1.

Input checks (topological parents, root -1) live in `specdec.ops.tree`; on malformed input
both implementations still terminate and write only their own rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton

__all__ = ["build_tree_ref", "build_tree_triton"]


def build_tree_ref(
    parents: torch.Tensor,  # [B, N] int64
    num_nodes: torch.Tensor,  # [B] int64
    packed_mask: torch.Tensor,  # [B, N, ceil(N/32)] int32, written
    positions: torch.Tensor,  # [B, N] int64, written
    next_token: torch.Tensor,  # [B, N] int64, written
    next_sibling: torch.Tensor,  # [B, N] int64, written
    retrieve_index: torch.Tensor,  # [B, N] int64, written
) -> None:
    """Reference: ancestor sets by pointer doubling on a [B, N, N] bool matrix."""
    B, N = parents.shape
    W = packed_mask.shape[-1]
    dev = parents.device
    idx = torch.arange(N, device=dev)  # [N]
    valid = idx[None, :] < num_nodes[:, None]  # [B, N]
    par = torch.where(valid & (idx[None, :] > 0), parents, -1)  # [B, N]

    # anc[b, i, j]: j is i or an ancestor of i at distance < 2^k; up = ancestor at distance 2^k.
    anc = torch.eye(N, dtype=torch.bool, device=dev).expand(B, N, N).clone()  # [B, N, N]
    up = par
    for _ in range((N - 1).bit_length()):
        has = up >= 0  # [B, N]
        src = up.clamp(min=0)
        anc |= anc.gather(1, src[:, :, None].expand(B, N, N)) & has[:, :, None]
        up = torch.where(has, up.gather(1, src), -1)

    bits = torch.zeros(B, N, W * 32, dtype=torch.int64, device=dev)  # [B, N, 32W]
    bits[:, :, :N] = anc.to(torch.int64)
    weights = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64, device=dev), torch.arange(32, device=dev))
    words = (bits.view(B, N, W, 32) * weights).sum(-1)  # [B, N, W] in [0, 2^32)
    packed_mask.copy_(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32))

    positions.copy_(anc.sum(-1) - 1)
    big = torch.full((), N, device=dev)
    is_child = par[:, None, :] == idx[None, :, None]  # [B, i, j]: parent[j] == i
    first = torch.where(is_child, idx, big).amin(-1)  # [B, N]
    next_token.copy_(torch.where(first < N, first, -1))
    is_sib = (par[:, None, :] == par[:, :, None]) & (par[:, :, None] >= 0) & (idx[None, None, :] > idx[None, :, None])
    first = torch.where(is_sib, idx, big).amin(-1)
    next_sibling.copy_(torch.where(first < N, first, -1))
    flat = torch.arange(B, device=dev)[:, None] * N + idx[None, :]  # [B, N]
    retrieve_index.copy_(torch.where(valid, flat, -1))


@triton.jit
def _build_tree_kernel(
    parents_ptr,
    num_nodes_ptr,
    mask_ptr,
    pos_ptr,
    next_tok_ptr,
    next_sib_ptr,
    ridx_ptr,
    N,
    W,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """One program per (request, block of BLOCK_R rows)."""
    b = tl.program_id(0).to(tl.int64)
    r0 = tl.program_id(1) * BLOCK_R
    rows = r0 + tl.arange(0, BLOCK_R).to(tl.int64)  # [R]
    in_range = rows < N
    nn = tl.load(num_nodes_ptr + b)
    valid = in_range & (rows < nn)
    par_base = parents_ptr + b * N
    own_par = tl.load(par_base + rows, mask=valid & (rows > 0), other=-1)  # [R]
    words = tl.arange(0, BLOCK_W)  # [W]

    # 1. Walk every row up to the root, setting one bit per step (self first).
    bits = tl.zeros([BLOCK_R, BLOCK_W], tl.int32)
    depth = tl.zeros([BLOCK_R], tl.int64)
    cur = tl.where(in_range, rows, -1)
    steps = 0
    while (tl.max(cur, axis=0) >= 0) & (steps <= N):
        live = cur >= 0
        safe = tl.where(live, cur, 0)
        bit = tl.full([BLOCK_R], 1, tl.int32) << (safe % 32).to(tl.int32)  # bit 31 -> negative word
        hit = live[:, None] & ((safe // 32)[:, None] == words[None, :])
        bits = bits | tl.where(hit, bit[:, None], 0)
        depth += live.to(tl.int64)
        up = tl.load(par_base + safe, mask=live & valid & (safe < N), other=-1)
        cur = tl.where(live & valid, up, -1)
        steps += 1

    # 2. First child and next sibling: the lowest later index with the matching parent.
    nt = tl.full([BLOCK_R], N, tl.int64)
    ns = tl.full([BLOCK_R], N, tl.int64)
    c0 = 0
    while c0 < N:  # (a `for` over a runtime range breaks the interpreter under numpy >= 2.4)
        cols = c0 + tl.arange(0, BLOCK_C).to(tl.int64)  # [C]
        cvalid = (cols < N) & (cols < nn) & (cols > 0)
        pc = tl.load(par_base + cols, mask=cvalid, other=-2)
        pc = tl.where(cvalid, pc, -2)  # -2 matches no row and no parent
        is_child = (pc[None, :] == rows[:, None]) & valid[:, None]
        nt = tl.minimum(nt, tl.min(tl.where(is_child, cols[None, :], N), axis=1))
        is_sib = (pc[None, :] == own_par[:, None]) & (own_par[:, None] >= 0) & (cols[None, :] > rows[:, None])
        ns = tl.minimum(ns, tl.min(tl.where(is_sib, cols[None, :], N), axis=1))
        c0 += BLOCK_C

    flat = b * N + rows  # [R]
    tl.store(pos_ptr + flat, depth - 1, mask=in_range)
    tl.store(next_tok_ptr + flat, tl.where(nt < N, nt, -1), mask=in_range)
    tl.store(next_sib_ptr + flat, tl.where(ns < N, ns, -1), mask=in_range)
    tl.store(ridx_ptr + flat, tl.where(valid, flat, -1), mask=in_range)
    tl.store(mask_ptr + flat[:, None] * W + words[None, :], bits, mask=in_range[:, None] & (words[None, :] < W))


BLOCK_R, BLOCK_C = 32, 64


@triton_op(
    "specdec::build_tree",
    mutates_args=("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index"),
)
def build_tree_triton(
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    packed_mask: torch.Tensor,
    positions: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    retrieve_index: torch.Tensor,
) -> None:
    """Kernel launcher, same signature as `build_tree_ref` (all tensors contiguous)."""
    B, N = parents.shape
    W = packed_mask.shape[-1]
    grid = (B, triton.cdiv(N, BLOCK_R))
    wrap_triton(_build_tree_kernel)[grid](
        parents,
        num_nodes,
        packed_mask,
        positions,
        next_token,
        next_sibling,
        retrieve_index,
        N,
        W,
        BLOCK_R=BLOCK_R,
        BLOCK_C=BLOCK_C,
        BLOCK_W=triton.next_power_of_2(W),
    )
