"""y = x W^T (+ b) for a few rows (a decode step, a short chain, a draft depth), one Triton launch
whose programs cover every SM.

Why: at batch 1 a small model's projections are GEMVs of a weight of 0.7-3.5 MB (SmolLM2-135M,
576 wide, 30 layers: qkv, o, gate/up, down), and cuBLAS runs each in ~3.6-4.0 us on an H100
(`notes/gpu/issue20`, the KTIME tables: 120 GEMVs, 0.45 of a target-only step's 0.82 ms of
kernel time), ~15% of the copy bandwidth. Its tiles of 64 output columns give such a weight 9-48
programs on 132 SMs, each streaming 40-200 KB alone. Here each program owns BLOCK_N output
columns of every row, with BLOCK_N chosen from the static sizes so the grid has about one
program per SM or more (`choose_block_n`), and walks K in BLOCK_K slices: x's few rows are read
by every program (a few KB), the weight once in all.

Semantics: ``y[m] = x[m] @ weight.T + bias`` for rows m < M (M <= MAX_ROWS), products and sums in
float32, rounded once to x's dtype, as a cuBLAS bf16 GEMM rounds; x, weight, bias of one dtype
(bfloat16, float16 or float32; float32 has no TF32). The summation order is not cuBLAS's, so in
float32 the two differ in the last bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from .launch import wrap_triton
from .rope_kv_write import _INTERPRET, _rounded

__all__ = ["MAX_ROWS", "SMALL_LINEAR_DTYPES", "choose_block_n", "launch_config", "small_linear_refusal",
           "small_linear_torch", "small_linear_triton", "small_linear_wins"]

MAX_ROWS = 8  # more rows are GEMMs, where cuBLAS's tiles are the right tool
SMALL_LINEAR_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_TILE = 4096  # M_PAD x BLOCK_N x BLOCK_K products per slice (float32 registers: 32 per thread at 4 warps)
_NUM_SMS: dict = {}


def small_linear_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference: x [M, K], weight [N, K], bias [N] or None -> [M, N] (`torch.nn.functional.linear`)."""
    return torch.nn.functional.linear(x, weight, bias)


def _num_sms(device: torch.device) -> int:
    """The device's SM count (132 off CUDA: the H100's, so the interpreter runs the GPU's tiles)."""
    if device.type != "cuda":
        return 132
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _NUM_SMS:
        _NUM_SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _NUM_SMS[index]


def choose_block_n(n: int, num_sms: int) -> int:
    """Output columns per program: the widest of 64, 32, ..., 4 that still gives at least one
    program per SM (a weight of 576 rows on 132 SMs: 4; 3072 rows: 16), else 4."""
    block = 64
    while block > 4 and triton.cdiv(n, block) < num_sms:
        block //= 2
    return block


