"""torch.compile for one owner: compiled graphs that belong to a decoder, not to the process.

Dynamo keeps a function's compiled graphs, and the count of recompilations that
`torch._dynamo.config.recompile_limit` bounds, on the function's code object. Every
`torch.compile(fn)` of the same `fn` therefore shares them: two decoders of different dtypes
or model sizes in one process add their variants to one list, and with `fullgraph=True` the
ninth variant is a hard `FailOnRecompileLimitHit` (seen on the H200: a bf16 then an fp32
decoder on the same GGUF). `compile_private` compiles a private copy of the function (same
code, globals and closure, a new code object), so each owner (a decoder's model pieces, its
KV cache, its drafter, its step) has its own graphs and its own limit, and they are freed
with it.
"""

from __future__ import annotations

import contextlib
import types
from typing import Callable

import torch

__all__ = ["PIECE_OPTIONS", "compile_private", "inductor_options", "private_copy"]

_INDUCTOR_OPTIONS: dict = {}  # what `inductor_options` sets for the compiles inside its block
# Every piece: Inductor fuses two kernels that share an input only when the shared bytes reach
# `score_fusion_memory_threshold` (10); a batch-1 graph's [1]-row inputs are 1-8 bytes, so its
# small kernels stayed apart where the same piece's batch >= 2 graph fuses them (a depth's inputs
# 6 -> 4 kernels, the state advance 5 -> 2; `examples/count_launches.py --kernels`).
PIECE_OPTIONS = {"score_fusion_memory_threshold": 1}


def private_copy(fn: Callable) -> Callable:
    """A new function object running `fn`'s code through a new code object (dynamo caches
    per code object, so compiling the copy shares nothing with other copies)."""
    code = fn.__code__.replace()  # an equal, distinct code object
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__, copy.__module__, copy.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    return copy


def compile_private(fn: Callable, **options) -> Callable:
    """`torch.compile(private_copy(fn), **options)`: graphs and recompile count of its own, with
    `PIECE_OPTIONS` and the Inductor options of the enclosing `inductor_options` block (if any)."""
    options = dict(options, options={**PIECE_OPTIONS, **_INDUCTOR_OPTIONS, **options.get("options", {})})
    return torch.compile(private_copy(fn), **options)


@contextlib.contextmanager
def inductor_options(**options):
    """Inductor options (`torch.compile(options=...)`, e.g. ``combo_kernels=True``) for every
    `compile_private` called inside the block: a decoder builds its compiled pieces inside one
    (`ExecutionConfig.combo_kernels`). torch.compile keeps the options it was given, so the
    pieces keep them after the block."""
    saved = dict(_INDUCTOR_OPTIONS)
    _INDUCTOR_OPTIONS.update(options)
    try:
        yield
    finally:
        _INDUCTOR_OPTIONS.clear()
        _INDUCTOR_OPTIONS.update(saved)
