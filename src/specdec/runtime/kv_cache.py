"""Paged K/V cache: one flat storage tensor for every layer, block tables, host-side allocation.

Owns the memory layout of the target's K/V and the bookkeeping of which blocks back which
request slot. It never computes attention (`runtime.attention`) and never moves tokens
between positions (`specdec.kernels.kv_relocate`); both read the layout described here.

Layout. Layer l stores K then V, each a region of ``(num_blocks * block_size + 1)`` token
rows of ``n_kv_heads[l] * head_dim`` elements. The extra last row of every region is a
*sink*: fixed-shape writes send their padding rows there, so padding never touches real
tokens. All regions live back to back in one 1-D ``storage`` tensor, so one kernel can
address every layer (``region_offsets`` / ``row_widths``), also when layers differ in KV
heads. A logical position p of slot s lives in flat token row
``block_tables[s, p // block_size] * block_size + p % block_size``.

Allocation (`reserve` / `free`) is host-side bookkeeping, done between steps, never inside
a compiled step; it raises `KVCacheError` naming the value and the limit instead of ever
writing past what a slot owns.
"""

from __future__ import annotations

from collections.abc import Sequence


import torch

from specdec.checks import check_int, check_slot
from specdec.compile_scope import compile_private
from specdec.kernels.kv_write import kv_write_torch, kv_write_triton
from specdec.kernels.rope_kv_write import rope_kv_write_triton
from specdec.ops.dispatch import use_triton

__all__ = ["BlockAllocator", "KVCacheError", "PagedKVCache", "new_rows", "token_rows", "tree_rows"]


class KVCacheError(RuntimeError):
    """A request does not fit: past `max_seq_len`, or the block pool is exhausted."""


