"""verifier="target-only": tree rejection sampling that needs only the target's probabilities.

Exact for distinct children fixed before the draws (top-K drafts); never reads the draft's
probabilities. Probabilities come from `sampling_probs` (temperature -> top-k -> top-p ->
min-p per row), so acceptance, residual and bonus all see the same filtered target; greedy
rows reduce to the greedy walk. The walk is `specdec.ops.verify_target_only`.
"""

from __future__ import annotations

import torch

from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.ops import probs_for, verify_target_only
from specdec.types import Acceptance, TreeMeta

NAME = "target-only"


class TargetOnlyVerifier:
    lossless = True  # emitted tokens follow the target distribution
    needs_draft_probs = False
    greedy_only = False

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling=None,  # SamplingTensors with [B] rows; None = all greedy
        *,
        draft_probs: torch.Tensor | None = None,  # ignored
        uniforms: torch.Tensor | None = None,  # [B, N, 2] float64 in [0, 1); None = fresh torch.rand draws
    ) -> Acceptance:
        probs = probs_for(target_logits, sampling)  # [B, N, V] float32
        return verify_target_only(tokens, tree, probs, uniforms=uniforms)


@strategy_hook(NAME)
def specdec_verify(config):
    return TargetOnlyVerifier()


specdec_strategy_names = declared_names(specdec_verify)
