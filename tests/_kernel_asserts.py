"""`tl.device_assert` switched on for interpreted Triton kernels (tests only).

The interpreter builds every kernel with debug off and has no switch for it, so a kernel's asserts
(`tree_attention._load_tile`'s: a maskless tile reads allocated blocks only) never fire on the CPU
unless a test turns them on here. Compiled kernels on the GPU are not affected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os


@contextlib.contextmanager
def interpreter_asserts():
    """Inside the block, interpreted kernels check their `tl.device_assert`s (a failed one raises)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    saved = builder.options
    builder.options = dataclasses.replace(saved, debug=True)
    try:
        yield
    finally:
        builder.options = saved