def token_rows(block_tables, slots, positions, valid, block_size: int) -> torch.Tensor:
    """Flat token row of each (row, logical position), -1 where not valid, out of range or
    unallocated. block_tables [max_B, bps], slots [B], positions / valid [B, T] -> [B, T] int64."""
    inside = valid & (positions >= 0) & (positions < block_tables.shape[1] * block_size)
    pos = torch.where(inside, positions, 0)
    block = block_tables[slots[:, None], pos // block_size]  # [B, T]
    index = block * block_size + pos % block_size
    return torch.where(inside & (block >= 0), index, -1)


def new_rows(block_tables, block_size: int, slots, cache_len, q_len, num_rows: int, rows_fn=token_rows):
    """Where a forward's new rows go: row t of batch row b is logical position cache_len[b] + t,
    valid for t < q_len[b]. Pure tensors (block tables in, no cache object), so compiled glue
    can call it too. Returns (positions [B, T] int64, flat token rows [B, T] int64, -1 past
    q_len or unallocated); `rows_fn` is `token_rows` or a cache's compiled copy of it."""
    t = torch.arange(num_rows, device=cache_len.device)[None, :]  # [1, T]
    logical = cache_len[:, None] + t  # [B, T]
    return logical, rows_fn(block_tables, slots, logical, t < q_len[:, None], block_size)


def tree_rows(block_tables, block_size: int, cache_len, depth, num_nodes):
    """A tree verify's new rows, one piece of index arithmetic: node i of row b (slot b) is
    stored at logical position cache_len[b] + i (its slot, not its depth) and rotated at
    cache_len[b] + depth[b, i]. cache_len / num_nodes [B] int64, depth [B, N] int64 ->
    (slots [B], write_index [B, N] (-1 past num_nodes or unallocated), positions [B, N])."""
    B, N = depth.shape
    slots = torch.arange(B, device=cache_len.device)
    _, index = new_rows(block_tables, block_size, slots, cache_len, num_nodes, N)
    return slots, index, cache_len[:, None] + depth




class BlockAllocator:
    """Which KV blocks back which request slot: a free pool, per-slot lists, block tables.

    Host-side bookkeeping between steps, never inside a step. The tables live on the host
    (`host_tables`) and on the device (`block_tables`); on CUDA a change is copied to the
    device asynchronously from pinned memory (`flush`), so reserving never stalls the GPU
    and a step never waits for a pageable copy. Every `PagedKVCache` built on one allocator
    (the target's layers, a draft head's layers) sees the same tables.
    """

    def __init__(self, max_batch_size: int, blocks_per_seq: int, num_blocks: int, block_size: int,
                 max_seq_len: int, device: torch.device) -> None:
        self.max_batch_size, self.blocks_per_seq = max_batch_size, blocks_per_seq
        self.num_blocks, self.block_size, self.max_seq_len = num_blocks, block_size, max_seq_len
        self.device = torch.device(device)
        # [max_batch_size, blocks_per_seq] int64, -1 = unallocated
        self.block_tables = torch.full((max_batch_size, blocks_per_seq), -1, dtype=torch.int64, device=self.device)
        self.host_tables = self.block_tables if self.device.type == "cpu" else self.block_tables.cpu()
        self._host_rows = self.host_tables.numpy()  # the same memory: a block id written in ~1 us, not a tensor op
        self._dirty = False
        self._free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))  # stack; pops lowest first
        self._owned: list[list[int]] = [[] for _ in range(max_batch_size)]

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    def _check_slot(self, slot: int) -> int:
        return check_slot(slot, self.max_batch_size)

    def capacity(self, slot: int) -> int:
        """Logical positions of `slot` currently backed by blocks."""
        return len(self._owned[self._check_slot(slot)]) * self.block_size

    def owned(self, slot: int) -> list[int]:
        """The blocks of `slot`, in logical order (a copy)."""
        return list(self._owned[self._check_slot(slot)])

    def reserve(self, slot: int, num_tokens: int, *, flush: bool = True) -> None:
        """Back logical positions [0, num_tokens) of `slot` with blocks.

        Blocks already owned are kept; only the missing ones are taken from the pool, so
        calling it before every step with the step's end position is cheap. Raises
        `KVCacheError` naming the value if `num_tokens > max_seq_len` or the pool has too
        few free blocks; then nothing is allocated.
        """
        self._check_slot(slot)
        check_int("num_tokens", num_tokens, 0, error=ValueError)
        if num_tokens > self.max_seq_len:
            raise KVCacheError(
                f"slot {slot} needs {num_tokens} positions, more than max_seq_len={self.max_seq_len}"
            )
        owned = self._owned[slot]
        need = -(-num_tokens // self.block_size) - len(owned)
        if need <= 0:
            return
        if need > len(self._free_blocks):
            raise KVCacheError(
                f"slot {slot} needs {need} more KV blocks for {num_tokens} positions but only "
                f"{len(self._free_blocks)} of num_blocks={self.num_blocks} are free "
                f"(block_size={self.block_size}); free finished requests or raise num_kv_blocks"
            )
        new = [self._free_blocks.pop() for _ in range(need)]
        start = len(owned)
        owned.extend(new)
        self._host_rows[slot, start : start + need] = new
        self._changed(flush)

    def free(self, slot: int, *, flush: bool = True) -> None:
        """Return every block of `slot` to the pool and clear its block-table row."""
        self._check_slot(slot)
        owned = self._owned[slot]
        if owned:
            self._free_blocks.extend(reversed(owned))
            owned.clear()
            self._host_rows[slot] = -1
            self._changed(flush)

    def _changed(self, flush: bool) -> None:
        if self.host_tables is not self.block_tables:
            self._dirty = True
            if flush:
                self.flush()

    def flush(self) -> None:
        """Copy the host tables to the device if they changed: a non-blocking copy from a fresh
        pinned snapshot (the pinned-memory cache keeps a snapshot alive until its copy is done,
        so later changes on the host cannot race the copy)."""
        if not self._dirty:
            return
        staging = self.host_tables.pin_memory() if torch.cuda.is_available() else self.host_tables.clone()
        self.block_tables.copy_(staging, non_blocking=True)
        self._dirty = False


class PagedKVCache:
    """Paged K/V for every layer in ONE flat storage tensor.

    Per-layer views: ``k(layer)``, ``v(layer)``: [num_blocks, block_size, n_kv_heads[layer], head_dim].
    ``block_tables``: [max_batch_size, blocks_per_seq] int64, -1 = unallocated.

    Args:
        num_layers: decoder layers.
        num_kv_heads: KV heads, one int for all layers or one per layer.
        head_dim: size of one head.
        max_batch_size: request slots (block-table rows).
        max_seq_len: most logical positions one slot may hold (drafts included).
        block_size: tokens per block.
        num_blocks: blocks in the pool; None = enough for every slot at `max_seq_len`.
        device, dtype: of the storage.
        allocator: share the block pool and tables of another cache (see `layer_group`).
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int | Sequence[int],
        head_dim: int,
        *,
        max_batch_size: int,
        max_seq_len: int,
        block_size: int,
        num_blocks: int | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        allocator: "BlockAllocator | None" = None,
    ) -> None:
        self.num_layers = check_int("num_layers", num_layers, 1, error=ValueError)
        if isinstance(num_kv_heads, int):
            heads = (num_kv_heads,) * num_layers
        else:
            heads = tuple(num_kv_heads)
            if len(heads) != num_layers:
                raise ValueError(f"num_kv_heads has {len(heads)} entries; need one per layer ({num_layers})")
        for h in heads:
            check_int("num_kv_heads", h, 1, error=ValueError)
        self.num_kv_heads: tuple[int, ...] = heads
        self.head_dim = check_int("head_dim", head_dim, 1, error=ValueError)
        self.max_batch_size = check_int("max_batch_size", max_batch_size, 1, error=ValueError)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, 1, error=ValueError)
        self.block_size = check_int("block_size", block_size, 1, error=ValueError)
        self.blocks_per_seq = -(-max_seq_len // block_size)
        if num_blocks is None:
            num_blocks = max_batch_size * self.blocks_per_seq
        self.num_blocks = check_int("num_blocks", num_blocks, 1, error=ValueError)
        self.device = torch.device(device)
        self.dtype = dtype
        # read once here, on the host, so kernels can size their grids inside a compiled step
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 1

        self.num_tokens = num_blocks * block_size  # real token rows per region; row num_tokens is the sink
        offsets, widths, total = [], [], 0
        for h in heads:
            for _ in ("k", "v"):
                offsets.append(total)
                widths.append(h * head_dim)
                total += (self.num_tokens + 1) * h * head_dim
        self.storage = torch.zeros(total, device=self.device, dtype=dtype)  # [sum of regions]
        self._offsets = offsets  # python ints: writes address the storage itself (`kv_write`)
        # [2 * num_layers] int64: element offset / row width of region 2*l (K) and 2*l + 1 (V)
        self.region_offsets = torch.tensor(offsets, dtype=torch.int64, device=self.device)
        self.row_widths = torch.tensor(widths, dtype=torch.int64, device=self.device)
        self.max_row_width = max(widths)

        self.compiled = False  # index arithmetic through torch.compile (`use_compiled`)
        self.token_rows = token_rows
        self.tree_rows = tree_rows
        # Blocks are handed out by an allocator that layer groups of other models (a draft
        # head's KV) share: one pool, one set of block tables, one reservation per request.
        self.allocator = allocator or BlockAllocator(
            max_batch_size, self.blocks_per_seq, num_blocks, block_size, max_seq_len, self.device
        )

    def layer_group(
        self,
        num_layers: int,
        num_kv_heads: int | Sequence[int],
        head_dim: int,
        *,
        dtype: torch.dtype | None = None,
    ) -> "PagedKVCache":
        """A cache for more layers (a draft head's) on this cache's allocator: same pool size,
        same block tables, so a reservation of a slot backs the positions of both."""
        group = PagedKVCache(
            num_layers,
            num_kv_heads,
            head_dim,
            max_batch_size=self.max_batch_size,
            max_seq_len=self.max_seq_len,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            device=self.device,
            dtype=self.dtype if dtype is None else dtype,
            allocator=self.allocator,
        )
        return group.use_compiled(self.compiled)

    @property
    def block_tables(self) -> torch.Tensor:
        """[max_batch_size, blocks_per_seq] int64 on the cache's device, -1 = unallocated."""
        return self.allocator.block_tables

    def use_compiled(self, on: bool = True) -> "PagedKVCache":
        """Compute write/token indices through torch.compile (one kernel instead of ~8; a tree
        verify's rows and positions one instead of ~13)."""
        self.compiled = bool(on)
        self.token_rows = compile_private(token_rows, dynamic=True, fullgraph=True) if on else token_rows
        self.tree_rows = compile_private(tree_rows, dynamic=True, fullgraph=True) if on else tree_rows
        return self

    # ----------------------------------------------------------------- views
    def k(self, layer: int) -> torch.Tensor:
        """K of `layer`: [num_blocks, block_size, n_kv_heads[layer], head_dim] (a view)."""
        return self._region(2 * layer)[: self.num_tokens].view(self.num_blocks, self.block_size, -1, self.head_dim)

    def v(self, layer: int) -> torch.Tensor:
        """V of `layer`: [num_blocks, block_size, n_kv_heads[layer], head_dim] (a view)."""
        return self._region(2 * layer + 1)[: self.num_tokens].view(self.num_blocks, self.block_size, -1, self.head_dim)

    def k_rows(self, layer: int) -> torch.Tensor:
        """K of `layer` by flat token row: [num_tokens + 1, Hkv, hd]; the last row is the sink."""
        return self._region(2 * layer)

    def v_rows(self, layer: int) -> torch.Tensor:
        """V of `layer` by flat token row: [num_tokens + 1, Hkv, hd]; the last row is the sink."""
        return self._region(2 * layer + 1)

    @property
    def sink_index(self) -> int:
        """Flat token row that absorbs padding writes (never read as a real token)."""
        return self.num_tokens

    # ------------------------------------------------------------ allocation
    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def capacity(self, slot: int) -> int:
        """Logical positions of `slot` currently backed by blocks."""
        return self.allocator.capacity(slot)

    def reserve(self, slot: int, num_tokens: int, *, flush: bool = True) -> None:
        """Back logical positions [0, num_tokens) of `slot` with blocks (host side, between steps).

        See `BlockAllocator.reserve`; `flush=False` defers the device copy of the block
        tables to an explicit `flush()` (one copy for many reservations).
        """
        self.allocator.reserve(slot, num_tokens, flush=flush)

    def free(self, slot: int, *, flush: bool = True) -> None:
        """Return every block of `slot` to the pool and clear its block-table row."""
        self.allocator.free(slot, flush=flush)

    def flush(self) -> None:
        """Copy changed block tables to the device (asynchronously, from pinned memory)."""
        self.allocator.flush()

    # ---------------------------------------------------------------- writes
    def token_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat token row of each (row, logical position); -1 where the block is unallocated.

        Args:
            slots: [B] int64 request slot of each row.
            positions: [B, T] int64 logical positions (out-of-range ones give -1).
        Returns:
            [B, T] int64.
        """
        fn = self.token_rows
        return fn(self.block_tables, slots, positions, torch.ones_like(positions, dtype=torch.bool), self.block_size)

    def write_index(self, slots: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Flat token index ``block * block_size + offset`` per (row, position); -1 where not valid.

        A valid position whose block is not reserved also gives -1 (its write is dropped
        into the sink instead of landing in another request's memory).

        Args:
            slots: [B] int64; positions: [B, T] int64 logical positions; valid: [B, T] bool.
        Returns:
            [B, T] int64.
        """
        fn = self.token_rows
        return fn(self.block_tables, slots, positions, valid, self.block_size)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, write_index: torch.Tensor, *, impl: str = "auto") -> None:
        """Store K/V of new tokens (mutates the cache in place; fixed shape).

        Args:
            layer: decoder layer.
            k, v: [B, T, Hkv, hd] in any float dtype (cast to the cache dtype).
            write_index: [B, T] int64 from `write_index`; rows with -1 are not written.
            impl: "auto" (the Triton kernel `specdec.kernels.kv_write` on CUDA or under
                TRITON_INTERPRET=1, else its reference), "triton" or "torch".
        """
        width = self.num_kv_heads[layer] * self.head_dim
        rows = (k.reshape(-1, width), v.reshape(-1, width), write_index.reshape(-1))  # [B*T, W] x2, [B*T]
        fn = kv_write_triton if self._runs_triton(impl) else kv_write_torch
        fn(self.storage, *self._layer_offsets(layer), self.num_tokens, *rows)

    def _region(self, i: int) -> torch.Tensor:
        """Region i (2*layer: K, 2*layer + 1: V) as [num_tokens + 1, Hkv, hd], the last row a
        sink: a view made from `storage` at each use, never stored. A compiled step then has
        one cache input, the storage; views kept as attributes would enter the graph as inputs
        aliasing it, and a write into the storage would be functionalized into copies of the
        whole storage (AOTAutograd's synthetic base)."""
        off, h = self._offsets[i], self.num_kv_heads[i // 2]
        return self.storage[off : off + (self.num_tokens + 1) * h * self.head_dim].view(self.num_tokens + 1, h, self.head_dim)

    def _layer_offsets(self, layer: int) -> tuple[int, int]:
        """Element offsets of the layer's K and V regions in `storage` (python ints)."""
        return self._offsets[2 * layer], self._offsets[2 * layer + 1]

    def _runs_triton(self, impl: str) -> bool:
        """Whether a write of this cache runs its Triton kernel under `impl`. Interpreted Triton
        cannot be traced by torch.compile: compiled CPU code takes the reference."""
        return use_triton(impl, self.storage) and (self.storage.is_cuda or not torch.compiler.is_compiling())

    def fuses_rope(self, impl: str = "auto") -> bool:
        """True when `write_rotated` runs the fused Triton kernel: on CUDA ("auto"), or when
        forced ("triton", also in the interpreter outside torch.compile); else it runs the
        rotary piece and then `write`. "auto" keeps the interpreter out of it: the kernel runs
        a program per row and head, which Triton's interpreter runs one by one (a CPU test's
        prefill went from 0.5 to 8 s per layer); its own tests run it there."""
        if impl == "auto":
            return self.storage.is_cuda
        return self._runs_triton(impl)

    def write_rotated(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, write_index: torch.Tensor, *, rotary, impl: str = "auto") -> torch.Tensor:
        """RoPE on the new rows' queries and keys, and the store of their K/V; returns the
        rotated queries. One launch through `specdec.kernels.rope_kv_write` where Triton runs,
        else `rotary(q, k, cos, sin)` (the model's rotary piece) and `write`.

        Args:
            q: [B, T, H, hd]; k, v: [B, T, Hkv, hd]; cos, sin: [B, T, 1, hd];
            write_index: [B, T] int64 from `write_index`; rotary: the fallback RoPE function.
        Returns:
            [B, T, H, hd] the rotated queries.
        """
        if not self.fuses_rope(impl):
            q, k = rotary(q, k, cos, sin)
            self.write(layer, k, v, write_index, impl=impl)
            return q
        B, T, H, hd = q.shape
        width = self.num_kv_heads[layer] * hd
        q_out = torch.empty(B, T, H, hd, dtype=q.dtype, device=q.device)
        rope_kv_write_triton(
            q_out.view(B * T, H, hd), self.storage, *self._layer_offsets(layer), self.num_tokens,
            q.reshape(B * T, H * hd), k.reshape(B * T, width), v.reshape(B * T, width),
            cos.reshape(B * T, hd), sin.reshape(B * T, hd), write_index.reshape(-1),
        )
        return q_out

    def gather(self, layer: int, slots: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V at logical positions (reference and test helper; unallocated positions read 0).

        Args:
            slots: [B] int64; positions: [B, S] int64.
        Returns:
            k, v: [B, S, Hkv, hd] each, cache dtype.
        """
        index = self.token_index(slots, positions)
        safe = torch.where(index < 0, self.num_tokens, index)
        k = self._region(2 * layer)[safe]
        v = self._region(2 * layer + 1)[safe]
        keep = (index >= 0)[..., None, None]
        return torch.where(keep, k, 0), torch.where(keep, v, 0)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(layers={self.num_layers}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"slots={self.max_batch_size}, max_seq_len={self.max_seq_len}, block_size={self.block_size}, "
            f"blocks={self.num_blocks} ({self.num_free_blocks} free), dtype={self.dtype}, device={self.device})"
        )
