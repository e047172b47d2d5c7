"""`MTPDrafter`: MTP-Eagle drafting (one MTP module applied recursively, the `Drafter`
protocol) through the shared draft loop of `head_drafter.HeadDrafter`.

What is MTP's own: ``needs_last_hidden = True``. It reads only the target's last hidden state
(after the final norm), so the capture set is empty and no capture buffer exists. Every row
is the same module, ``h' = Block(input_proj([enorm(embed(t)); hnorm(h)]))``: the first row of
a call reads the target's last hidden state, later draft rows the module's own feedback
state. Logits go through the target's shared output head (or the module's own ``lm_head``)
over the full vocabulary, so there is no draft vocabulary to map.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.config import ConfigError, SpecConfig

from .head_drafter import HeadDrafter
from .mtp_model import MTPModel

__all__ = ["MTPDrafter"]


class MTPDrafter(HeadDrafter):
    """MTP-Eagle drafting, linear chain or EAGLE-2 dynamic tree.

    Args:
        model: the MTP head (`MTPModel`), on the device and dtype to run in.
        config: the engine's `SpecConfig` (B, N, D, K, tree shape, max_seq_len, block size).
        embed: the target's embedding, ``tokens [B, T] int64 -> [B, T, d]``.
        head: the target's output head ``[.., d] -> [.., V]``; None when the module has its
            own ``lm_head``.
        samples_drafts: sample drafts from the head's (tempered) distribution and return
            `draft_probs` (for verifier="speculative"); else argmax / top-K.
        seed: of the draft-sampling generator.

    Attributes (the `Drafter` protocol): needs_hidden_states = False, needs_last_hidden =
    True, samples_drafts, num_tree_slots = N.
    """

    needs_hidden_states = False
    needs_last_hidden = True
    kind = "MTP head"
    hidden_name = "the target's last hidden state"

    def __init__(
        self,
        model: MTPModel,
        config: SpecConfig,
        *,
        embed: Callable[[torch.Tensor], torch.Tensor],
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
        samples_drafts: bool = False,
        seed: int = 0,
    ) -> None:
        mcfg = model.config
        if model.lm_head is None and head is None:
            raise ConfigError("the MTP head has no lm_head of its own; pass the target's output head (head=...)")
        self.head = head
        super().__init__(
            model, config, embed=embed, hidden_size=mcfg.hidden_size, num_kv_heads=mcfg.num_key_value_heads,
            head_dim=mcfg.head_dim, draft_vocab_size=mcfg.vocab_size, hidden_width=mcfg.hidden_size,
            samples_drafts=samples_drafts, seed=seed,
        )

    def _forward(self, embeds, hidden, positions, attend, *, first: bool):
        return self.model(embeds, hidden, positions, attend, head=self.head)
