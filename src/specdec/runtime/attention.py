"""Attention over the paged KV cache, for prefill, decode and tree verification.

Owns the visibility rule, its dense reference (`impl="ref"`, the specification) and the
dispatch to the compiled paths (`impl="triton"`: `specdec.kernels.tree_attention`, which
reads the paged cache directly; `impl="flex"`: FlexAttention on gathered K/V). The
metadata, `AttentionBatch`, lives in `runtime.attention_batch` (re-exported here). It never
writes the cache: the model writes the new rows' K/V (`cache.write`) before calling
`attention`.

Visibility. A forward has new key rows k in [0, n_new[b]) at logical positions
cache_len[b] + k, where n_new = q_len (causal, and tree mode by default) or
`batch.key_len` (tree mode only). Query row t of batch row b (t < q_len[b]) sees the key
at logical position j iff
  j < cache_len[b]                                        (committed prefix), or
  k = j - cache_len[b] in [0, n_new[b]) and (tree_mask is None ? k <= t : bit k of row t set),
and, with a sliding window W, also pos(query) - pos(key) < W, where pos are RoPE
positions: a committed key at j has position j; new row k has position `positions[b, k]`
(cache_len + depth for a tree node; a window needs key_len None). The tree mask is
[B, T, words] int32, 32 * words >= the largest n_new (words may exceed ceil(T / 32));
bit k of row t is bit k % 32 of word k // 32; bits at k >= n_new[b] are ignored. Padding
query rows (t >= q_len[b]) see nothing and output 0. Keys whose block is unallocated are
never read. GQA: query head h reads KV head h // (H // Hkv).

With key_len the queries need not be the new key rows: a draft tree grown one depth per
forward passes the F frontier rows of depth d as queries and every frontier row written
so far (cache_len + 0 .. cache_len + key_len - 1) as keys, seen along the ancestor bits.
The caller writes each query's own K/V somewhere among those key rows and sets its bit.

`batch.max_kv_len` bounds the keys scanned (the reference's dense key range, the number of
key splits); it must be >= cache_len + n_new, and the result does not depend on it.
"""

from __future__ import annotations

import torch

from .attention_batch import AttentionBatch, check_batch, new_key_len, query_positions
from .flex_attention import flex_paged_attention
from .kv_cache import PagedKVCache

__all__ = ["AttentionBatch", "attention", "attention_ref", "visible_mask", "query_positions"]

IMPLS = ("auto", "ref", "triton", "flex")


def visible_mask(batch: AttentionBatch, cache: PagedKVCache, sliding_window: int | None = None) -> torch.Tensor:
    """The visibility rule as a dense mask: [B, T, max_kv_len] bool (the specification)."""
    check_batch(batch, sliding_window)
    T, S = batch.num_rows, batch.max_kv_len
    device = batch.cache_len.device
    j = torch.arange(S, device=device)[None, None, :]  # [1, 1, S]
    t = torch.arange(T, device=device)[None, :, None]  # [1, T, 1]
    cache_len = batch.cache_len[:, None, None]
    q_len = batch.q_len[:, None, None]
    n_new = new_key_len(batch)[:, None, None]
    k = j - cache_len  # [B, 1, S] index of the new row at key position j
    is_new = (k >= 0) & (k < n_new)
    if batch.tree_mask is None:
        related = k <= t
    else:
        words_per_row = batch.tree_mask.shape[2]
        kk = k.clamp(0, 32 * words_per_row - 1)  # the mask's key capacity, not T
        word_index = (kk // 32).expand(-1, T, -1)  # [B, T, S]
        words = torch.gather(batch.tree_mask, 2, word_index)
        related = ((words >> (kk % 32).to(torch.int32)) & 1).bool()
    visible = (j < cache_len) | (is_new & related)
    visible = visible & (t < q_len)
    allocated = cache.token_index(batch.slots, j[0].expand(batch.slots.shape[0], -1)) >= 0  # [B, S]
    visible = visible & allocated[:, None, :]
    if sliding_window is not None:  # here key_len is None: new row k is query row k
        qpos = query_positions(batch)  # [B, T]
        new_pos = torch.gather(qpos, 1, k[:, 0, :].clamp(0, T - 1))  # [B, S] position of new row k
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
    """Dense masked attention on gathered K/V, in float32 or wider (float64 stays float64; the
    specification).

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
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.float32)
    k = k.to(dtype).repeat_interleave(group, dim=2)
    v = v.to(dtype).repeat_interleave(group, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.to(dtype), k) * scale  # [B, H, T, S]
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
    check_batch(batch, sliding_window)


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
        q: [B, T, H, hd] queries with RoPE applied; the new key rows' K/V are already written.
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
    if impl == "triton":  # imported here: loading triton is slow and wants TRITON_INTERPRET set first
        from specdec.kernels.tree_attention import paged_attention

        return paged_attention(q, cache, layer, batch, scale=scale, sliding_window=sliding_window)
    return flex_paged_attention(q, cache, layer, batch, scale=scale, sliding_window=sliding_window)
