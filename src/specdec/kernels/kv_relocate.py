"""KV relocation after verification: accepted tree nodes move to consecutive positions.

Owns the Triton kernel (every layer, K and V, in ONE launch) and its PyTorch reference
(the specification), both over `PagedKVCache`'s flat storage. It knows the cache layout
(regions, block tables) but nothing of trees or verifiers.

Semantics, for every batch row b (row b is request slot b), every layer, K and V:
node ``n_j = accept_nodes[b, j]`` for ``j <= accept_length[b]`` (and ``j < P``, P the
width of ``accept_nodes``) moves from logical position ``committed_len[b] + n_j`` to
``committed_len[b] + j``. All sources are read before any destination is written
(gather, then scatter), so overlapping paths such as [0, 2, 3] are safe. Rows with
``accept_length[b] == 0`` and pairs with ``n_j == j`` move nothing; a pair whose source or
destination block is unallocated is skipped (never written out of bounds). Nothing else
in the storage changes. The caller then advances ``committed_len += accept_length + 1``.

Concurrency of the kernel: program (b, region, column chunk) owns a disjoint piece of
memory (a slot's blocks are its own; regions and column chunks do not overlap), loads all
P sources of its piece, passes a CTA barrier, then stores. No program reads what another
writes.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    from torch.library import triton_op
    from .launch import wrap_triton

    HAS_TRITON = True
except ImportError:  # pragma: no cover - platforms without triton use the reference
    HAS_TRITON = False

__all__ = ["relocate_kv", "relocate_kv_reference", "relocate_kv_triton", "relocate_kv_naive"]


# --------------------------------------------------------------------------- reference
def relocate_kv_reference(
    storage: torch.Tensor,  # [total] the cache's flat storage (mutated)
    region_offsets: torch.Tensor,  # [R] int64 element offset of each (layer, K|V) region
    row_widths: torch.Tensor,  # [R] int64 elements per token row of each region
    block_tables: torch.Tensor,  # [max_batch_size, blocks_per_seq] int64, -1 unallocated
    committed_len: torch.Tensor,  # [B] int64
    accept_nodes: torch.Tensor,  # [B, P] int64 path, root first, -1 padding
    accept_length: torch.Tensor,  # [B] int64
    block_size: int,
    num_tokens: int,  # real token rows per region (row num_tokens is the sink)
    max_row_width: int,  # max of row_widths (sizes the kernel grid and the column range)
) -> None:
    """Gather/scatter reference of the relocation over the flat storage (same signature as the kernel)."""
    B, P = accept_nodes.shape
    bps = block_tables.shape[1]
    j = torch.arange(P, device=accept_nodes.device)[None, :]  # [1, P]
    move = (j <= accept_length[:, None]) & (accept_nodes != j) & (accept_nodes >= 0)

    def rows(pos: torch.Tensor) -> torch.Tensor:  # [B, P] logical -> flat token row or -1
        inside = (pos >= 0) & (pos < bps * block_size)
        p = torch.where(inside, pos, 0)
        blk = block_tables[:B].gather(1, p // block_size)
        return torch.where(inside & (blk >= 0), blk * block_size + p % block_size, -1)

    src = rows(committed_len[:, None] + accept_nodes)
    dst = rows(committed_len[:, None] + j)
    move = move & (src >= 0) & (dst >= 0)
    # element index of every (region, b, j, column); masked entries point at the region's sink row
    col = torch.arange(max_row_width, device=storage.device)  # [W]
    off, width = region_offsets[:, None, None, None], row_widths[:, None, None, None]  # [R, 1, 1, 1]
    live = move[None, :, :, None] & (col < width)  # [R, B, P, W]
    sink = off + num_tokens * width + torch.where(col < width, col, 0)

    def elements(row: torch.Tensor) -> torch.Tensor:
        return torch.where(live, off + row[None, :, :, None] * width + col, sink).reshape(-1)

    values = storage[elements(src)]  # gather first (a copy) ...
    storage[elements(dst)] = values  # ... then scatter; masked entries rewrite a sink element with itself


def relocate_kv_naive(cache, committed_len, accept_nodes, accept_length) -> None:
    """Per-token Python loop over a snapshot (slow; the plainest statement, for tests)."""
    before = [(cache.k(layer).clone(), cache.v(layer).clone()) for layer in range(cache.num_layers)]
    bs = cache.block_size
    for b in range(accept_nodes.shape[0]):
        base = int(committed_len[b])
        for j in range(min(int(accept_length[b]) + 1, accept_nodes.shape[1])):
            node = int(accept_nodes[b, j])
            src, dst = base + node, base + j
            sb, db = int(cache.block_tables[b, src // bs]), int(cache.block_tables[b, dst // bs])
            for layer, (k_old, v_old) in enumerate(before):
                cache.k(layer)[db, dst % bs] = k_old[sb, src % bs]
                cache.v(layer)[db, dst % bs] = v_old[sb, src % bs]


# --------------------------------------------------------------------------- Triton kernel
if HAS_TRITON:

    @triton.jit
    def _relocate_kernel(
        storage_ptr,
        region_offsets_ptr,
        row_widths_ptr,
        block_tables_ptr,
        bt_stride,
        committed_ptr,
        nodes_ptr,
        nodes_stride,
        length_ptr,
        P: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCKS_PER_SEQ: tl.constexpr,
        BLOCK_J: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        b = tl.program_id(0)
        region = tl.program_id(1)
        chunk = tl.program_id(2)
        base = tl.load(region_offsets_ptr + region)
        width = tl.load(row_widths_ptr + region)
        col = chunk * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
        j = tl.arange(0, BLOCK_J)  # [BLOCK_J]

        committed = tl.load(committed_ptr + b)
        length = tl.load(length_ptr + b)
        in_path = j < P
        node = tl.load(nodes_ptr + b * nodes_stride + j, mask=in_path, other=0)
        move = in_path & (j <= length) & (node != j) & (node >= 0)

        src_pos = committed + node
        dst_pos = committed + j
        limit = BLOCKS_PER_SEQ * BLOCK_SIZE
        src_ok = (src_pos >= 0) & (src_pos < limit)
        dst_ok = (dst_pos >= 0) & (dst_pos < limit)
        src_blk = tl.load(block_tables_ptr + b * bt_stride + src_pos // BLOCK_SIZE, mask=move & src_ok, other=-1)
        dst_blk = tl.load(block_tables_ptr + b * bt_stride + dst_pos // BLOCK_SIZE, mask=move & dst_ok, other=-1)
        move = move & (src_blk >= 0) & (dst_blk >= 0)
        src_row = src_blk * BLOCK_SIZE + src_pos % BLOCK_SIZE  # [BLOCK_J] int64
        dst_row = dst_blk * BLOCK_SIZE + dst_pos % BLOCK_SIZE

        mask = move[:, None] & (col < width)[None, :]  # [BLOCK_J, BLOCK_D]
        values = tl.load(storage_ptr + base + src_row[:, None] * width + col[None, :], mask=mask)
        tl.debug_barrier()  # every lane of this program has read all sources before any write
        tl.store(storage_ptr + base + dst_row[:, None] * width + col[None, :], values, mask=mask)

    @triton_op("specdec::relocate_kv", mutates_args={"storage"})
    def relocate_kv_triton(
        storage: torch.Tensor,
        region_offsets: torch.Tensor,
        row_widths: torch.Tensor,
        block_tables: torch.Tensor,
        committed_len: torch.Tensor,
        accept_nodes: torch.Tensor,
        accept_length: torch.Tensor,
        block_size: int,
        num_tokens: int,
        max_row_width: int,
    ) -> None:
        """The Triton kernel (same signature and semantics as `relocate_kv_reference`)."""
        B, P = accept_nodes.shape
        block_j = triton.next_power_of_2(P)
        # a [BLOCK_J, BLOCK_D] tile of sources stays in registers until the barrier
        block_d = max(16, min(triton.next_power_of_2(max_row_width), 8192 // block_j))
        grid = (B, region_offsets.shape[0], triton.cdiv(max_row_width, block_d))
        wrap_triton(_relocate_kernel)[grid](
            storage,
            region_offsets,
            row_widths,
            block_tables,
            block_tables.stride(0),
            committed_len,
            accept_nodes,
            accept_nodes.stride(0),
            accept_length,
            P=P,
            BLOCK_SIZE=block_size,
            BLOCKS_PER_SEQ=block_tables.shape[1],
            BLOCK_J=block_j,
            BLOCK_D=block_d,
        )


def _use_triton(impl: str, storage: torch.Tensor) -> bool:
    if impl not in ("auto", "triton", "torch"):
        raise ValueError(f"impl={impl!r} is unknown; allowed: ['auto', 'triton', 'torch']")
    if impl == "auto":
        return HAS_TRITON and (storage.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")
    if impl == "triton" and not HAS_TRITON:
        raise RuntimeError("impl='triton' needs the triton package; use impl='torch'")
    return impl == "triton"


def relocate_kv(cache, committed_len, accept_nodes, accept_length, *, impl: str = "auto") -> None:
    """Move accepted tree nodes to consecutive positions in every layer of `cache` (in place).

    Args:
        cache: `PagedKVCache`; batch row b is its slot b (block-table row b).
        committed_len: [B] int64 committed tokens; node i was written at committed_len + i.
        accept_nodes: [B, P] int64 accepted path, root first (P may be < N: only
            j <= accept_length[b] is read, and j < P).
        accept_length: [B] int64 accepted draft nodes (0 = nothing moves).
        impl: "auto" (Triton on CUDA or under TRITON_INTERPRET=1, else torch), "triton", "torch".
    """
    if accept_nodes.dim() != 2 or accept_nodes.shape[0] > cache.max_batch_size:
        raise ValueError(
            f"accept_nodes must be [B, P] with B <= max_batch_size={cache.max_batch_size}, "
            f"got shape {tuple(accept_nodes.shape)}"
        )
    args = (
        cache.storage,
        cache.region_offsets,
        cache.row_widths,
        cache.block_tables,
        committed_len,
        accept_nodes,
        accept_length,
        cache.block_size,
        cache.num_tokens,
        cache.max_row_width,
    )
    if _use_triton(impl, cache.storage):
        relocate_kv_triton(*args)
    else:
        relocate_kv_reference(*args)
