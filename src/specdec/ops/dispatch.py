"""Which implementation runs an op: the Triton kernel or its plain-PyTorch reference.

`impl="auto"` picks Triton when the tensors are on CUDA or `TRITON_INTERPRET=1` is set (the
kernels then run in Triton's CPU interpreter), else the reference; "triton" and "ref" force
a side. "ref" is the reference's one name across ops and attention (`runtime.attention`);
"torch" is accepted as an old alias of "ref". This module knows no op.
"""

from __future__ import annotations

import os

import torch

__all__ = ["IMPLS", "use_triton"]

IMPLS = ("auto", "triton", "ref", "torch")  # "torch": alias of "ref"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(impl: str, tensor: torch.Tensor) -> bool:
    """True when `impl` selects the Triton kernel for data living where `tensor` does."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is unknown; allowed: {list(IMPLS[:3])} ('torch' = 'ref')")
    if impl in ("ref", "torch"):
        return False
    runnable = tensor.is_cuda or _interpreting()
    if impl == "triton" and not runnable:
        raise ValueError(
            f"impl='triton' needs CUDA tensors or TRITON_INTERPRET=1, got tensors on {tensor.device}; "
            "use impl='ref' or 'auto'"
        )
    return runnable
