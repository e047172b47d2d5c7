"""`AttentionBatch`: the metadata of one forward that every attention layer shares.

Owns the dataclass, the RoPE positions derived from it (`query_positions`) and the checks
that need only its structure (`check_batch`). It imports nothing from specdec, so the
attention paths (`runtime.attention`, `runtime.flex_attention`, `kernels.tree_attention`)
and the batch builders (`runtime.batch`) can all import it without a cycle. The visibility
rule the fields describe is written down once, in `specdec.runtime.attention`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AttentionBatch", "check_batch", "new_key_len", "query_positions"]


@dataclass
class AttentionBatch:
    """Metadata of one forward, shared by all layers.

    slots:      [B] int64, request slot of each row (its block-table row)
    cache_len:  [B] int64, committed tokens before this forward (all visible)
    q_len:      [B] int64, valid query rows per row (rows t >= q_len are padding)
    write_index:[B, T] int64, flat cache row of each query row's K/V, -1 = padding
    tree_mask:  [B, T, W] int32 packed visibility bits of the new key rows, or None = causal.
                Bit k of row t (word k // 32, bit k % 32) set = query row t sees new key k.
                32 * W >= the largest key count (W may exceed ceil(T / 32)).
    max_kv_len: python int, static key capacity (>= cache_len + new keys, <= max_seq_len).
                It only bounds work (key splits, the reference's dense key range); results
                do not depend on it.
    positions:  [B, T] int64 RoPE positions of the query rows, or None: then cache_len + t
                (causal) or cache_len + depth, depth = popcount(mask row) - 1 (tree).
                Only the sliding window reads it.
    key_len:    [B] int64 new key rows per row (tree mode only), or None = q_len. The new
                keys are rows k in [0, key_len[b]) at logical positions cache_len[b] + k;
                the queries' own K/V are among them, wherever the caller wrote them (the
                caller sets the mask bits). Not allowed with a causal batch nor with a
                sliding window (the new keys' positions would be unknown).
    """

    slots: torch.Tensor  # [B] int64
    cache_len: torch.Tensor  # [B] int64
    q_len: torch.Tensor  # [B] int64
    write_index: torch.Tensor  # [B, T] int64
    tree_mask: torch.Tensor | None  # [B, T, W] int32
    max_kv_len: int
    positions: torch.Tensor | None = None  # [B, T] int64
    key_len: torch.Tensor | None = None  # [B] int64

    @property
    def num_rows(self) -> int:
        return self.write_index.shape[1]


def new_key_len(batch: AttentionBatch) -> torch.Tensor:
    """New key rows per batch row: [B] int64 (`key_len`, default `q_len`)."""
    return batch.q_len if batch.key_len is None else batch.key_len


def check_batch(batch: AttentionBatch, sliding_window: int | None) -> None:
    """Raise ValueError for combinations the visibility rule does not define (structure
    only: no tensor values are read, so it is free on CUDA and under torch.compile)."""
    if batch.key_len is None:
        return
    if batch.tree_mask is None:
        raise ValueError(
            "batch.key_len is set but batch.tree_mask is None: key_len (new keys apart from the "
            "query rows) is defined for tree mode only; give a tree mask or key_len=None"
        )
    if sliding_window is not None:
        raise ValueError(
            f"sliding_window={sliding_window} with batch.key_len set: the new keys' positions are "
            "unknown; use sliding_window=None or key_len=None"
        )
    if batch.key_len.shape != batch.q_len.shape:
        raise ValueError(f"batch.key_len has shape {tuple(batch.key_len.shape)}; need {tuple(batch.q_len.shape)}")


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
