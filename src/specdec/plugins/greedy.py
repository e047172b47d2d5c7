"""verifier="greedy": accept a child iff its token is the target's argmax (lossless for greedy decoding).

Every row is decoded greedily whatever its sampling parameters; use verifier="target-only"
or "speculative" for sampled requests. The walk is `specdec.ops.verify_greedy`.
"""

from __future__ import annotations

import torch

from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.ops import verify_greedy
from specdec.types import Acceptance, TreeMeta

NAME = "greedy"


class GreedyVerifier:
    lossless = True  # output equals target-only greedy decoding
    needs_draft_probs = False
    greedy_only = True  # the engine refuses requests with temperature > 0 rather than ignore it

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling=None,  # ignored: greedy
        *,
        uniforms: torch.Tensor | None = None,  # ignored: no draws
        draft_probs: torch.Tensor | None = None,  # ignored
    ) -> Acceptance:
        return verify_greedy(tokens, tree, target_logits)


@strategy_hook(NAME)
def specdec_verify(config):
    return GreedyVerifier()


specdec_strategy_names = declared_names(specdec_verify)
