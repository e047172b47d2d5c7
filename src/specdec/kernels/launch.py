"""`wrap_triton` for every torch the library supports, interpreted kernels included.

Kernels launch through `torch.library.wrap_triton` so that torch.compile and CUDA-graph
capture trace them. Under TRITON_INTERPRET=1 (the CPU path: CI, the interpreter tests)
`@triton.jit` makes an `InterpretedFunction`, which torch 2.13 launches as is but torch 2.11
(the GPU machine's) refuses ("wrap_triton only works on functions annotated with triton.jit
or triton.autotune"). An interpreted kernel is never traced (compiled CPU code takes the
references), so it is launched directly here on every version.
"""

from __future__ import annotations

from typing import Any

from torch.library import wrap_triton as _torch_wrap_triton
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

__all__ = ["wrap_triton"]


def _innermost(kernel: Any) -> Any:
    """The function an autotuner (or a chain of them) wraps."""
    while isinstance(kernel, Autotuner):
        kernel = kernel.fn
    return kernel


def wrap_triton(kernel: Any) -> Any:
    """`torch.library.wrap_triton(kernel)` for a compiled (JIT) kernel; the kernel itself when
    Triton's interpreter runs it."""
    if isinstance(_innermost(kernel), JITFunction):
        return _torch_wrap_triton(kernel)
    return kernel
