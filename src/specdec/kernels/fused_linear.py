"""The few-row projection kernel (`small_linear`) with the pointwise op before it fused in: a
decoder layer's residual add and RMSNorm before qkv and gate/up (`norm_linear`), SwiGLU's
activation before down (`swiglu_linear`).

Why: at batch 1 a small model's layer is ten launches, four of them GEMVs and three the
pointwise pieces between them (`examples/count_launches.py --kernels --shape smollm2`:
target-only 311 kernels, 120 GEMVs, 60 add+norm, 30 silu*mul). Each piece reads and writes a
few KB: its cost is the launch and the gap, not the bytes. Here every program of the GEMV
recomputes the piece on the few rows it reads anyway (K = 576 or 1536 wide on SmolLM2: a few
KB from L2), so the piece's launch and its round trip through memory are gone: 90 fewer
kernels a SmolLM2 target step, four fewer per draft depth.

Semantics are the unfused pair's, rounding included (each op's result is rounded to the
dtype where the eager op rounds it):
  norm_linear:   h = res + delta;  x = weight_norm * (h.float() * rsqrt(mean(h.float()^2) + eps)).to(dtype)
                 -> (h, x @ W^T + b)   (`rms_norm_linear`: no add, y only)
  swiglu_linear: x = silu(gate) * up over gate_up = [gate | up] -> x @ W^T + b
The GEMV's sums are the small-linear kernel's (float32, its order). The norm's mean is summed in
another order than torch's reduction, so float32 results differ from the unfused pair in the
last bits; bf16 / fp16 ones by a rounding step where a value sits on a boundary.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton
from .rope_kv_write import _INTERPRET, _rounded
from . import small_linear
from .small_linear import small_linear_refusal

__all__ = ["fused_linear_refusal", "norm_linear_torch", "norm_linear_triton", "rms_norm_linear_torch",
           "rms_norm_linear_triton", "swiglu_linear_torch", "swiglu_linear_triton"]


def norm_linear_torch(res: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                      weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: res, delta [M, K], norm_weight [K], weight [N, K], bias [N] or None ->
    (h = res + delta [M, K], rms_norm(h) @ weight^T + bias [M, N]); HF's RMSNorm."""
    h = res + delta
    return h, rms_norm_linear_torch(h, norm_weight, eps, weight, bias)


