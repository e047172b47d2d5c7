"""Storing new rows' K and V in the paged cache: one Triton launch per layer, and its reference.

Owns the write of a forward's new K/V rows into one layer's flat token rows (the layout of
`specdec.runtime.kv_cache.PagedKVCache`: `k_rows(layer)` / `v_rows(layer)`, [num_tokens + 1,
Hkv, hd], the last row a sink). Eager PyTorch spends four launches on it (a `where` for the
padding rows, two `index_copy_`, a cast); the kernel does K and V in one, reads the new rows
through their strides (V is a column slice of the fused QKV projection) and casts on store.

Semantics: for every new row r with ``index[r] >= 0``, ``k_rows[index[r]] = k[r]`` and
``v_rows[index[r]] = v[r]`` (cast to the cache dtype); rows with ``index[r] < 0`` (padding)
write nothing. Valid indices must be distinct (one forward never writes a cache row twice).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

__all__ = ["kv_write_torch", "kv_write_triton"]


def kv_write_torch(
    k_rows: torch.Tensor,  # [S + 1, Hkv, hd] written
    v_rows: torch.Tensor,  # [S + 1, Hkv, hd] written
    k: torch.Tensor,  # [R, Hkv * hd] rows (any strides along R; contiguous within a row)
    v: torch.Tensor,  # [R, Hkv * hd]
    index: torch.Tensor,  # [R] int64 flat token row, -1 = padding
) -> None:
    """Reference: padding rows go to the sink row (never read), then two `index_copy_`."""
    sink = k_rows.shape[0] - 1
    rows = torch.where(index < 0, sink, index)
    shape = (-1, *k_rows.shape[1:])
    k_rows.index_copy_(0, rows, k.reshape(shape).to(k_rows.dtype))
    v_rows.index_copy_(0, rows, v.reshape(shape).to(v_rows.dtype))


@triton.jit
def _kv_write_kernel(
    k_rows_ptr, v_rows_ptr, k_ptr, v_ptr, index_ptr,
    sk_r, sv_r,  # row strides of the new K and V
    W, BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    dst = tl.load(index_ptr + r)
    ok = cols < tl.where(dst >= 0, W, 0)  # padding rows (dst < 0) write nothing
    k = tl.load(k_ptr + r * sk_r + cols, mask=ok)
    v = tl.load(v_ptr + r * sv_r + cols, mask=ok)
    tl.store(k_rows_ptr + dst * W + cols, k.to(k_rows_ptr.dtype.element_ty), mask=ok)
    tl.store(v_rows_ptr + dst * W + cols, v.to(v_rows_ptr.dtype.element_ty), mask=ok)


@triton_op("specdec::kv_write", mutates_args=("k_rows", "v_rows"))
def kv_write_triton(
    k_rows: torch.Tensor, v_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor
) -> None:
    """Kernel launcher, same signature as `kv_write_torch` (cache rows contiguous)."""
    R, W = k.shape
    block = min(1024, triton.next_power_of_2(W))
    wrap_triton(_kv_write_kernel)[(R, triton.cdiv(W, block))](
        k_rows, v_rows, k, v, index, k.stride(0), v.stride(0), W, BLOCK=block
    )
