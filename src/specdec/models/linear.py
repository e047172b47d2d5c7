"""`Linear`: the `nn.Linear` of the target's and the draft heads' projections, whose few-row
calls can run `specdec.kernels.small_linear` instead of cuBLAS (`use_small_linear`).

A batch-1 step of a small model is a chain of GEMVs that cuBLAS runs at a fraction of the copy
bandwidth (the kernel module says why); the kernel spreads a weight over every SM. It is a
switch, off by default (`ExecutionConfig.small_linear`), because the win is a GPU measurement:
`examples/bench_small_linear.py` times the two side by side per shape. Parameters, names and
checkpoints are `nn.Linear`'s: the class only chooses the kernel of a call, from static sizes
(where `small_linear_wins`: 1-2 rows, a weight of at most 2^22 elements, as measured on an H100;
a dtype the kernel takes, rows contiguous along K, CUDA or the interpreter), so a captured step
keeps one choice per bucket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.fused_linear import (fused_linear_refusal, norm_linear_triton, rms_norm_linear_triton,
                                     swiglu_linear_triton)
from ..kernels.small_linear import small_linear_refusal, small_linear_triton, small_linear_wins
from ..ops.dispatch import use_triton

__all__ = ["Linear", "fused_norm_linear", "fused_swiglu_linear", "small_rows_linear", "swiglu_down",
           "use_small_linear"]


def _kernel_rows(x: torch.Tensor, weight: torch.Tensor) -> int:
    """x [..., w]'s row count when the few-row kernels win for it against `weight` [N, K]
    (`small_linear_wins`) and may run here (rows contiguous, CUDA or the interpreter), else 0.
    Static sizes only: a captured step keeps one choice per bucket."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not small_linear_wins(rows, weight.shape[0], weight.shape[-1]) or x.stride(-1) != 1 or not use_triton("auto", x):
        return 0
    return rows


def _few_rows(x: torch.Tensor, linear: nn.Module) -> int:
    """`_kernel_rows` for a `Linear` switched to the few-row kernels; 0 for any other module."""
    if not isinstance(linear, Linear) or not linear.small_rows:
        return 0
    return _kernel_rows(x, linear.weight)


def small_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T + bias -> [..., N]: the small-linear kernel where it wins
    (`small_linear_wins`) and takes x, else `F.linear` (more rows, large weights, other dtypes, CPU)."""
    rows = _kernel_rows(x, weight)
    if not rows:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])  # a view for the step's contiguous activations; a copy of a few rows otherwise
    if small_linear_refusal(flat, weight, bias) is not None:  # another dtype, a strided weight: F.linear
        return F.linear(x, weight, bias)
    return small_linear_triton(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])


def fused_norm_linear(res: torch.Tensor, delta: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                      linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(h = res + delta, linear(rms_norm(h))) as one few-row kernel (`kernels.fused_linear`), h [..., K]
    and y [..., N]; delta None: (res, linear(rms_norm(res))). None when the kernel does not take
    these inputs (the caller then runs the norm piece and `linear` apart)."""
    rows = _few_rows(res, linear)
    if not rows:
        return None
    K = res.shape[-1]
    flat = res.reshape(rows, K)
    flat_delta = None if delta is None else delta.reshape(rows, K)
    if fused_linear_refusal(flat, linear.weight, linear.bias, flat_delta, norm_weight) is not None:
        return None
    out_shape = (*res.shape[:-1], linear.weight.shape[0])
    if flat_delta is None:
        return res, rms_norm_linear_triton(flat, norm_weight, eps, linear.weight, linear.bias).view(out_shape)
    h, y = norm_linear_triton(flat, flat_delta, norm_weight, eps, linear.weight, linear.bias)
    return h.view(res.shape), y.view(out_shape)


def fused_swiglu_linear(gate_up: torch.Tensor, linear: nn.Module) -> torch.Tensor | None:
    """linear(silu(gate) * up) over gate_up [..., 2K] = [gate | up] as one few-row kernel, [..., N];
    None when the kernel does not take these inputs."""
    rows = _few_rows(gate_up, linear)
    if not rows:
        return None
    flat = gate_up.reshape(rows, gate_up.shape[-1])
    K = linear.weight.shape[-1]
    if flat.shape[-1] != 2 * K or fused_linear_refusal(flat[:, :K], linear.weight, linear.bias) is not None:
        return None
    return swiglu_linear_triton(flat, linear.weight, linear.bias).view(*gate_up.shape[:-1], linear.weight.shape[0])


def swiglu_down(gate_up: torch.Tensor, down_proj: nn.Module, pieces) -> torch.Tensor:
    """gate_up [..., 2f] -> down_proj(silu(gate) * up) [..., d]: one kernel where down_proj runs few
    rows on the small-linear kernels, else `pieces.silu_mul` (a `models.fused.Pieces`) and down_proj."""
    fused_out = fused_swiglu_linear(gate_up, down_proj)
    return fused_out if fused_out is not None else down_proj(pieces.silu_mul(gate_up))


class Linear(nn.Linear):
    """`nn.Linear` with the few-row kernel as an option: ``small_rows`` (default False, set by
    `use_small_linear`) sends the calls where the kernel wins to `small_rows_linear`."""

    small_rows = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.small_rows:
            return small_rows_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def use_small_linear(root: nn.Module, on: bool = True) -> nn.Module:
    """Switch every `Linear` under `root` to the few-row kernel (or back to cuBLAS); returns `root`."""
    for module in root.modules():
        if isinstance(module, Linear):
            module.small_rows = bool(on)
    return root
