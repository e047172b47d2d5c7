"""drafter="none": propose nothing, so every step is one plain target decode step.

This is the baseline that speedups are measured against, run through the same engine
(prefill, verify-as-sample, stop handling), so the comparison is side by side.
"""

from __future__ import annotations

import torch

from specdec.hookspecs import hookimpl
from specdec.types import DraftTree


class NoDrafter:
    """Root-only trees (N = 1): the verifier then just samples the next token."""

    reads = "nothing"
    runs_on_host = False
    samples_drafts = False
    num_tree_slots = 1

    def prefill(self, slot, next_tokens, hidden, start: int = 0) -> None:
        return None

    def propose(self, inputs) -> DraftTree:
        root = inputs.root_tokens  # [B] int64
        batch = root.shape[0]
        return DraftTree(
            tokens=root[:, None].clone(),  # [B, 1]
            parents=torch.full((batch, 1), -1, dtype=torch.int64, device=root.device),
            num_nodes=torch.ones(batch, dtype=torch.int64, device=root.device),
        )

    def reset_slot(self, slot: int) -> None:
        return None


@hookimpl
def specdec_strategy_names():
    return {"drafter": ["none"]}


@hookimpl
def specdec_capture_layers(config, target):
    return () if config.drafter == "none" else None


@hookimpl
def specdec_draft(config, target):
    return NoDrafter() if config.drafter == "none" else None
