"""The draft vocabulary: the Vd most frequent training targets, as an injective `d2t` / `t2d` map.

Owns counting target tokens in the distillation data and building the map the way SpecForge
does (`process_token_dict_to_mappings`): take the Vd most frequent target ids (ties: lower id
first; ids never seen fill up the rest, lowest first), sort them ascending as ``used``, then
``d2t[i] = used[i] - i`` (target id = draft id + d2t[draft id]) and ``t2d[j] = j in used``.
Distinct draft ids map to distinct target ids by construction, and the map is checked with
the checkpoint loader's own `validate_vocab_map`. Knows nothing of models.
"""

from __future__ import annotations

import torch

from specdec.drafters.eagle3_checkpoint import validate_vocab_map

__all__ = ["token_counts", "build_vocab_map", "coverage"]


def token_counts(data, vocab_size: int, *, prompt_weight: float = 0.0) -> torch.Tensor:
    """How often each token is a training target, weighted like the loss.

    Response tokens count 1, prompt tokens (except the first, never predicted) `prompt_weight`.

    Args:
        data: `DistillData`.
    Returns:
        [V] float64 counts.
    """
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    lengths = data.lengths
    starts = data.offsets[:-1]
    pos = torch.arange(data.tokens.numel(), dtype=torch.int64) - torch.repeat_interleave(starts, lengths)  # [total]
    prompt = torch.repeat_interleave(data.prompt_lens, lengths)
    weight = torch.where(pos >= prompt, 1.0, torch.where(pos >= 1, float(prompt_weight), 0.0)).to(torch.float64)
    tokens = data.tokens.to(torch.int64)
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"training tokens out of range [0, {vocab_size}): min {int(tokens.min())}, max {int(tokens.max())}")
    counts.index_add_(0, tokens, weight)
    return counts


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary of the `draft_vocab_size` most frequent tokens.

    Args:
        counts: [V] token frequencies.
    Returns:
        d2t: [Vd] int64 (target = draft + d2t[draft]), t2d: [V] bool; checked injective.
    """
    V = counts.shape[0]
    if isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int) or not 1 <= draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size={draft_vocab_size!r} is out of range; allowed: [1, {V}]")
    order = torch.sort(-counts.to(torch.float64), stable=True).indices  # most frequent first, ties by id
    used = order[:draft_vocab_size].sort().values  # [Vd] ascending target ids
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    return validate_vocab_map(d2t, t2d, V, source="build_vocab_map")


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of the (weighted) training targets inside the draft vocabulary."""
    total = float(counts.sum())
    return float(counts[t2d].sum()) / total if total > 0 else 0.0
