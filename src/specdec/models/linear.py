"""`Linear`: the `nn.Linear` of the target's and the draft heads' projections, whose few-row
calls can run `specdec.kernels.small_linear` instead of cuBLAS (`use_small_linear`).

A batch-1 step of a small model is a chain of GEMVs that cuBLAS runs at a fraction of the copy
bandwidth (the kernel module says why); the kernel spreads a weight over every SM. It is a
switch, off by default (`ExecutionConfig.small_linear`), because the win is a GPU measurement:
`examples/bench_small_linear.py` times the two side by side per shape. Parameters, names and
checkpoints are `nn.Linear`'s: the class only chooses the kernel of a call, from static sizes
(rows <= `MAX_ROWS`, a dtype the kernel takes, rows contiguous along K, CUDA or the interpreter),
so a captured step keeps one choice per bucket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.small_linear import MAX_ROWS, small_linear_refusal, small_linear_triton
from ..ops.dispatch import use_triton

__all__ = ["Linear", "small_rows_linear", "use_small_linear"]


def small_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T + bias -> [..., N]: the small-linear kernel when x has 1 to
    MAX_ROWS rows that it takes, else `F.linear` (more rows are GEMMs; other dtypes, CPU)."""
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    if not 1 <= rows <= MAX_ROWS or x.stride(-1) != 1 or not use_triton("auto", x):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, K)  # a view for the step's contiguous activations; a copy of a few rows otherwise
    if small_linear_refusal(flat, weight, bias) is not None:  # another dtype, a strided weight: F.linear
        return F.linear(x, weight, bias)
    return small_linear_triton(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """`nn.Linear` with the few-row kernel as an option: ``small_rows`` (default False, set by
    `use_small_linear`) sends calls of at most MAX_ROWS rows to `small_rows_linear`."""

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
