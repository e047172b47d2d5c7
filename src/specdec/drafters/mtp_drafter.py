"""`MTPDrafter`: MTP-Eagle drafting (one MTP module applied recursively, the `Drafter`
protocol) through the shared draft loop of `head_drafter.HeadDrafter`.

What is MTP's own: ``reads = "last_hidden"``. It reads only the target's last hidden state
(after the final norm), so the capture set is empty and no capture buffer exists. Every row
is the same module, ``h' = Block(input_proj([enorm(embed(t)); hnorm(h)]))``: the first row of
a call reads the target's last hidden state, later draft rows the module's own feedback
state. Logits go through the target's shared output head (or the module's own ``lm_head``),
over the full vocabulary, or over a draft vocabulary of the Vd most frequent tokens
(``target_ids``; `restricted_head` slices the head's weight to those rows): a step's output
projection then costs Vd / V of the full one, which dominates an MTP step on a small target
(SmolLM2-135M: V = 49152 rows of d = 576, as costly as a quarter of the target's forward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdec.config import ConfigError, SpecConfig

from .head_drafter import HeadDrafter
from .mtp_model import MTPModel

__all__ = ["MTPDrafter", "restricted_head"]


def restricted_head(weight: torch.Tensor, target_ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The output head ``[.., d] -> [.., Vd]`` of the rows `target_ids` ([Vd] int64) of
    `weight` ([V, d]), computed in the weight's dtype."""
    rows = weight.detach()[target_ids.to(weight.device)].contiguous()  # [Vd, d]

    def head(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(rows.dtype), rows)

    return head


class MTPDrafter(HeadDrafter):
    """MTP-Eagle drafting, growing its trees with any tree policy (chain, EAGLE-2, static, sampled).

    Args:
        model: the MTP head (`MTPModel`), on the device and dtype to run in.
        config: the engine's `SpecConfig` (B, N, D, K, tree shape, max_seq_len, block size).
        embed: the target's embedding, ``tokens [B, T] int64 -> [B, T, d]``.
        head: the target's output head ``[.., d] -> [.., V]``, or ``[.., d] -> [.., Vd]`` with
            `target_ids` (`restricted_head`); None when the module has its own ``lm_head``.
        target_ids: [Vd] int64 ascending target ids of a draft vocabulary (`head` must
            then produce their logits), or None for the full vocabulary.
        samples_drafts: return `draft_probs` (for verifiers that need draft probabilities;
            the policy then samples).
        seed: mixed into the keys of the draft-sampling draws.
        policy: the tree policy; None = the built-in one `config.tree` names.

    Capabilities (the `Drafter` protocol): reads = "last_hidden", runs_on_host = False,
    samples_drafts, num_tree_slots = N.
    """

    reads = "last_hidden"
    kind = "MTP head"
    hidden_name = "the target's last hidden state"

    def __init__(
        self,
        model: MTPModel,
        config: SpecConfig,
        *,
        embed: Callable[[torch.Tensor], torch.Tensor],
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
        target_ids: torch.Tensor | None = None,
        samples_drafts: bool = False,
        seed: int = 0,
        policy=None,
    ) -> None:
        mcfg = model.config
        if model.lm_head is None and head is None:
            raise ConfigError("the MTP head has no lm_head of its own; pass the target's output head (head=...)")
        if target_ids is not None and model.lm_head is not None:
            raise ConfigError(
                "a draft vocabulary (target_ids) is for MTP heads that share the target's lm_head; this one has its "
                "own lm_head (use draft_vocab='full')"
            )
        self.head = head
        super().__init__(
            model, config, embed=embed, hidden_size=mcfg.hidden_size, num_kv_heads=mcfg.num_key_value_heads,
            head_dim=mcfg.head_dim, draft_vocab_size=mcfg.vocab_size if target_ids is None else target_ids.numel(),
            vocab_size=mcfg.vocab_size, target_ids=target_ids, hidden_width=mcfg.hidden_size,
            samples_drafts=samples_drafts, seed=seed, policy=policy,
        )

    def _forward(self, embeds, hidden, positions, attend, *, first: bool, logits_rows=None):
        return self.model(embeds, hidden, positions, attend, head=self.head, logits_rows=logits_rows)
