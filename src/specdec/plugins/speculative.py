"""verifier="speculative": standard speculative sampling with the draft's probabilities.

Chains: accept with min(1, p/q), resample from norm(max(p - q, 0)), bonus from p. Trees:
recursive rejection over siblings drawn i.i.d. from their parent's draft row (SpecInfer),
updating the residual after each rejected sibling. Exact when the drafter really sampled
its children from `draft_probs`. The walk is `specdec.ops.verify_speculative`.
"""

from __future__ import annotations

import torch

from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.ops import probs_for, verify_speculative
from specdec.types import Acceptance, TreeMeta

NAME = "speculative"


class SpeculativeVerifier:
    lossless = True  # emitted tokens follow the target distribution
    needs_draft_probs = True
    greedy_only = False

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling=None,  # SamplingTensors with [B] rows; None = all greedy
        *,
        draft_probs: torch.Tensor | None = None,  # [B, N, V], required
        uniforms: torch.Tensor | None = None,  # [B, N, 2] float64 in [0, 1); None = fresh torch.rand draws
    ) -> Acceptance:
        if draft_probs is None:
            raise ValueError("verifier='speculative' needs draft_probs [B, N, V] (a drafter that samples its drafts)")
        probs = probs_for(target_logits, sampling)  # [B, N, V] float32
        return verify_speculative(tokens, tree, probs, draft_probs, uniforms=uniforms)


@strategy_hook(NAME)
def specdec_verify(config):
    return SpeculativeVerifier()


specdec_strategy_names = declared_names(specdec_verify)
