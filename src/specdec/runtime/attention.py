"""Attention over the paged KV cache, for prefill, decode and tree verification.

Owns `AttentionBatch` (the per-forward metadata every layer shares), the visibility rule,
its dense reference (`impl="ref"`, the specification) and the dispatch to the compiled
path (`impl="triton"`: `specdec.kernels.tree_attention`, which reads the paged cache
directly; `impl="flex"`: FlexAttention on gathered K/V). It never writes the cache: the
model writes the new rows' K/V (`cache.write`) before calling `attention`.

Visibility. Query row t of batch row b sees the key at logical position j iff
  j < cache_len[b]                                   (committed prefix), or
  k = j - cache_len[b] in [0, q_len[b]) and (tree_mask is None ? k <= t : bit(t, k) set),
and, with a sliding window W, also pos(query) - pos(key) < W, where pos are RoPE
positions: a committed key at j has position j; new row k has position `positions[b, k]`
(cache_len + depth for a tree node). Padding query rows (t >= q_len[b]) see nothing and
output 0. Keys whose block is unallocated are never read. GQA: query head h reads KV head
h // (H // Hkv).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import PagedKVCache

__all__ = ["AttentionBatch", "attention", "attention_ref", "visible_mask", "query_positions"]

IMPLS = ("auto", "ref", "triton", "flex")


@dataclass
class AttentionBatch:
    """Metadata of one forward, shared by all layers.

    slots:      [B] int64, request slot of each row (its block-table row)
    cache_len:  [B] int64, committed tokens before this forward (all visible)
    q_len:      [B] int64, valid query rows per row (rows t >= q_len are padding)
    write_index:[B, T] int64, flat cache row of each query row's K/V, -1 = padding
    tree_mask:  [B, T, ceil(T/32)] int32 packed ancestor-or-self bits, or None = causal
    max_kv_len: python int, static key capacity to scan (>= cache_len + q_len, <= max_seq_len)
    positions:  [B, T] int64 RoPE positions of the query rows, or None: then cache_len + t
                (causal) or cache_len + depth, depth = popcount(mask row) - 1 (tree).
                Only the sliding window reads it.
    """

    slots: torch.Tensor  # [B] int64
    cache_len: torch.Tensor  # [B] int64
    q_len: torch.Tensor  # [B] int64
    write_index: torch.Tensor  # [B, T] int64
    tree_mask: torch.Tensor | None  # [B, T, ceil(T/32)] int32
    max_kv_len: int
    positions: torch.Tensor | None = None  # [B, T] int64

    @property
    def num_rows(self) -> int:
        return self.write_index.shape[1]


def _popcount32(x: torch.Tensor) -> torch.Tensor:
    """Set bits of each int32 word, as int64 (SWAR popcount on the low 32 bits)."""
    x = x.to(torch.int64) & 0xFFFFFFFF
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) & 0xFFFFFFFF) >> 24


def query_positions(batch: AttentionBatch) -> torch.Tensor:
    """RoPE positions of the query rows: [B, T] int64 (see `AttentionBatch.positions`)."""
    if batch.positions is not None:
        return batch.positions
    T = batch.num_rows
    if batch.tree_mask is None:
        offset = torch.arange(T, device=batch.cache_len.device)[None, :]
    else:
        offset = _popcount32(batch.tree_mask).sum(-1) - 1  # [B, T] depth
    return batch.cache_len[:, None] + offset


def visible_mask(batch: AttentionBatch, cache: PagedKVCache, sliding_window: int | None = None) -> torch.Tensor:
    """The visibility rule as a dense mask: [B, T, max_kv_len] bool (the specification)."""
    T, S = batch.num_rows, batch.max_kv_len
    device = batch.cache_len.device
    j = torch.arange(S, device=device)[None, None, :]  # [1, 1, S]
    t = torch.arange(T, device=device)[None, :, None]  # [1, T, 1]
    cache_len = batch.cache_len[:, None, None]
    q_len = batch.q_len[:, None, None]
    k = j - cache_len  # [B, 1, S] index of the new row at key position j
    is_new = (k >= 0) & (k < q_len)
    kk = k.clamp(0, T - 1)
    if batch.tree_mask is None:
        related = kk <= t
    else:
        word_index = (kk // 32).expand(-1, T, -1)  # [B, T, S]
        words = torch.gather(batch.tree_mask, 2, word_index)
        related = ((words >> (kk % 32).to(torch.int32)) & 1).bool()
    visible = (j < cache_len) | (is_new & related)
    visible = visible & (t < q_len)
    allocated = cache.token_index(batch.slots, j[0].expand(batch.slots.shape[0], -1)) >= 0  # [B, S]
    visible = visible & allocated[:, None, :]
    if sliding_window is not None:
        qpos = query_positions(batch)  # [B, T]
        new_pos = torch.gather(qpos, 1, kk[:, 0, :])  # [B, S] position of new row k
        kpos = torch.where(j[:, 0, :] < batch.cache_len[:, None], j[:, 0, :], new_pos)
        visible = visible & (qpos[:, :, None] - kpos[:, None, :] < sliding_window)
    return visible


def attention_ref(
    q: torch.Tensor,
    cache: PagedKVCache,
    layer: int,
    batch: AttentionBatch,
    *,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Dense masked attention on gathered K/V, in float32 (the specification).

    Args:
        q: [B, T, H, hd] queries (RoPE applied).
    Returns:
        [B, T, H, hd] in q's dtype; padding rows and rows that see no key are 0.
    """
    B, T, H, hd = q.shape
    S = batch.max_kv_len
    positions = torch.arange(S, device=q.device)[None, :].expand(B, S)
    k, v = cache.gather(layer, batch.slots, positions)  # [B, S, Hkv, hd]
    group = H // k.shape[2]
    k = k.float().repeat_interleave(group, dim=2)
    v = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), k) * scale  # [B, H, T, S]
    mask = visible_mask(batch, cache, sliding_window)[:, None]  # [B, 1, T, S]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing -> 0
    out = torch.einsum("bhts,bshd->bthd", probs, v)
    return out.to(q.dtype)


