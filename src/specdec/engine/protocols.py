"""What the engine asks of its collaborators: the target runner (forwards over a paged KV cache
it owns; `runtime.runner.ModelRunner` is the real one, tests plant small ones) and the
host-side step observers (metrics, tracing, the adaptive rule's log)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from ..strategies import TargetInfo
from ..types import TreeMeta

if TYPE_CHECKING:
    from .engine import SpecEngine

__all__ = ["StepObserver", "TargetRunner"]


class TargetRunner(Protocol):
    """The target side of a step: forwards over a paged KV cache owned by the runner."""

    info: TargetInfo
    cache: object  # what `Strategies.relocate_kv` mutates and a drafter's KV may share
    hidden_width: int  # width of the drafter's target states (0 = none)
    dtype: torch.dtype  # of those states

    def prefill(self, slot: int, tokens: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one prompt chunk `[T] int64` of `slot` at positions start..start+T-1.

        Returns (logits of the chunk's last token [V] float32, drafter states [T, width] or None).
        A runner may also offer `prefill_many(slots, chunks, starts)` (several slots' chunks
        in one forward; `ModelRunner.prefill_many`), which the engine then uses.
        """

    def verify(
        self, tokens: torch.Tensor, tree: TreeMeta, committed_len: torch.Tensor, num_nodes: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run every slot's tree (node i's KV at committed_len + i; slots with num_nodes 0 are idle).

        tokens [B, N] int64, committed_len [B] int64, num_nodes [B] int64; kv_len (python int)
        bounds committed_len + N for every active slot (the keys attention must scan).
        Returns (logits [B, N, V] float32, drafter states [B, N, width] or None).
        """

    def reserve(self, slot: int, num_tokens: int, *, flush: bool = True) -> None:
        """Back positions [0, num_tokens) of `slot` with KV blocks (host side; errors if impossible)."""

    def capacity(self, slot: int) -> int: ...

    def flush(self) -> None:
        """Make reservations visible to the device (asynchronously)."""

    def free(self, slot: int) -> None: ...


class StepObserver(Protocol):
    """Host-side per-step observer (metrics, tracing); runs after the step's hand-off."""

    def on_step(self, engine: "SpecEngine", accept_length: list[int]) -> None: ...