def rms_norm_linear_torch(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
    """Reference: x [M, K], norm_weight [K] -> rms_norm(x) @ weight^T + bias [M, N] (no add)."""
    xf = x.float()
    normed = norm_weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return torch.nn.functional.linear(normed, weight, bias)


def swiglu_linear_torch(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference: gate_up [M, 2K] = [gate | up], weight [N, K], bias [N] or None ->
    (silu(gate) * up) @ weight^T + bias [M, N]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, weight, bias)


@triton.jit
def _norm_linear_kernel(
    res_ptr, delta_ptr, nw_ptr, h_ptr, w_ptr, b_ptr, y_ptr,  # res, delta, h [M, K]; nw [K]; w [N, K]; b [N]; y [M, N]
    M, N, stride_rm, stride_dm, stride_hm, stride_wn, stride_ym, eps,
    K: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_DELTA: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rows = tl.arange(0, M_PAD)  # [M_PAD]
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    col_ok = cols < N
    row_ok = rows < M
    dtype = y_ptr.dtype.element_ty
    # pass 1: h = res + delta (rounded as the eager add rounds; program 0 stores it) and its sum of squares
    sumsq = tl.zeros((M_PAD,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        ok = row_ok[:, None] & (kk < K)[None, :]
        h = tl.load(res_ptr + rows[:, None] * stride_rm + kk[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_DELTA:
            d = tl.load(delta_ptr + rows[:, None] * stride_dm + kk[None, :], mask=ok, other=0.0).to(tl.float32)
            h = _rounded(h + d, dtype, INTERPRET).to(tl.float32)
            tl.store(h_ptr + rows[:, None] * stride_hm + kk[None, :], h.to(dtype), mask=ok & (pid == 0))
        sumsq += tl.sum(h * h, axis=1)
    rstd = 1.0 / tl.sqrt(sumsq / K + eps)  # [M_PAD]
    # pass 2: x = norm_weight * round(h * rstd), rounded; y = x @ w^T over this program's columns
    w_row = w_ptr + cols.to(tl.int64) * stride_wn  # [BLOCK_N]
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        ok = row_ok[:, None] & k_ok[None, :]
        h = tl.load(res_ptr + rows[:, None] * stride_rm + kk[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_DELTA:
            d = tl.load(delta_ptr + rows[:, None] * stride_dm + kk[None, :], mask=ok, other=0.0).to(tl.float32)
            h = _rounded(h + d, dtype, INTERPRET).to(tl.float32)
        nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)  # [BLOCK_K]
        xn = _rounded(h * rstd[:, None], dtype, INTERPRET).to(tl.float32)
        x = _rounded(xn * nw[None, :], dtype, INTERPRET).to(tl.float32)  # [M_PAD, BLOCK_K]
        w = tl.load(w_row[:, None] + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)  # [M_PAD, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], _rounded(acc, dtype, INTERPRET),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _swiglu_linear_kernel(
    a_ptr, w_ptr, b_ptr, y_ptr,  # a [M, 2K] = [gate | up], w [N, K], b [N], y [M, N]
    M, N, stride_am, stride_wn, stride_ym,
    K: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rows = tl.arange(0, M_PAD)  # [M_PAD]
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    col_ok = cols < N
    row_ok = rows < M
    dtype = y_ptr.dtype.element_ty
    w_row = w_ptr + cols.to(tl.int64) * stride_wn  # [BLOCK_N]
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        ok = row_ok[:, None] & k_ok[None, :]
        g = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :], mask=ok, other=0.0).to(tl.float32)
        u = tl.load(a_ptr + rows[:, None] * stride_am + K + kk[None, :], mask=ok, other=0.0).to(tl.float32)
        s = _rounded(g / (1.0 + tl.exp(-g)), dtype, INTERPRET).to(tl.float32)  # F.silu, rounded
        x = _rounded(s * u, dtype, INTERPRET).to(tl.float32)  # [M_PAD, BLOCK_K]
        w = tl.load(w_row[:, None] + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)  # [M_PAD, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], _rounded(acc, dtype, INTERPRET),
             mask=row_ok[:, None] & col_ok[None, :])


def fused_linear_refusal(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         *others: torch.Tensor | None) -> str | None:
    """Why the fused kernels cannot take these inputs, or None: the small-linear kernel's
    preconditions on (rows [M, K], weight, bias), and every other input (delta, the norm's
    weight) of rows' dtype, contiguous along K."""
    refusal = small_linear_refusal(rows, weight, bias)
    if refusal is not None:
        return refusal
    for t in others:
        if t is not None and (t.dtype != rows.dtype or t.stride(-1) != 1 or t.shape[-1] != rows.shape[-1]):
            return (f"fused_linear: an input of shape {tuple(t.shape)}, dtype {t.dtype}, strides {t.stride()} "
                    f"must match the rows {tuple(rows.shape)} {rows.dtype}, contiguous along K")
    return None


def _launch_norm_linear(res, delta, norm_weight, eps, weight, bias):
    """Checks, then one launch: y [M, N] and, with delta, h = res + delta [M, K] (else None)."""
    if delta is not None and delta.shape != res.shape:
        raise ValueError(f"norm_linear: delta {tuple(delta.shape)} must have res's shape {tuple(res.shape)}")
    if norm_weight.dim() != 1:
        raise ValueError(f"norm_linear: norm_weight must be [K], got {tuple(norm_weight.shape)}")
    refusal = fused_linear_refusal(res, weight, bias, delta, norm_weight)
    if refusal is not None:
        raise ValueError(refusal)
    M, K = res.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=res.device, dtype=res.dtype)
    h = torch.empty_like(res) if delta is not None else None
    cfg = small_linear.launch_config(M, N, K, small_linear._num_sms(res.device))  # the module's: a bench may swap it
    block_n = cfg["BLOCK_N"]
    wrap_triton(_norm_linear_kernel)[(triton.cdiv(N, block_n),)](
        res, res if delta is None else delta, norm_weight, y if h is None else h, weight,
        weight if bias is None else bias, y,
        M, N, res.stride(0), res.stride(0) if delta is None else delta.stride(0), 0 if h is None else h.stride(0),
        weight.stride(0), y.stride(0), float(eps),
        K=K, M_PAD=cfg["M_PAD"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], HAS_DELTA=delta is not None,
        HAS_BIAS=bias is not None, INTERPRET=_INTERPRET, num_warps=cfg["num_warps"],
    )
    return h, y


@triton_op("specdec::norm_linear", mutates_args={})
def norm_linear_triton(res: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                       weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel launcher, same signature as `norm_linear_torch`: res, delta [M, K] (1 <= M <= MAX_ROWS),
    norm_weight [K], weight [N, K], bias [N] or None, one dtype, contiguous along K -> (h [M, K], y [M, N])."""
    return _launch_norm_linear(res, delta, norm_weight, eps, weight, bias)


@triton_op("specdec::rms_norm_linear", mutates_args={})
def rms_norm_linear_triton(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                           bias: torch.Tensor | None) -> torch.Tensor:
    """Kernel launcher, same signature as `rms_norm_linear_torch`: x [M, K] -> y [M, N] (no add)."""
    return _launch_norm_linear(x, None, norm_weight, eps, weight, bias)[1]


@triton_op("specdec::swiglu_linear", mutates_args={})
def swiglu_linear_triton(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Kernel launcher, same signature as `swiglu_linear_torch`: gate_up [M, 2K] (1 <= M <= MAX_ROWS),
    weight [N, K], bias [N] or None, one dtype, contiguous along K -> y [M, N]."""
    if gate_up.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[-1]:
        raise ValueError(f"swiglu_linear: gate_up {tuple(gate_up.shape)} must be [M, 2K] for weight "
                         f"{tuple(weight.shape)} = [N, K]")
    half = gate_up[:, : weight.shape[1]]  # the gate half: its shape, dtype and strides are the checked rows
    refusal = fused_linear_refusal(half, weight, bias)
    if refusal is not None:
        raise ValueError(refusal)
    M, K = half.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=gate_up.device, dtype=gate_up.dtype)
    cfg = small_linear.launch_config(M, N, K, small_linear._num_sms(gate_up.device))
    block_n = cfg["BLOCK_N"]
    wrap_triton(_swiglu_linear_kernel)[(triton.cdiv(N, block_n),)](
        gate_up, weight, weight if bias is None else bias, y, M, N, gate_up.stride(0), weight.stride(0), y.stride(0),
        K=K, M_PAD=cfg["M_PAD"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], HAS_BIAS=bias is not None,
        INTERPRET=_INTERPRET, num_warps=cfg["num_warps"],
    )
    return y
