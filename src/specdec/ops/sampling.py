"""Per-request sampling distributions and the token draw rule.

`sampling_probs` turns logits into the distribution each request samples from; every
verifier and the first token after prefill use it, so acceptance, residual and bonus all
see the same filtered p. `sample_from_probs` draws with the rule of
`specdec.kernels.sample_rule` (inverse CDF in float64, never a zero-probability token).

Filter order, each a renormalized filter on the previous result:
    temperature -> top-k -> top-p -> min-p
- temperature 0: the row is exactly one-hot at argmax (ties -> lowest index, as
  `torch.argmax`); the other filters do nothing.
- top-k (0 or >= V = off): keep the tokens whose probability is >= the k-th largest, so
  tokens tied with the k-th are all kept.
- top-p (1 = off): on the top-k-renormalized distribution, keep the smallest prefix of the
  descending order whose mass reaches top_p (a token is kept iff the mass strictly before
  it is < top_p), plus every token tied with the last kept one.
- min-p (0 = off): keep tokens with p >= min_p * max(p).
All filters are thresholds on the values of one sort, so the result does not depend on how
the sort orders ties. Fixed shapes, no host sync; the sort makes it O(V log V) per row.
"""

from __future__ import annotations

import torch

from ..kernels.sample_rule import sample_index_ref

__all__ = ["sampling_probs", "sample_from_probs", "probs_for"]


def sampling_probs(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
) -> torch.Tensor:
    """Filtered, renormalized probabilities, one set of parameters per request.

    Args:
        logits: [B, N, V] or [B, V], any float dtype (-inf allowed where at least one
            entry per row is finite).
        temperature: [B] float, >= 0 (0 = greedy, one-hot).
        top_k: [B] int64, >= 0 (0 = off).
        top_p: [B] float in (0, 1] (1 = off).
        min_p: [B] float in [0, 1] (0 = off).

    Returns:
        float32 probabilities shaped like `logits`, each row summing to 1.
    """
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must be [B, N, V] or [B, V], got {tuple(logits.shape)}")
    B, V = logits.shape[0], logits.shape[-1]
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):
        if tuple(t.shape) != (B,):
            raise ValueError(f"{name} must be [{B}] (one per request), got {tuple(t.shape)}")
    x = logits.float()
    x = x[:, None] if logits.dim() == 2 else x  # [B, N, V]
    N = x.shape[1]

    def per_row(t: torch.Tensor) -> torch.Tensor:  # [B] -> [B, 1, 1]
        return t[:, None, None]

    temp = per_row(temperature.float())
    greedy = temp == 0  # [B, 1, 1]
    probs = torch.softmax(x / torch.where(greedy, 1.0, temp), dim=-1)  # [B, N, V]
    sorted_p = probs.sort(dim=-1, descending=True).values  # [B, N, V]

    k = per_row(top_k)
    k_on = (k > 0) & (k < V)
    kth = sorted_p.gather(-1, (k.clamp(1, V) - 1).expand(B, N, 1))  # [B, N, 1]
    thr_k = torch.where(k_on, kth, 0.0)
    topk_sorted = sorted_p * (sorted_p >= thr_k)  # [B, N, V], the top-k prefix
    z = topk_sorted.sum(-1, keepdim=True)
    mass_before = (topk_sorted.cumsum(-1) - topk_sorted) / z  # exclusive, renormalized
    p_on = per_row(top_p.float()) < 1
    kept = ((mass_before < per_row(top_p.float())) & (topk_sorted > 0)).sum(-1, keepdim=True)  # [B, N, 1]
    thr_p = torch.where(p_on, sorted_p.gather(-1, (kept - 1).clamp(min=0)), 0.0)
    thr_m = per_row(min_p.float()) * sorted_p[..., :1]

    keep = probs >= torch.maximum(torch.maximum(thr_k, thr_p), thr_m)
    filtered = probs * keep
    filtered = filtered / filtered.sum(-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
    out = torch.where(greedy, one_hot, filtered)
    return out[:, 0] if logits.dim() == 2 else out


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per row: the smallest t with cumsum(p)[t] > u * sum(p) (float64).

    Args:
        probs: [..., V] non-negative weights (need not be normalized).
        uniforms: [...] draws in [0, 1), float32 or float64.

    Returns:
        [...] int64 token ids; a zero-weight token is never drawn while any weight is positive.
    """
    if tuple(uniforms.shape) != tuple(probs.shape[:-1]):
        raise ValueError(f"uniforms must be {tuple(probs.shape[:-1])}, got {tuple(uniforms.shape)}")
    w = probs.reshape(-1, probs.shape[-1]).to(torch.float64)  # [R, V]
    thr = uniforms.reshape(-1).to(torch.float64) * w.sum(-1)
    return sample_index_ref(w, thr).reshape(uniforms.shape)


def probs_for(logits: torch.Tensor, sampling) -> torch.Tensor:
    """`sampling_probs` with the rows of a `SamplingTensors`; `sampling=None` = every row greedy.

    Args:
        logits: [B, N, V] or [B, V].
        sampling: `specdec.types.SamplingTensors` with [B] fields, or None.
    """
    if sampling is None:
        B, dev = logits.shape[0], logits.device
        zeros = torch.zeros(B, device=dev)
        return sampling_probs(logits, zeros, zeros.long(), torch.ones(B, device=dev), zeros)
    return sampling_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p)
