"""Builders of `AttentionBatch` for the three kinds of target forward: prefill, decode, tree verify.

Owns the mapping from "what the engine knows" (committed lengths, new-token counts, the
tree) to the attention metadata and the write positions of the new rows. Pure tensor
functions (no `.item()`, no host sync), so they can live inside a compiled step; block
reservation (`PagedKVCache.reserve`) must have happened before, on the host.

Write positions: new row i of batch row b is stored at logical position
``cache_len[b] + i``; for a tree that is node i's slot (not its depth). RoPE positions are
``cache_len + i`` for prefill/decode and ``cache_len + depth(i)`` for a tree.
"""

from __future__ import annotations

import torch

from specdec.types import TreeMeta

from .attention import AttentionBatch
from .kv_cache import PagedKVCache, new_rows

__all__ = ["prefill_batch", "decode_batch", "tree_batch", "new_rows"]


def _new_rows(cache: PagedKVCache, slots, cache_len, q_len, num_rows: int):
    return new_rows(cache.block_tables, cache.block_size, slots, cache_len, q_len, num_rows, cache.token_rows)


def prefill_batch(
    cache: PagedKVCache,
    slots: torch.Tensor,
    cache_len: torch.Tensor,
    q_len: torch.Tensor,
    num_rows: int,
    *,
    max_kv_len: int | None = None,
) -> AttentionBatch:
    """Causal forward of `q_len[b]` new tokens after `cache_len[b]` committed ones.

    Args:
        slots: [B] int64 request slots (a subset of slots is fine).
        cache_len: [B] int64 committed tokens (0 for a fresh prompt; > 0 for chunked prefill).
        q_len: [B] int64 new tokens per row (<= num_rows).
        num_rows: T, the padded row count.
        max_kv_len: key capacity to scan; default `cache.max_seq_len`.
    """
    positions, index = _new_rows(cache, slots, cache_len, q_len, num_rows)
    return AttentionBatch(
        slots=slots,
        cache_len=cache_len,
        q_len=q_len,
        write_index=index,
        tree_mask=None,
        max_kv_len=max_kv_len or cache.max_seq_len,
        positions=positions,
    )


def decode_batch(
    cache: PagedKVCache, cache_len: torch.Tensor, active: torch.Tensor, *, max_kv_len: int | None = None
) -> AttentionBatch:
    """One new token per active slot (T = 1); row b is slot b, inactive rows are padding.

    Args:
        cache_len: [B] int64 committed tokens per slot; the new token sits at this position.
        active: [B] bool live slots.
    """
    slots = torch.arange(cache_len.shape[0], device=cache_len.device)
    q_len = active.to(torch.int64)
    return prefill_batch(cache, slots, cache_len, q_len, 1, max_kv_len=max_kv_len)


def tree_batch(
    cache: PagedKVCache,
    cache_len: torch.Tensor,
    tree: TreeMeta,
    num_nodes: torch.Tensor,
    *,
    max_kv_len: int | None = None,
) -> AttentionBatch:
    """Tree verification: the N nodes of each slot's tree (row b is slot b).

    Args:
        cache_len: [B] int64 committed tokens; node 0 (the root) is written at this position.
        tree: its `packed_mask` [B, N, ceil(N/32)] int32 and `positions` [B, N] (depth).
        num_nodes: [B] int64 valid nodes (0 for an inactive slot).
    """
    slots, index, positions = cache.tree_rows(cache.block_tables, cache.block_size, cache_len, tree.positions, num_nodes)
    return AttentionBatch(
        slots=slots,
        cache_len=cache_len,
        q_len=num_nodes,
        write_index=index,
        tree_mask=tree.packed_mask,
        max_kv_len=max_kv_len or cache.max_seq_len,
        positions=positions,
    )
