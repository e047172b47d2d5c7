"""Storing new rows' K and V in the paged cache: one Triton launch per layer, and its reference.

Owns the write of a forward's new K/V rows into one layer's token rows inside the cache's
flat storage (the layout of `specdec.runtime.kv_cache.PagedKVCache`: region `k_offset`
holds [sink_row + 1, Hkv * hd] K rows, region `v_offset` the V rows, the last row a sink).
Both sides take the flat storage itself and element offsets, never a view of it: under
torch.compile a mutation of a view is functionalized into `as_strided_scatter` copies of the
whole storage (hundreds of MB per write on an 8B target), a mutation of the storage is done
in place. Eager PyTorch spends four launches on it (a `where` for the padding rows, two
`index_copy_`, a cast); the kernel does K and V in one, reads the new rows through their
strides (V is a column slice of the fused QKV projection) and casts on store.

Semantics: for every new row r with ``index[r] >= 0``, K row ``index[r]`` = ``k[r]`` and V row
``index[r]`` = ``v[r]`` (cast to the storage dtype); rows with ``index[r] < 0`` (padding)
write nothing a reader sees (the reference sends them to the sink row, the kernel skips
them). Valid indices must be distinct (one forward never writes a cache row twice).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton

__all__ = ["kv_write_torch", "kv_write_triton"]


def kv_write_torch(
    storage: torch.Tensor,  # [total] the cache's flat storage (written)
    k_offset: int,  # element offset of the layer's K region: [sink_row + 1, W] token rows
    v_offset: int,  # element offset of the layer's V region
    sink_row: int,  # the region's last row (padding rows land here; never read)
    k: torch.Tensor,  # [R, W] rows (any strides along R; contiguous within a row), W = Hkv * hd
    v: torch.Tensor,  # [R, W]
    index: torch.Tensor,  # [R] int64 flat token row, -1 = padding
) -> None:
    """Reference: padding rows go to the sink row, then one `index_copy_` per K and V into the
    flat storage itself (not a view of it: under torch.compile a write into a view of the
    storage is functionalized into copies of the whole storage)."""
    W = k.shape[1]
    rows = torch.where(index < 0, sink_row, index)  # [R]
    at = (rows[:, None] * W + torch.arange(W, device=index.device)).reshape(-1)  # [R * W] elements in a region
    storage.index_copy_(0, k_offset + at, k.to(storage.dtype).reshape(-1))
    storage.index_copy_(0, v_offset + at, v.to(storage.dtype).reshape(-1))


@triton.jit
def _kv_write_kernel(
    storage_ptr, k_ptr, v_ptr, index_ptr,
    k_offset, v_offset,  # element offsets of the K and V regions
    sk_r, sv_r,  # row strides of the new K and V
    W, BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    dst = tl.load(index_ptr + r)
    ok = cols < tl.where(dst >= 0, W, 0)  # padding rows (dst < 0) write nothing
    k = tl.load(k_ptr + r * sk_r + cols, mask=ok)
    v = tl.load(v_ptr + r * sv_r + cols, mask=ok)
    at = dst * W + cols
    tl.store(storage_ptr + k_offset + at, k.to(storage_ptr.dtype.element_ty), mask=ok)
    tl.store(storage_ptr + v_offset + at, v.to(storage_ptr.dtype.element_ty), mask=ok)


@triton_op("specdec::kv_write", mutates_args=("storage",))
def kv_write_triton(
    storage: torch.Tensor, k_offset: int, v_offset: int, sink_row: int, k: torch.Tensor, v: torch.Tensor,
    index: torch.Tensor,
) -> None:
    """Kernel launcher, same signature as `kv_write_torch` (padding rows write nothing)."""
    R, W = k.shape
    block = min(1024, triton.next_power_of_2(W))
    wrap_triton(_kv_write_kernel)[(R, triton.cdiv(W, block))](
        storage, k, v, index, k_offset, v_offset, k.stride(0), v.stride(0), W, BLOCK=block
    )
