"""verifier="greedy": accept a child iff its token is the target's argmax (lossless for greedy decoding).

Every row is decoded greedily whatever its sampling parameters; use verifier="target-only"
or "speculative" for sampled requests. The walk is `specdec.ops.verify_greedy`.
"""

from __future__ import annotations

import torch

from specdec.hookspecs import hookimpl
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


@hookimpl
def specdec_strategy_names():
    return {"verifier": [NAME]}


@hookimpl
def specdec_verify(config):
    return GreedyVerifier() if config.verifier == NAME else None