def launch_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """BLOCK_N, BLOCK_K, M_PAD and warps for an [m, k] x [n, k]^T launch (static sizes only).
    `examples/bench_small_linear.py` sweeps the alternatives; a test may patch this.

    1-2 rows (M_PAD 2): all of K in one slice (up to 1024) and the narrowest tiles that still
    give each SM about four programs, 2 warps: the H100 sweep's best at SmolLM2's shapes
    (`notes/gpu/issue20/small_linear/sweep_configs_abfd635_h100.log`: qkv 2.35 us, o 2.17, gate/up
    4.4, down 3.95, against cuBLAS's 3.45, 3.27, 4.40, 5.11; the first tiles, 4-16 columns by
    128-512 of K at 4 warps, took 3.2, 3.0, 11.1, 5.0). More rows keep those first tiles."""
    m_pad = max(2, triton.next_power_of_2(m))  # two rows at least: a one-row arange is a JIT special case
    if m_pad == 2:
        block_n = 2
        while block_n < 64 and triton.cdiv(n, 2 * block_n) >= 4 * num_sms:
            block_n *= 2
        return dict(M_PAD=2, BLOCK_N=block_n, BLOCK_K=max(32, min(triton.next_power_of_2(k), 1024)), num_warps=2)
    block_n = choose_block_n(n, num_sms)
    block_k = max(32, min(triton.next_power_of_2(k), 512, _TILE // (m_pad * block_n)))
    return dict(M_PAD=m_pad, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4)


def small_linear_wins(m: int, n: int, k: int) -> bool:
    """Whether the few-row kernels beat cuBLAS for an [m, k] x [n, k]^T call, as measured on an
    H100 in bf16 (`notes/gpu/issue20/small_linear/`): 1-2 rows and a weight of at most 2^22
    elements (SmolLM2's layers: 0.33-1.8M). Not at 6 rows (qkv 3.9 against 3.4 us, the first
    tiles 9.6), not for a vocabulary head (49152 x 576: 24-31 against 22.5 us) and not for the
    Llama-3-8B shape's weights (its step went 6.34 -> 7.52 ms with every projection on the kernel)."""
    return 1 <= m <= 2 and n * k <= 1 << 22


@triton.jit
def _small_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,  # x [M, K], weight [N, K], bias [N] (unused without HAS_BIAS), y [M, N]
    M, N, stride_xm, stride_wn, stride_ym,
    K: tl.constexpr,  # a model's width: a few values per model, each its own unrolled loop
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    # program p: output columns [p * BLOCK_N, (p + 1) * BLOCK_N) of every row
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rows = tl.arange(0, M_PAD)  # [M_PAD]
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    col_ok = cols < N
    row_ok = rows < M
    w_row = w_ptr + cols.to(tl.int64) * stride_wn  # [BLOCK_N] row starts (a vocabulary head passes 2^31 elements)
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        w = tl.load(w_row[:, None] + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + kk[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)  # [M_PAD, BLOCK_K]
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)  # [M_PAD, BLOCK_N]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], _rounded(acc, y_ptr.dtype.element_ty, INTERPRET),
             mask=row_ok[:, None] & col_ok[None, :])


def small_linear_refusal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why the kernel cannot take these inputs (the allowed values named), or None when it can:
    the one list of its preconditions, for the launcher's errors and `models.linear`'s choice."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return f"small_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} must be [M, K] and [N, K]"
    if not 1 <= x.shape[0] <= MAX_ROWS:
        return f"small_linear: x has {x.shape[0]} rows; allowed: 1 to MAX_ROWS={MAX_ROWS}"
    if x.dtype not in SMALL_LINEAR_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return (f"small_linear: dtypes x {x.dtype}, weight {weight.dtype}"
                f"{'' if bias is None else f', bias {bias.dtype}'} must be one of {SMALL_LINEAR_DTYPES}")
    if x.stride(1) != 1 or weight.stride(1) != 1 or (bias is not None and bias.stride(0) != 1):
        return f"small_linear: x, weight and bias must be contiguous along K (strides {x.stride()}, {weight.stride()})"
    return None


@triton_op("specdec::small_linear", mutates_args={})  # a custom op: torch.compile calls it, not traces its launcher
def small_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Kernel launcher, same signature as `small_linear_torch`: x [M, K] (1 <= M <= MAX_ROWS),
    weight [N, K], bias [N] or None, one dtype, contiguous along K -> y [M, N] in x's dtype."""
    refusal = small_linear_refusal(x, weight, bias)
    if refusal is not None:
        raise ValueError(refusal)
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    cfg = launch_config(M, N, K, _num_sms(x.device))
    block_n = cfg["BLOCK_N"]
    wrap_triton(_small_linear_kernel)[(triton.cdiv(N, block_n),)](
        x, weight, weight if bias is None else bias, y, M, N, x.stride(0), weight.stride(0), y.stride(0),
        K=K, M_PAD=cfg["M_PAD"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], HAS_BIAS=bias is not None,
        INTERPRET=_INTERPRET, num_warps=cfg["num_warps"],
    )
    return y
