"""MTP-Eagle training unroll: one MTP module applied recursively, as the `mtp` drafter runs it.

Owns the target-side forward for MTP training (`mtp_teacher_forward`: the target's LAST hidden
state after its final norm, what the engine hands an MTP drafter, plus its full-vocabulary
next-token logits) and the unrolled forward with its loss and accuracy (`mtp_unroll`).

Alignment (as `ttt.ttt_unroll` for EAGLE-3). Sequence x_0..x_{L-1}; h_t = target last hidden
state at t; p_t = the target's next-token distribution at t (of x_{t+1}). Row t of step k:

=============  =========================================  ==========================
               step 0                                     step k > 0
=============  =========================================  ==========================
hidden         h_t (the target's)                         ``MTPModel.feedback`` of row t
                                                          at step k-1 (block output, or
                                                          its normed form: feed_normed)
token          x_{t+1}                                    x_{t+k+1}
RoPE position  t                                          t + k
predicts       x_{t+2}, soft target p_{t+1}               x_{t+k+2}, soft target p_{t+k+1}
=============  =========================================  ==========================

Step 0 is `MTPModel.sequence_forward` (plain causal attention) and the drafter's ingest row;
step k reproduces draft depth k+1. Attention is the EAGLE-3 TTT mask (`ttt.ttt_attention`):
row t of step k sees the step-0 keys of rows j <= t (the ingested context) and row t's own
keys of steps 1..k (its draft ancestors and itself), exactly what `MTPDrafter` sees.

Loss of step k: soft cross-entropy over the FULL vocabulary (the head shares the target's
lm_head) against p_{t+k+1}, weighted by the loss weight of the predicted token, averaged; or,
with `target_ids` (a draft vocabulary, `TrainConfig.mtp_loss_vocab="draft"`), over those Vd
rows of the lm_head against the teacher's distribution renormalized over them, rows whose
teacher argmax lies outside weighing 0 (how the EAGLE-3 unroll trains its draft vocabulary,
and what the drafter computes when it drafts over a draft vocabulary); total = sum_k
step_weight**k * loss_k (0.8**k). The logits
and their softmax are recomputed in backward (activation checkpointing per step), so only
[B, T, d] states stay alive across steps, not [B, T, V] logits. Accuracy: head argmax ==
target argmax over response rows.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .teacher import dense_forward
from .ttt import TTTResult, UnrollLoss, _shift_tokens, growing_attend, teacher_distribution, ttt_attention

__all__ = ["MTPTeacherOutput", "mtp_draft_states", "mtp_teacher_forward", "mtp_unroll"]


class MTPTeacherOutput:
    """last_hidden: [B, T, d] target last hidden states (after the final norm);
    logits: [B, T, V] target next-token logits (position t predicts t + 1), float32 on the
    CPU, bfloat16 under CUDA autocast (memory); argmax: [B, T] int64."""

    def __init__(self, last_hidden: torch.Tensor, logits: torch.Tensor, argmax: torch.Tensor):
        self.last_hidden, self.logits, self.argmax = last_hidden, logits, argmax


@torch.no_grad()
def mtp_teacher_forward(model, tokens: torch.Tensor, *, chunk_rows: int = 8192,
                        target_ids: torch.Tensor | None = None) -> MTPTeacherOutput:
    """The target's last hidden states and next-token logits for whole sequences (one forward).

    Args:
        model: `specdec.models.DecoderLM`.
        tokens: [B, T] int64 (right-padded).
        chunk_rows: rows of full-vocabulary logits computed at once.
        target_ids: [Vd] int64: return the logits of these tokens only ([B, T, Vd]); the argmax
            is over the full vocabulary either way.
    """
    _, last = dense_forward(model, tokens, (len(model.layers) - 1,))
    B, T, d = last.shape
    flat = last.reshape(B * T, d)
    chunks = [model.lm_head(flat[s : s + chunk_rows]) for s in range(0, B * T, chunk_rows)]
    logits = torch.cat(chunks, 0).view(B, T, -1)  # [B, T, V]
    argmax = logits.argmax(-1)
    if target_ids is not None:
        logits = logits.index_select(-1, target_ids)  # [B, T, Vd]
    return MTPTeacherOutput(last, logits, argmax)


def _soft_ce(model, head, state: torch.Tensor, teacher_p: torch.Tensor) -> torch.Tensor:
    """state [B, n, d], teacher_p [B, n, V] -> [B, n] float32 soft cross-entropy."""
    logits = model.logits(state, head).float()  # [B, n, V]
    return torch.logsumexp(logits, -1) - (teacher_p * logits).sum(-1)


def mtp_draft_states(model, embed, last_hidden: torch.Tensor, tokens: torch.Tensor, steps: int, attention=ttt_attention):
    """The unroll's forward: yields (k, block output [B, T, d]) for steps k = 0..steps-1 (step k
    reads step k-1's `feedback`), row t of step k the draft after x_0..x_{t+k+1}, whose
    ``model.logits`` predict x_{t+k+2}. `mtp_unroll` puts its loss on these; `scripts/head_ranking.py`
    ranks them."""
    B, T = tokens.shape
    base = torch.arange(T, device=tokens.device)[None].expand(B, T)
    attend = growing_attend(attention, model.config.head_dim**-0.5)
    hidden = last_hidden
    for k in range(steps):
        emb = embed(_shift_tokens(tokens, k + 1))  # [B, T, d]: x_{t+k+1}
        model._check(emb, hidden)
        state = model.block(model.fuse(emb, hidden), base + k, attend)  # [B, T, d] block output
        hidden = model.feedback(state)
        yield k, state


def mtp_unroll(
    model,
    embed,
    head,
    last_hidden: torch.Tensor,
    tokens: torch.Tensor,
    teacher_logits: torch.Tensor,
    teacher_argmax: torch.Tensor,
    weights: torch.Tensor,
    response: torch.Tensor,
    *,
    steps: int = 5,
    step_weight: float = 0.8,
    attention=ttt_attention,
    recompute: bool = True,
    target_ids: torch.Tensor | None = None,
    teacher_temperature: float = 1.0,
) -> TTTResult:
    """Unroll the MTP module `steps` times and return the weighted loss and per-step metrics.

    Args:
        model: `MTPModel`.
        embed: the target's embedding, ``tokens [B, T] -> [B, T, d]``.
        head: the target's output head ``[.., d] -> [.., V]`` (None when the module has its own).
        last_hidden: [B, T, d] target last hidden states.
        tokens: [B, T] int64 sequences (right-padded).
        teacher_logits: [B, T, V] target next-token logits.
        teacher_argmax: [B, T] int64.
        weights: [B, T] float32, loss weight of predicting token j.
        response: [B, T] bool, token j is a response token (accuracy rows).
        steps: recursion depth trained (>= 1). step_weight: loss weight ratio between steps.
        attention: `ttt.ttt_attention` or `ttt.ttt_attention_ref`.
        recompute: recompute each step's logits in backward (saves [B, T, V] per step).
        target_ids: [Vd] int64 ascending target ids of a draft vocabulary: `head` then gives
            their logits (`mtp_drafter.restricted_head`) and `teacher_logits` is [B, T, Vd]
            (theirs); `teacher_argmax` stays over the full vocabulary. None: the full vocabulary.
        teacher_temperature: the soft target's temperature (`ttt.teacher_distribution`; 1: the target's own).
    Returns:
        `ttt.TTTResult` (loss, step_loss, correct, count, weight per step).
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    T = tokens.shape[1]
    teacher_p = teacher_distribution(teacher_logits, teacher_temperature)  # [B, T, V] (or [B, T, Vd])
    in_vocab = None
    if target_ids is not None:
        in_vocab = torch.isin(teacher_argmax, target_ids)  # [B, T] the teacher's argmax is a draft token
    acc = UnrollLoss(last_hidden, step_weight)
    for k, state in mtp_draft_states(model, embed, last_hidden, tokens, steps, attention):
        n = T - k - 2  # rows whose predicted token x_{t+k+2} exists
        if n <= 0:
            acc.skip()
            continue
        w = weights[:, k + 2 : k + 2 + n].float()  # [B, n]
        if in_vocab is not None:
            w = w * in_vocab[:, k + 1 : k + 1 + n]
        p = teacher_p[:, k + 1 : k + 1 + n]
        rows = state[:, :n]
        if recompute and torch.is_grad_enabled():
            ce = checkpoint(_soft_ce, model, head, rows, p, use_reentrant=False)
        else:
            ce = _soft_ce(model, head, rows, p)  # [B, n]
        with torch.no_grad():
            pred = model.logits(rows.detach(), head).argmax(-1)  # [B, n]
            if target_ids is not None:
                pred = target_ids[pred]  # target ids
        acc.add(k, ce, w, pred, teacher_argmax[:, k + 1 : k + 1 + n], response[:, k + 2 : k + 2 + n])
    return acc.result()
