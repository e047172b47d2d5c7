"""drafter="none": propose nothing, so every step is one plain target decode step.

This is the baseline that speedups are measured against, run through the same engine
(prefill, verify-as-sample, stop handling), so the comparison is side by side.
"""

from __future__ import annotations

import torch

from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.types import DraftTree


class NoDrafter:
    """Root-only trees (N = 1): the verifier then just samples the next token."""

    reads = "nothing"
    runs_on_host = False
    samples_drafts = False
    num_tree_slots = 1

    def __init__(self) -> None:
        self._parents = self._num_nodes = None  # [max_B, 1] -1 / [max_B] 1, made by `attach`

    def attach(self, cache) -> None:
        """The root-only tree's parents and sizes, made once for every batch bucket (a step
        slices them: the baseline's step launches nothing for its drafts)."""
        i64 = dict(dtype=torch.int64, device=cache.device)
        self._parents = torch.full((cache.max_batch_size, 1), -1, **i64)
        self._num_nodes = torch.ones(cache.max_batch_size, **i64)

    def prefill(self, slot, next_tokens, hidden, start: int = 0) -> None:
        return None

    def propose(self, state, max_kv_len: int | None = None, draft: bool = True) -> DraftTree:
        root = state.root_tokens  # [B] int64
        batch = root.shape[0]
        if self._parents is not None and batch <= self._parents.shape[0] and self._parents.device == root.device:
            parents, num_nodes = self._parents[:batch], self._num_nodes[:batch]
        else:  # not attached to a cache (used on its own)
            parents = torch.full((batch, 1), -1, dtype=torch.int64, device=root.device)
            num_nodes = torch.ones(batch, dtype=torch.int64, device=root.device)
        # tokens: a view of the roots; the step reads them (verify, verification) before the
        # state advance writes the new roots
        return DraftTree(tokens=root[:, None], parents=parents, num_nodes=num_nodes)  # [B, 1], [B, 1], [B]

    def reset_slot(self, slot: int) -> None:
        return None


@strategy_hook("none")
def specdec_capture_layers(config, target):
    return ()


@strategy_hook("none")
def specdec_draft(config, target):
    return NoDrafter()


specdec_strategy_names = declared_names(specdec_capture_layers, specdec_draft)
