"""The one rule for drawing a token from unnormalized weights, in Triton and in PyTorch.

Every sampler in specdec (the bonus token, the residual after rejections, the first token
after prefill) draws token t from non-negative weights w [V] with a uniform u in [0, 1):

    t = the smallest index with cumsum(w)[t] > u * total  and  w[t] > 0

`total` is the caller's float64 mass of w. All sums are float64 (of float32 or float64
inputs), so the kernel and the reference agree unless two float64 partial sums straddle the
threshold by less than one rounding step (probability ~1e-13 per draw). When no index
qualifies (u * total rounded past the last partial sum), t is the last index with w > 0;
when w has no positive entry at all, t is the last index with base > 0 (`base` is the
unmasked row, target-only uses it), else 0. A zero-weight token is therefore never drawn
while any positive weight exists.

This module also holds the float64 row sum used for the masses. It never touches trees.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["sample_index_ref", "row_sum_f64", "sample_row"]


def sample_index_ref(w: torch.Tensor, thr: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """Index of the draw for each row (the rule in the module docstring).

    Args:
        w: [R, V] float64 >= 0, unnormalized weights.
        thr: [R] float64, u * total.
        base: [R, V] or None; its last positive index is the fallback when w has none.

    Returns:
        [R] int64 token ids in [0, V).
    """
    V = w.shape[-1]
    idx = torch.arange(V, device=w.device)  # [V]
    hit = (w.cumsum(-1) > thr[:, None]) & (w > 0)  # [R, V]
    first = torch.where(hit, idx, V).amin(-1)  # [R]
    last_w = torch.where(w > 0, idx, -1).amax(-1)  # [R]
    fallback = torch.where(base > 0, idx, -1).amax(-1).clamp(min=0) if base is not None else last_w.clamp(min=0)
    return torch.where(first < V, first, torch.where(last_w >= 0, last_w, fallback))


@triton.jit
def row_sum_f64(row_ptr, V, BLOCK_V: tl.constexpr):
    """float64 sum of a contiguous row of V values (any float dtype)."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.zeros([BLOCK_V], tl.float64)
    v0 = 0
    while v0 < V:  # (a `for` over a runtime range breaks the interpreter under numpy >= 2.4)
        idx = v0 + offs
        acc += tl.load(row_ptr + idx, mask=idx < V, other=0.0).to(tl.float64)
        v0 += BLOCK_V
    return tl.sum(acc, axis=0)


@triton.jit
def _masked_block(row_ptr, idx, V, tok_ptr, sib_ptr, first_child, N, MASK_CHILDREN: tl.constexpr):
    """(w, base): a block of the row in float64, w with the children's tokens zeroed."""
    base = tl.load(row_ptr + idx, mask=idx < V, other=0.0).to(tl.float64)
    w = base
    if MASK_CHILDREN:
        c = first_child
        k = 0
        while (c >= 0) & (k < N):
            w = tl.where(idx == tl.load(tok_ptr + c), 0.0, w)
            c = tl.load(sib_ptr + c)
            k += 1
    return w, base


@triton.jit
def sample_row(
    row_ptr,  # contiguous row of V weights
    thr,  # float64 scalar, u * total
    V,
    tok_ptr,  # [N] int64 node tokens of this request (MASK_CHILDREN only)
    sib_ptr,  # [N] int64 next_sibling of this request (MASK_CHILDREN only)
    first_child,  # int64 scalar, first child whose token is masked out (MASK_CHILDREN only)
    N,
    MASK_CHILDREN: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The rule of the module docstring over w = row (children's tokens zeroed if MASK_CHILDREN).

    Phase 1 streams block sums until the running float64 sum passes `thr` (one reduction per
    block, reading only up to the draw); phase 2 scans that one block. If the block's own
    cumsum never passes `thr` (a last-bit difference between the block sum and its cumsum),
    its last positive index is taken. The fallbacks of the rule cost one more pass and only
    run when no block passes `thr`.
    """
    offs = tl.arange(0, BLOCK_V)
    running = tl.zeros([], tl.float64)
    v0 = 0
    found = 0
    while (v0 < V) & (found == 0):
        w, base = _masked_block(row_ptr, v0 + offs, V, tok_ptr, sib_ptr, first_child, N, MASK_CHILDREN)
        block = tl.sum(w, axis=0)
        if running + block > thr:
            found = 1
        else:
            running += block
            v0 += BLOCK_V
    if found != 0:
        idx = v0 + offs
        w, base = _masked_block(row_ptr, idx, V, tok_ptr, sib_ptr, first_child, N, MASK_CHILDREN)
        cum = tl.cumsum(w, axis=0) + running
        first = tl.min(tl.where((cum > thr) & (w > 0.0), idx, V), axis=0)
        last = tl.max(tl.where(w > 0.0, idx, -1), axis=0)
        t = tl.where(first < V, first, last).to(tl.int64)
    else:  # u * total rounded past the last partial sum, or nothing positive: the fallbacks
        last_w = tl.full([], -1, tl.int64)
        last_base = tl.full([], -1, tl.int64)
        v0 = 0
        while v0 < V:
            idx = v0 + offs
            w, base = _masked_block(row_ptr, idx, V, tok_ptr, sib_ptr, first_child, N, MASK_CHILDREN)
            last_w = tl.maximum(last_w, tl.max(tl.where(w > 0.0, idx, -1), axis=0).to(tl.int64))
            last_base = tl.maximum(last_base, tl.max(tl.where(base > 0.0, idx, -1), axis=0).to(tl.int64))
            v0 += BLOCK_V
        t = tl.where(last_w >= 0, last_w, tl.maximum(last_base, 0))
    return t
