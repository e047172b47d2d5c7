"""`Eagle3Drafter`: EAGLE-3 drafting (the `Drafter` protocol) through the shared draft loop of
`head_drafter.HeadDrafter`.

What is EAGLE-3's own: the first row of each call (prompt ingest, accepted paths) reads the
captured target layers ([.., n_capture * d_t], fused by the head's ``fc``) and later draft
rows read the draft layer's own output (``first_step``); the head predicts over a draft
vocabulary of Vd ids, mapped to target ids through ``d2t`` (`HeadDrafter`'s ``target_ids``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.config import ConfigError, SpecConfig

from .eagle3_model import Eagle3Model
from .head_drafter import HeadDrafter

__all__ = ["Eagle3Drafter"]


class Eagle3Drafter(HeadDrafter):
    """EAGLE-3 drafting, growing its trees with any tree policy (chain, EAGLE-2, static, sampled).

    Args:
        model: the head (`Eagle3Model`), on the device and dtype to run in.
        config: the engine's `SpecConfig` (B, N, D, K, tree shape, max_seq_len, block size).
        embed: the target's embedding, ``tokens [B, T] int64 -> [B, T, d]``; None when the
            head has its own ``embed_tokens``.
        samples_drafts: return `draft_probs` (for verifiers that need draft probabilities;
            the policy then samples).
        seed: mixed into the keys of the draft-sampling draws.
        policy: the tree policy; None = the built-in one `config.tree` names.

    Capabilities (the `Drafter` protocol): reads = "captured", runs_on_host = False,
    samples_drafts, num_tree_slots = N.
    """

    reads = "captured"  # captured target layers, [.., n_capture * d_t]
    kind = "EAGLE-3 head"
    hidden_name = "the captured target states (num_capture * target_hidden_size)"

    def __init__(
        self,
        model: Eagle3Model,
        config: SpecConfig,
        *,
        embed: Callable[[torch.Tensor], torch.Tensor] | None = None,
        samples_drafts: bool = False,
        seed: int = 0,
        policy=None,
    ) -> None:
        mcfg = model.config
        if embed is None:
            if model.embed_tokens is None:
                raise ConfigError("the EAGLE-3 head has no embed_tokens; pass the target's embedding (embed=...)")
            embed = model.embed_tokens
        super().__init__(
            model, config, embed=embed, hidden_size=mcfg.hidden_size, num_kv_heads=mcfg.num_key_value_heads,
            head_dim=mcfg.head_dim, draft_vocab_size=mcfg.draft_vocab_size, vocab_size=mcfg.vocab_size,
            target_ids=model.target_ids(), hidden_width=mcfg.fc_in_features, samples_drafts=samples_drafts, seed=seed,
            policy=policy, num_layers=mcfg.num_layers,
        )

    def _forward(self, embeds, hidden, positions, attend, *, first: bool, logits_rows=None):
        return self.model(embeds, hidden, positions, attend, first_step=first, logits_rows=logits_rows)
