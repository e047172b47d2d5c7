"""The k most likely tokens of each row and their log-probabilities, from raw logits.

A draft step needs, at every frontier node, the k best children and their log-probabilities
(tree scores add them up). `log_softmax` followed by `topk` over the whole draft vocabulary
runs on the GPU as one reduction program and one top-k block per row: with a 16k-32k-token
draft vocabulary and 1-10 rows that took 37-225 us per draft depth on the H200
(`notes/gpu/issue20/e2e_32cbac7.log`, `cycle_32cbac7.log`), more than the head's forward.
Here each row is cut into S chunks: a top-k and a sum of exponentials per chunk run on S times
as many blocks, and a second top-k over the S * k survivors picks the result; the
log-softmax itself is never written out. For k = 1 no top-k runs at all: each chunk's max,
argmax and sum of exponentials are one reduction, the row's a second (`_top1`).
On CUDA, 1 < k <= 16 runs as two Triton kernels (`kernels.top_logprobs`: each chunk's
sum and k best held in registers, then a merge per row), the PyTorch path as their reference.

Same tokens as `topk(log_softmax(x))` (ties may be ordered differently, as `torch.topk` may);
log-probabilities equal to `log_softmax` up to the rounding of the sum's order. NaN logits
rank as -inf, and log-probabilities are clamped at 0 (`clean_logq`, which the tree policies'
candidates use too). Fixed shapes, no host sync, compile-friendly.
"""

from __future__ import annotations

import torch

from ..kernels.top_logprobs import MAX_K, top_logprobs_triton
from .dispatch import use_triton

__all__ = ["chunk_count", "clean_logq", "nan_to_minus_inf", "top_logprobs", "top_logprobs_ref"]

MIN_CHUNK = 128  # a chunk shorter than this gains no parallelism worth a second top-k
CHUNK_COUNTS = (64, 32, 16, 8, 4, 2)
MAX_TRITON_CHUNK = 4096  # the chunk kernel holds a chunk in registers


def chunk_count(vocab: int, k: int) -> int:
    """How many equal chunks a row of `vocab` logits is cut into: the most in CHUNK_COUNTS that
    divide it into chunks of at least max(k, MIN_CHUNK); 1 when none does."""
    for s in CHUNK_COUNTS:
        if vocab % s == 0 and vocab // s >= max(k, MIN_CHUNK):
            return s
    return 1


def nan_to_minus_inf(x: torch.Tensor) -> torch.Tensor:
    """`x` with NaN -> -inf (-inf kept), so a NaN score ranks last."""
    return torch.nan_to_num(x, nan=float("-inf"), neginf=float("-inf"))


def clean_logq(logq: torch.Tensor) -> torch.Tensor:
    """Log-probabilities with NaN -> -inf and rounding above 0 clamped, so path scores never grow."""
    return nan_to_minus_inf(logq).clamp(max=0.0)


def top_logprobs(logits: torch.Tensor, k: int, *, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [..., k] int64, log-probabilities [..., k] float32) of the k largest
    log-softmax values of each row of `logits` [..., V] (k <= V), best first.

    impl: "auto" | "triton" | "ref" (`specdec.ops.dispatch`): for 1 < k <= `MAX_K` and chunks of
    at most MAX_TRITON_CHUNK logits, "auto" runs the two kernels of `kernels.top_logprobs` on CUDA
    (2 GPU kernels where the PyTorch path compiles to 7); otherwise, and for "ref", the PyTorch
    path below."""
    *lead, V = logits.shape
    if not 1 <= k <= V:
        raise ValueError(f"top_logprobs: k={k} must be in [1, {V}] (the row length)")
    S = chunk_count(V, k)
    C = V // S
    if k > 1 and _triton_fits(k, C, impl) and _runs_triton(impl, logits):
        tok, lp = top_logprobs_triton(logits.reshape(-1, V).contiguous(), k, S)
        return tok.reshape(*lead, k), lp.reshape(*lead, k)
    x = nan_to_minus_inf(logits.float()).reshape(-1, S, C)  # [R, S, C]
    if k == 1:
        tok, lp = _top1(x)
        return tok.reshape(*lead, 1), lp.reshape(*lead, 1)
    part_val, part_idx = x.topk(k, dim=-1)  # [R, S, k] each chunk's best
    offsets = torch.arange(S, device=x.device).mul_(C).view(1, S, 1)
    part_idx = (part_idx + offsets).reshape(-1, S * k)  # [R, S*k] token ids
    val, pick = part_val.reshape(-1, S * k).topk(k, dim=-1)  # [R, k]
    tok = part_idx.gather(1, pick)  # [R, k]
    top = val[:, :1]  # [R, 1] the row's max
    shift = _shift(top)
    total = (x - shift[:, :, None]).exp().sum(-1).sum(-1, keepdim=True)  # [R, 1] chunk sums, then rows
    lp = clean_logq((val - shift) - total.log())  # [R, k]
    return tok.reshape(*lead, k), lp.reshape(*lead, k)


def _runs_triton(impl: str, logits: torch.Tensor) -> bool:
    """Whether this device runs the kernels: CUDA, or Triton's interpreter outside torch.compile
    (a compiled CPU graph takes the PyTorch path)."""
    return use_triton(impl, logits) and (logits.is_cuda or not torch.compiler.is_compiling())


def _triton_fits(k: int, C: int, impl: str) -> bool:
    """Whether the Triton kernels take this call (`impl="triton"` outside their range is an error)."""
    fits = k <= MAX_K and C <= MAX_TRITON_CHUNK
    if impl == "triton" and not fits:
        raise ValueError(f"top_logprobs(impl='triton'): k={k} must be in [2, {MAX_K}] and a chunk ({C} logits) at "
                         f"most {MAX_TRITON_CHUNK}; use impl='auto' or 'ref'")
    return fits


def _shift(top: torch.Tensor) -> torch.Tensor:
    """What the exponentials are taken relative to: the max where it is finite, else 0 (a row
    or chunk of -inf sums to 0, one holding +inf to inf; both then give a log-probability of -inf)."""
    return torch.where(torch.isfinite(top), top, 0.0)


def _top1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k = 1 (a chain's draft step) by reductions alone: x [R, S, C] -> (token [R, 1], log-probability
    [R, 1]). Each chunk's max, argmax and sum of exponentials (shifted by its own max) in one
    pass, then the row's: 2 GPU kernels where the two top-k's path launches 6, and the logits
    are never written out. Same conventions as the top-k path: NaN ranks as -inf, a row without
    a finite max gives -inf."""
    C = x.shape[-1]
    part_max, part_arg = x.max(-1)  # [R, S]
    part_shift = _shift(part_max)
    part_sum = (x - part_shift[..., None]).exp().sum(-1)  # [R, S]
    top, chunk = part_max.max(-1, keepdim=True)  # [R, 1]
    shift = _shift(top)
    # an all -inf chunk adds nothing (its sum is 0; exp(0 - shift) alone may overflow)
    weighted = torch.where(part_max == float("-inf"), 0.0, part_sum * (part_shift - shift).exp())
    total = weighted.sum(-1, keepdim=True)  # [R, 1]
    tok = part_arg.gather(1, chunk) + chunk * C
    return tok, clean_logq((top - shift) - total.log())


def top_logprobs_ref(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: the whole log-softmax, cleaned, then one top-k (the former draft step)."""
    lq = clean_logq(torch.log_softmax(logits.float(), dim=-1))
    lp, tok = lq.topk(k, dim=-1)
    return tok, lp
