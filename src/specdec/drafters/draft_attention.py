"""Attention for the draft head: a committed prefix from the paged draft cache plus draft nodes.

Why not `specdec.runtime.attention`: a draft tree is grown one depth per forward, and a node
at depth t must see its ancestors from the earlier depths' forwards, but not their siblings.
The runtime rule only knows "committed prefix + this forward's rows". So draft steps keep
the nodes' K/V out of the paged cache (a small per-propose tensor) and attend over two key
sets at once: the gathered prefix (visible below `committed_len`) and the node keys
(visible along the ancestor mask). One softmax spans both, so this is exact attention.

Everything here is a plain PyTorch reference in float32 or wider (fixed shapes, no host sync);
rows that see no key output 0. Owns no state. `causal_attend` is the plain causal rule over a
call's own rows (prompt ingest, training).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdec.runtime.kv_cache import PagedKVCache

__all__ = ["causal_attend", "gather_prefix", "masked_attention"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def causal_attend(scale: float) -> Attend:
    """Plain causal attention over the call's own rows ([B, T, H, hd] in and out), computed in
    float32 or wider."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2).to(dtype),
            k.transpose(1, 2).to(dtype),
            v.transpose(1, 2).to(dtype),
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(1, 2).to(q.dtype)

    return attend


def gather_prefix(cache: PagedKVCache, slots: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V of logical positions [0, length) of each row's slot (layer 0), in at least float32.

    Args:
        slots: [B] int64.
        length: static number of positions (<= cache.max_seq_len).
    Returns:
        k, v: [B, length, Hkv, hd] float32 (float64 for a float64 cache); unallocated
        positions read 0.
    """
    positions = torch.arange(length, device=slots.device)[None, :].expand(slots.shape[0], length)
    k, v = cache.gather(0, slots, positions)
    dtype = torch.promote_types(k.dtype, torch.float32)
    return k.to(dtype), v.to(dtype)


def masked_attention(
    q: torch.Tensor,
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of `q` over the union of several key sets, each with its own mask.

    Args:
        q: [B, T, H, hd] queries (RoPE applied).
        parts: list of (k [B, S_i, Hkv, hd], v [B, S_i, Hkv, hd], visible [B, T, S_i] bool).
        scale: softmax scale.
    Returns:
        [B, T, H, hd] in q's dtype; rows that see no key are 0.
    """
    B, T, H, hd = q.shape
    hkv = parts[0][0].shape[2]
    g = H // hkv
    dtype = torch.promote_types(q.dtype, torch.float32)  # float32 math (float64 stays float64)
    qg = q.to(dtype).view(B, T, hkv, g, hd)
    scores = []
    for k, _, visible in parts:
        s = torch.einsum("btkgd,bskd->bkgts", qg, k.to(dtype)) * scale  # [B, Hkv, G, T, S_i]
        scores.append(s.masked_fill(~visible[:, None, None], float("-inf")))
    probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).nan_to_num(0.0)  # [B, Hkv, G, T, sum S]
    out = torch.zeros(B, hkv, g, T, hd, device=q.device, dtype=dtype)
    start = 0
    for k, v, _ in parts:
        n = k.shape[1]
        out = out + torch.einsum("bkgts,bskd->bkgtd", probs[..., start : start + n], v.to(dtype))
        start += n
    return out.permute(0, 3, 1, 2, 4).reshape(B, T, H, hd).to(q.dtype)
