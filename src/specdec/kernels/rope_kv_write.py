"""RoPE on the new rows' queries and keys, fused with the store of their K/V in the paged
cache: one Triton launch per layer where the reference takes three (the rotary piece's two
kernels, q and k, and the K/V write).

Semantics, for every new row r (R rows, H query heads, Hkv KV heads, head dim hd):
``q_out[r] = rope(q[r])`` always; for ``index[r] >= 0``, K row ``index[r]`` = ``rope(k[r])`` and
V row ``index[r]`` = ``v[r]`` (cast to the storage dtype; the rows live in the cache's flat
storage at element offsets, as `specdec.kernels.kv_write` lays them out); rows with
``index[r] < 0`` (padding) write no K/V a reader sees. ``rope(x) = x * cos[r] + rotate_half(x) * sin[r]`` with
``rotate_half(x) = cat(-x[hd/2:], x[:hd/2])``, what HF Llama applies
(`specdec.models.fused.rotary_qk`). The kernel computes in float32 and rounds once per
output, as the compiled rotary piece does; the eager reference rounds after each op, so in
bf16/fp16 the two can differ by an ulp, and in float32 they agree (an FMA aside).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from specdec.kernels.kv_write import kv_write_torch

from .launch import wrap_triton

__all__ = ["rope_kv_write_torch", "rope_kv_write_triton", "rotate_half"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """cat(-x[hd/2:], x[:hd/2]) over the last dim, HF Llama's RoPE convention; the one copy,
    here because kernels never import models (`specdec.models` imports it from here)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_kv_write_torch(
    q_out: torch.Tensor,  # [R, H, hd] written: the rotated queries
    storage: torch.Tensor,  # [total] the cache's flat storage (written), as `kv_write_torch`
    k_offset: int,  # element offset of the layer's K region: [sink_row + 1, Hkv * hd] token rows
    v_offset: int,  # element offset of the layer's V region
    sink_row: int,  # the regions' last row (never read)
    q: torch.Tensor,  # [R, H * hd] (any strides along R; contiguous within a row)
    k: torch.Tensor,  # [R, Hkv * hd]
    v: torch.Tensor,  # [R, Hkv * hd]
    cos: torch.Tensor,  # [R, hd]
    sin: torch.Tensor,  # [R, hd]
    index: torch.Tensor,  # [R] int64 flat token row, -1 = padding
) -> None:
    """Reference: RoPE in the input dtype, op by op, then `kv_write_torch`."""
    R, H, hd = q_out.shape
    c, s = cos[:, None, :], sin[:, None, :]  # [R, 1, hd]
    q3 = q.reshape(R, H, hd)
    k3 = k.reshape(R, -1, hd)
    q_out.copy_(q3 * c + rotate_half(q3) * s)
    kv_write_torch(storage, k_offset, v_offset, sink_row, (k3 * c + rotate_half(k3) * s).reshape(R, -1), v, index)


@triton.jit
def _rounded(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    """float32 -> dtype, to nearest even. Triton's interpreter truncates a float32 -> bf16
    cast: there the bits are rounded first (add half an ulp, ties to even; the cast then cuts
    zeros)."""
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _rope_kv_write_kernel(
    q_out_ptr, storage_ptr, q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, index_ptr,
    k_offset, v_offset,  # element offsets of the K and V regions in the storage
    sq_r, sk_r, sv_r, sc_r, ss_r,  # row strides of q, k, v, cos, sin
    H, Hkv, HALF, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
):
    # program (r, h): row r, head h; h < H rotates query head h, h >= H key/value head h - H
    r = tl.program_id(0)
    h = tl.program_id(1)
    hd = 2 * HALF
    cols = tl.arange(0, BLOCK)
    in_half = cols < HALF
    c1 = tl.load(cos_ptr + r * sc_r + cols, mask=in_half, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + r * sc_r + HALF + cols, mask=in_half, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + r * ss_r + cols, mask=in_half, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + r * ss_r + HALF + cols, mask=in_half, other=0.0).to(tl.float32)
    if h < H:
        q_src = q_ptr + r * sq_r + h * hd
        x1 = tl.load(q_src + cols, mask=in_half, other=0.0).to(tl.float32)
        x2 = tl.load(q_src + HALF + cols, mask=in_half, other=0.0).to(tl.float32)
        q_dst = q_out_ptr + (r * H + h) * hd
        tl.store(q_dst + cols, _rounded(x1 * c1 + (-x2) * s1, q_out_ptr.dtype.element_ty, INTERPRET), mask=in_half)
        tl.store(q_dst + HALF + cols, _rounded(x2 * c2 + x1 * s2, q_out_ptr.dtype.element_ty, INTERPRET), mask=in_half)
    else:
        j = h - H
        row = tl.load(index_ptr + r)
        ok = in_half & (row >= 0)  # padding rows (row < 0) write nothing
        k_src = k_ptr + r * sk_r + j * hd
        y1 = tl.load(k_src + cols, mask=ok, other=0.0).to(tl.float32)
        y2 = tl.load(k_src + HALF + cols, mask=ok, other=0.0).to(tl.float32)
        off = row * Hkv * hd + j * hd  # within a region
        tl.store(storage_ptr + k_offset + off + cols, _rounded(y1 * c1 + (-y2) * s1, storage_ptr.dtype.element_ty, INTERPRET),
                 mask=ok)
        tl.store(storage_ptr + k_offset + off + HALF + cols,
                 _rounded(y2 * c2 + y1 * s2, storage_ptr.dtype.element_ty, INTERPRET), mask=ok)
        vsrc = v_ptr + r * sv_r + j * hd
        v1 = tl.load(vsrc + cols, mask=ok)
        v2 = tl.load(vsrc + HALF + cols, mask=ok)
        tl.store(storage_ptr + v_offset + off + cols, v1.to(storage_ptr.dtype.element_ty), mask=ok)
        tl.store(storage_ptr + v_offset + off + HALF + cols, v2.to(storage_ptr.dtype.element_ty), mask=ok)


@triton_op("specdec::rope_kv_write", mutates_args=("q_out", "storage"))
def rope_kv_write_triton(
    q_out: torch.Tensor, storage: torch.Tensor, k_offset: int, v_offset: int, sink_row: int, q: torch.Tensor,
    k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, index: torch.Tensor,
) -> None:
    """Kernel launcher, same signature as `rope_kv_write_torch` (q_out contiguous; every row of
    q, k, v, cos, sin contiguous within itself; padding rows write no K/V)."""
    R, H, hd = q_out.shape
    Hkv = k.shape[1] // hd
    half = hd // 2
    wrap_triton(_rope_kv_write_kernel)[(R, H + Hkv)](
        q_out, storage, q, k, v, cos, sin, index, k_offset, v_offset,
        q.stride(0), k.stride(0), v.stride(0), cos.stride(0), sin.stride(0),
        H, Hkv, half, BLOCK=triton.next_power_of_2(max(half, 1)), INTERPRET=_INTERPRET,
    )
