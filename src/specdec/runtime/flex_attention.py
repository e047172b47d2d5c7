"""`impl="flex"`: the attention rule as a FlexAttention `mask_mod` over gathered K/V.

Owns a second compiled path, for comparison with the Triton kernel (`kernels/tree_attention`)
and as a fallback where Triton is missing. K/V of each row's logical positions [0, max_kv_len)
are gathered from the paged cache (a copy, which the Triton kernel avoids), then
`flex_attention` runs with a block mask built from the same rule as `attention_ref`
(committed prefix, causal or packed tree bits over `key_len` new keys, optional sliding
window, unallocated keys hidden). Compiled with torch.compile on CUDA; eager on CPU (tests).
Imports only `attention_batch` and `kv_cache` (never `runtime.attention`, which imports it).
"""

from __future__ import annotations

import functools

import torch

from .attention_batch import AttentionBatch, check_batch, new_key_len, query_positions
from .kv_cache import PagedKVCache

__all__ = ["flex_paged_attention", "make_mask_mod"]

# Keys are gathered up to a multiple of FlexAttention's default block (128): the compiled
# kernel then sees few distinct key lengths (one graph per multiple, not per context length,
# within dynamo's recompile limit), and every key block is whole. The padded keys are
# unallocated positions (`token_index` gives -1 past the block table), hidden by the mask.
KEY_MULTIPLE = 128


def make_mask_mod(batch: AttentionBatch, allocated: torch.Tensor, sliding_window: int | None):
    """`mask_mod(b, h, q_idx, kv_idx)` of the visibility rule (allocated: [B, S] bool)."""
    check_batch(batch, sliding_window)
    cache_len, q_len, n_new, tree = batch.cache_len, batch.q_len, new_key_len(batch), batch.tree_mask
    T = batch.num_rows
    key_cap = T if tree is None else 32 * tree.shape[2]  # new-key columns the mask can address
    positions = query_positions(batch) if sliding_window is not None else None

    def mask_mod(b, h, q_idx, kv_idx):
        k = kv_idx - cache_len[b]
        kk = k.clamp(0, key_cap - 1)
        if tree is None:
            related = kk <= q_idx
        else:
            related = ((tree[b, q_idx, kk // 32] >> (kk % 32).to(torch.int32)) & 1) == 1
        visible = (kv_idx < cache_len[b]) | ((k >= 0) & (k < n_new[b]) & related)
        visible = visible & (q_idx < q_len[b]) & allocated[b, kv_idx]
        if positions is not None:  # key_len is None here: new row k is query row k
            kpos = torch.where(k < 0, kv_idx, positions[b, k.clamp(0, T - 1)])
            visible = visible & (positions[b, q_idx] - kpos < sliding_window)
        return visible

    return mask_mod


@functools.cache
def _flex_fns(compiled: bool):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if compiled:
        return torch.compile(flex_attention, dynamic=False), create_block_mask
    return flex_attention, create_block_mask


def flex_paged_attention(
    q: torch.Tensor,
    cache: PagedKVCache,
    layer: int,
    batch: AttentionBatch,
    *,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`runtime.attention(..., impl="flex")`; arguments and result as `attention_ref`."""
    check_batch(batch, sliding_window)
    B, T, H, hd = q.shape
    S = -(-batch.max_kv_len // KEY_MULTIPLE) * KEY_MULTIPLE  # >= max_kv_len: the padded keys stay hidden
    flex, create_block_mask = _flex_fns(q.is_cuda)
    positions = torch.arange(S, device=q.device)[None, :].expand(B, S)
    index = cache.token_index(batch.slots, positions)  # [B, S]
    rows = torch.where(index < 0, cache.sink_index, index)
    k = cache.k_rows(layer)[rows].transpose(1, 2)  # [B, Hkv, S, hd]
    v = cache.v_rows(layer)[rows].transpose(1, 2)
    # one block mask per forward (all layers share it), memoized on the batch object
    memo = batch.__dict__.setdefault("_flex_block_masks", {})
    key = (id(cache), sliding_window)
    if key not in memo:
        mask_mod = make_mask_mod(batch, index >= 0, sliding_window)
        memo[key] = create_block_mask(mask_mod, B, None, T, S, device=q.device)
    block_mask = memo[key]
    qh = q.to(k.dtype).transpose(1, 2)  # [B, H, T, hd]
    # CUDA: flex's main Triton kernel, never its decoding one, which AUTO picks for fewer than 128
    # query rows: with grouped query heads over tree rows it can have no valid config at all
    # (H200, torch 2.11: NoValidChoicesError for fp32, head_dim 16, 4 heads per KV head, 40 rows)
    options = {"BACKEND": "TRITON"} if q.is_cuda else None
    out = flex(qh, k, v, block_mask=block_mask, scale=scale, enable_gqa=H != k.shape[1], kernel_options=options)
    out = out.transpose(1, 2).to(q.dtype)  # [B, T, H, hd]
    return torch.where((torch.arange(T, device=q.device)[None, :] < batch.q_len[:, None])[..., None, None], out, 0)
