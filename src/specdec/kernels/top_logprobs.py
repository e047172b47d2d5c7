"""The k best children of each draft row in two Triton kernels (`ops.top_logprobs` for k > 1).

A tree drafter asks, at every frontier node and depth, for the k most likely tokens of a
16k-32k-token draft row and their log-probabilities. Compiled from PyTorch, the chunked
top-k of `ops.top_logprobs` runs as 7 GPU kernels per call (the cleaned logits written out
for `torch.topk`, two top-k's, the token offsets, the sum of exponentials and two epilogues;
`examples/count_launches.py --names tree-48`). Here:

    _chunk_top_kernel   grid (R, S): one chunk of C logits in registers: its max, its sum of
                        exponentials (relative to that max) and its k best (value, token) by
                        k rounds of max-and-take; nothing of the row is written back.
    _merge_top_kernel   grid (R,): the S * k survivors of a row: its k best by the same
                        rounds, the row's sum of exponentials from the chunks', and each
                        winner's log-probability.

The rules are the PyTorch path's (`ops.top_logprobs`): NaN ranks as -inf, +inf counts as the
largest float32 (`torch.nan_to_num`), a row of -inf gives -inf, log-probabilities are clamped at 0. Ties go to the
lower token id. k is a compile-time constant (the rounds unroll), at most MAX_K.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton

__all__ = ["MAX_K", "top_logprobs_triton"]

MAX_K = 16  # k rounds unroll; a larger k takes the PyTorch path


@triton.jit
def _shift_of(top):
    """The max where it is finite, else 0 (as `ops.top_logprobs._shift`)."""
    finite = (top == top) & (top != float("inf")) & (top != float("-inf"))
    return tl.where(finite, top, 0.0)


@triton.jit
def _chunk_top_kernel(
    x_ptr,  # [R, V] logits, any float dtype, rows `stride_x` apart
    val_ptr, tok_ptr,  # [R, S, K] float32 / int64: each chunk's best, best first
    max_ptr, sum_ptr,  # [R, S] float32: each chunk's max and sum of exp(x - shift(max))
    stride_x, C, S,
    K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = tl.arange(0, BLOCK_C)
    inside = offs < C
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + chunk * C + offs, mask=inside, other=float("-inf")).to(tl.float32)
    x = tl.where(x == x, x, float("-inf"))  # NaN -> -inf
    x = tl.where(x == float("inf"), 3.4028234663852886e38, x)  # +inf -> the largest float32, as nan_to_num
    top = tl.max(x, axis=0)
    shift = _shift_of(top)
    # an all -inf chunk sums to 0 (exp(-inf - 0)); one holding +inf sums to inf, as the reference
    total = tl.sum(tl.where(inside, tl.exp(x - shift), 0.0), axis=0)
    out = (row * S + chunk) * K
    tl.store(max_ptr + row * S + chunk, top)
    tl.store(sum_ptr + row * S + chunk, total)
    taken = offs >= C  # the block's padding is never picked
    for i in tl.static_range(K):
        best = tl.max(tl.where(taken, float("-inf"), x), axis=0)
        pos = tl.min(tl.where((~taken) & (x == best), offs, BLOCK_C), axis=0)
        taken = taken | (offs == pos)
        tl.store(val_ptr + out + i, best)
        tl.store(tok_ptr + out + i, (chunk * C + pos).to(tl.int64))


@triton.jit
def _merge_top_kernel(
    val_ptr, tok_ptr, max_ptr, sum_ptr,  # the chunk kernel's outputs
    out_tok_ptr, out_lp_ptr,  # [R, K] int64 / float32
    S,
    K: tl.constexpr, BLOCK_SK: tl.constexpr, BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)
    # the row's sum of exponentials relative to its max, from the chunks' sums
    s = tl.arange(0, BLOCK_S)
    part_max = tl.load(max_ptr + row * S + s, mask=s < S, other=float("-inf"))
    part_sum = tl.load(sum_ptr + row * S + s, mask=s < S, other=0.0)
    top = tl.max(part_max, axis=0)
    shift = _shift_of(top)
    scale = tl.exp(_shift_of(part_max) - shift)
    total = tl.sum(tl.where(part_max == float("-inf"), 0.0, part_sum * scale), axis=0)
    log_total = tl.log(total)
    # the k best of the S * k survivors; survivors are in (chunk, rank) order, so the lowest
    # position among equal values is the lowest token id
    j = tl.arange(0, BLOCK_SK)
    inside = j < S * K
    val = tl.load(val_ptr + row * S * K + j, mask=inside, other=float("-inf"))
    tok = tl.load(tok_ptr + row * S * K + j, mask=inside, other=0)
    taken = j >= S * K
    for i in tl.static_range(K):
        best = tl.max(tl.where(taken, float("-inf"), val), axis=0)
        pos = tl.min(tl.where((~taken) & (val == best), j, BLOCK_SK), axis=0)
        taken = taken | (j == pos)
        lp = (best - shift) - log_total
        lp = tl.where(lp == lp, tl.minimum(lp, 0.0), float("-inf"))  # NaN -> -inf, clamp at 0
        tl.store(out_tok_ptr + row * K + i, tl.sum(tl.where(j == pos, tok, 0), axis=0))
        tl.store(out_lp_ptr + row * K + i, lp)


@triton_op("specdec::top_logprobs", mutates_args={})  # a custom op: torch.compile calls it, not traces its launcher
def top_logprobs_triton(x: torch.Tensor, k: int, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, V] (last dim contiguous) -> (tokens [R, k] int64, log-probabilities [R, k] float32),
    the row cut into `chunks` equal chunks (`ops.top_logprobs.chunk_count`); 1 <= k <= MAX_K and
    k <= V // chunks."""
    R, V = x.shape
    S = chunks
    C = V // S
    if not 1 <= k <= min(MAX_K, C) or V % S != 0 or x.stride(-1) != 1:
        raise ValueError(f"top_logprobs_triton: k={k} must be in [1, {min(MAX_K, C)}] and {S} chunks must "
                         f"divide the row length {V} of a row-contiguous [R, V] tensor (strides {x.stride()})")
    dev = x.device
    part_val = torch.empty(R, S, k, device=dev, dtype=torch.float32)
    part_tok = torch.empty(R, S, k, device=dev, dtype=torch.int64)
    part_max = torch.empty(R, S, device=dev, dtype=torch.float32)
    part_sum = torch.empty(R, S, device=dev, dtype=torch.float32)
    tok = torch.empty(R, k, device=dev, dtype=torch.int64)
    lp = torch.empty(R, k, device=dev, dtype=torch.float32)
    block_c = triton.next_power_of_2(C)
    wrap_triton(_chunk_top_kernel)[(R, S)](
        x, part_val, part_tok, part_max, part_sum, x.stride(0), C, S, K=k, BLOCK_C=block_c,
        num_warps=4 if block_c <= 1024 else 8,
    )
    wrap_triton(_merge_top_kernel)[(R,)](
        part_val, part_tok, part_max, part_sum, tok, lp, S,
        K=k, BLOCK_SK=triton.next_power_of_2(S * k), BLOCK_S=triton.next_power_of_2(S), num_warps=4,
    )
    return tok, lp