def _check(q: torch.Tensor, cache: PagedKVCache, layer: int, batch: AttentionBatch, sliding_window) -> None:
    if not 0 <= layer < cache.num_layers:
        raise ValueError(f"layer={layer} is out of range; allowed: [0, {cache.num_layers})")
    B, T, H, hd = q.shape
    hkv = cache.num_kv_heads[layer]
    if hd != cache.head_dim:
        raise ValueError(f"q head_dim={hd} differs from the cache's head_dim={cache.head_dim}")
    if H % hkv:
        raise ValueError(f"q heads H={H} must be a multiple of layer {layer}'s KV heads ({hkv})")
    if batch.write_index.shape != (B, T):
        raise ValueError(f"batch.write_index has shape {tuple(batch.write_index.shape)}; q needs ({B}, {T})")
    if not 1 <= batch.max_kv_len <= cache.max_seq_len:
        raise ValueError(f"max_kv_len={batch.max_kv_len} is out of range; allowed: [1, {cache.max_seq_len}]")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window={sliding_window} must be >= 1 or None")


def _default_impl(q: torch.Tensor) -> str:
    # Interpreted Triton attention is far too slow for model tests on CPU; it is tested
    # against the reference explicitly (impl="triton"), so "auto" uses it on CUDA only.
    return "triton" if q.is_cuda else "ref"


def attention(
    q: torch.Tensor,
    cache: PagedKVCache,
    layer: int,
    batch: AttentionBatch,
    *,
    scale: float,
    sliding_window: int | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Attention of new query rows over the committed prefix and the new rows in `cache`.

    Args:
        q: [B, T, H, hd] queries with RoPE applied; the new rows' K/V are already written.
        cache: the paged cache; `layer` picks its layer.
        batch: metadata shared by all layers (see `AttentionBatch`).
        scale: softmax scale (usually hd ** -0.5).
        sliding_window: W, or None for full attention.
        impl: "auto" (Triton on CUDA, else "ref"), "ref", "triton" or "flex".
    Returns:
        [B, T, H, hd] in q's dtype; padding rows are 0.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is unknown; allowed: {list(IMPLS)}")
    if not torch.compiler.is_compiling():
        _check(q, cache, layer, batch, sliding_window)
    if impl == "auto":
        impl = _default_impl(q)
    if impl == "ref":
        return attention_ref(q, cache, layer, batch, scale=scale, sliding_window=sliding_window)
    if impl == "triton":
        from specdec.kernels.tree_attention import paged_attention

        return paged_attention(q, cache, layer, batch, scale=scale, sliding_window=sliding_window)
    from .flex_attention import flex_paged_attention

    return flex_paged_attention(q, cache, layer, batch, scale=scale, sliding_window=sliding_window)
