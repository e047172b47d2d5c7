"""Training-time test (TTT, EAGLE-3 paper sec. 3.2): the head unrolled on its own outputs.

Owns the unrolled forward, its attention mask, and the per-step loss and accuracy. The head
is the library's `Eagle3Model` (its own ``forward``; attention comes in through the
``attend`` callback, as in the drafter), so there is one model definition.

Alignment. Sequence x_0..x_{L-1}; h_t = captured target states at position t; p_t = the
target's next-token distribution at t (of x_{t+1}). Row t of step k (k = 0..steps-1):

=============  =========================================  ==========================
               step 0                                     step k > 0
=============  =========================================  ==========================
hidden         fc(h_t)  (``first_step=True``)              the head's output of row t
                                                          at step k-1
token          x_{t+1}                                    x_{t+k+1}
RoPE position  t                                          t + k
predicts       x_{t+2}, soft target p_{t+1}               x_{t+k+2}, soft target p_{t+k+1}
=============  =========================================  ==========================

So step k reproduces draft depth k+1 at inference, where step 0 is the drafter's "ingest"
row (target state + accepted token) and later steps feed the head's own hidden state. Seen
by absolute position a = t + k, step k's input is step k-1's output shifted by one position.

Attention (the EAGLE-3 "diagonal" extension): row t of step k sees the step-0 keys of rows
j <= t (the causal prefix: at inference, the ingested context), and the keys of row t itself
from steps 1..k (its chain of draft ancestors and itself). `ttt_mask` spells that out as a
dense mask (the specification); `ttt_attention` computes it as causal attention over step 0
plus one extra score per earlier step (no [T, k*T] mask).

Loss of step k: soft cross-entropy between the head's draft-vocabulary distribution and the
target's distribution restricted (renormalized) to the draft vocabulary (sharpened by a teacher
temperature below 1, or the target's argmax alone at 0: `teacher_distribution`), on rows whose
predicted token has a loss weight > 0 and whose target argmax is in the draft vocabulary
(others are masked), averaged with those weights; total = sum_k step_weight**k * loss_k
(0.8**k, the paper's / SpecForge's weights). Accuracy of step k: head argmax (as a target
id) == target argmax, over rows whose predicted token is a response token; a target token
outside the draft vocabulary counts as a miss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = [
    "TTTResult", "UnrollLoss", "estimated_accept_length", "growing_attend", "teacher_distribution", "ttt_attention",
    "ttt_attention_ref", "ttt_draft_steps", "ttt_mask", "ttt_unroll",
]


def teacher_distribution(teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The soft target of the unroll's loss: softmax(logits / temperature) in float32.

    1.0 is the target's own distribution (the EAGLE papers' and SpecForge's loss). Greedy
    verification accepts a draft only where it is the target's argmax, so a temperature below 1
    moves the head's capacity from the target's runners-up to its top token; 0 is the one-hot
    argmax of `teacher_logits` (ties to the first index, as ``argmax``).

    Args:
        teacher_logits: [..., V] target logits (over the draft vocabulary or the full one).
        temperature: >= 0.
    Returns:
        [..., V] float32, rows summing to 1.
    """
    if not temperature >= 0:  # also refuses NaN
        raise ValueError(f"teacher temperature {temperature!r} is out of range; allowed: >= 0 (0: the argmax alone)")
    logits = teacher_logits.float()
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits / temperature, dim=-1)  # x / 1.0 is x exactly: temperature 1 is the plain softmax


def ttt_mask(T: int, step: int, device=None) -> torch.Tensor:
    """Which keys a query of TTT step `step` sees (the specification).

    Keys are laid out step by step: column ``s * T + j`` is the key of row j from step s.
    Row t sees column ``s * T + j`` iff (s == 0 and j <= t) or (1 <= s <= step and j == t).

    Returns:
        [T, (step + 1) * T] bool.
    """
    if T < 1 or step < 0:
        raise ValueError(f"ttt_mask needs T >= 1 and step >= 0, got T={T}, step={step}")
    t = torch.arange(T, device=device)
    blocks = [t[None, :] <= t[:, None]]  # step 0: causal
    eye = t[None, :] == t[:, None]
    blocks += [eye] * step  # steps 1..step: the diagonal
    return torch.cat(blocks, dim=1)


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=2)


def ttt_attention_ref(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float) -> torch.Tensor:
    """Dense reference: softmax over all keys of steps 0..k under `ttt_mask`, in >= float32.

    Args:
        q: [B, T, H, hd] queries of step k = len(keys) - 1 (RoPE applied).
        keys, values: one [B, T, Hkv, hd] tensor per step 0..k.
    Returns:
        [B, T, H, hd] in q's dtype.
    """
    B, T, H, hd = q.shape
    g = H // keys[0].shape[2]
    dtype = torch.promote_types(q.dtype, torch.float32)  # float32 math (float64 stays float64)
    k = _expand_kv(torch.cat(keys, dim=1), g).to(dtype)  # [B, (k+1)T, H, hd]
    v = _expand_kv(torch.cat(values, dim=1), g).to(dtype)
    scores = torch.einsum("bthd,bshd->bhts", q.to(dtype), k) * scale
    mask = ttt_mask(T, len(keys) - 1, q.device)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("bhts,bshd->bthd", probs, v).to(q.dtype)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], scale: float) -> torch.Tensor:
    """`ttt_attention_ref` without the dense [T, (k+1)T] mask: causal SDPA for step 0; for
    later steps causal scores over step 0 plus one diagonal score per later step, one softmax.

    Args / Returns: as `ttt_attention_ref`.
    """
    B, T, H, hd = q.shape
    hkv = keys[0].shape[2]
    g = H // hkv
    if len(keys) == 1:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            _expand_kv(keys[0], g).transpose(1, 2),
            _expand_kv(values[0], g).transpose(1, 2),
            is_causal=True,
            scale=scale,
        )
        return out.transpose(1, 2)
    qg = q.reshape(B, T, hkv, g, hd)
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax in float32 (float64 stays float64)
    s0 = torch.einsum("btkgd,bskd->bkgts", qg, keys[0]).to(acc) * scale  # [B, Hkv, G, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    kd = torch.stack(keys[1:], dim=3)  # [B, T, Hkv, k, hd]
    sd = torch.einsum("btkgd,btksd->bkgts", qg, kd).to(acc) * scale  # [B, Hkv, G, T, k]
    probs = torch.softmax(torch.cat([s0, sd], dim=-1), dim=-1).to(values[0].dtype)
    out = torch.einsum("bkgts,bskd->btkgd", probs[..., :T], values[0])
    vd = torch.stack(values[1:], dim=3)  # [B, T, Hkv, k, hd]
    out = out + torch.einsum("bkgts,btksd->btkgd", probs[..., T:], vd)
    return out.reshape(B, T, H, hd).to(q.dtype)


@dataclass
class TTTResult:
    """loss: scalar (with grad); per step k (tensors, no host sync): step_loss [S] (detached),
    correct [S] and count [S] (response rows whose top-1 matched / counted), weight [S] (loss
    weight mass)."""

    loss: torch.Tensor
    step_loss: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor
    weight: torch.Tensor


def growing_attend(attention, scale: float):
    """An ``attend(q, k, v)`` for an unroll: each call (one step) appends its K/V and attends
    with `attention(q, keys, values, scale)` over the steps so far (`ttt_attention`'s mask)."""
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []

    def attend(q, k, v):
        keys.append(k)
        values.append(v)
        return attention(q, keys, values, scale)

    return attend


class UnrollLoss:
    """Per-step bookkeeping of an unroll: total = sum_k step_weight**k * loss_k, and each step's
    loss, top-1 matches on response rows, counted rows and loss weight (tensors, no host sync)."""

    def __init__(self, like: torch.Tensor, step_weight: float):
        self.step_weight = step_weight
        self.total = like.new_zeros((), dtype=torch.float32)
        self.losses, self.correct, self.count, self.mass = [], [], [], []

    def skip(self) -> None:
        """A step with no row to predict (the sequence is too short)."""
        zero = self.total.new_zeros(())
        for acc in (self.losses, self.correct, self.count, self.mass):
            acc.append(zero)

    def add(self, k: int, ce: torch.Tensor, w: torch.Tensor, pred: torch.Tensor, want: torch.Tensor,
            rows: torch.Tensor) -> None:
        """Step k: ce, w [B, n] per-row loss and weight; pred, want [B, n] target ids; rows [B, n] bool."""
        wsum = w.sum()
        loss_k = (ce * w).sum() / wsum.clamp_min(1e-6)
        self.total = self.total + (self.step_weight**k) * loss_k
        self.correct.append(((pred == want) & rows).sum().float())
        self.count.append(rows.sum().float())
        self.losses.append(loss_k.detach())
        self.mass.append(wsum.detach())

    def result(self) -> TTTResult:
        return TTTResult(self.total, torch.stack(self.losses), torch.stack(self.correct), torch.stack(self.count),
                         torch.stack(self.mass))


def _shift_tokens(tokens: torch.Tensor, s: int) -> torch.Tensor:
    """[B, T] -> [B, T] with row t holding tokens[t + s] (0 past the end)."""
    out = torch.zeros_like(tokens)
    if s < tokens.shape[1]:
        out[:, : tokens.shape[1] - s] = tokens[:, s:]
    return out


def ttt_unroll(
    head,
    embed,
    captured: torch.Tensor,
    tokens: torch.Tensor,
    teacher_logits: torch.Tensor,
    teacher_argmax: torch.Tensor,
    weights: torch.Tensor,
    response: torch.Tensor,
    *,
    steps: int = 7,
    step_weight: float = 0.8,
    attention=ttt_attention,
    teacher_temperature: float = 1.0,
) -> TTTResult:
    """Unroll `head` for `steps` TTT steps and return the weighted loss and per-step metrics.

    Args:
        head: `Eagle3Model` (its ``t2d`` / ``target_ids()`` define the draft vocabulary).
        embed: the target's embedding, ``tokens [B, T] -> [B, T, d]``.
        captured: [B, T, n * d_t] captured target states.
        tokens: [B, T] int64 sequences (right-padded).
        teacher_logits: [B, T, Vd] float32 target logits of the draft-vocabulary tokens.
        teacher_argmax: [B, T] int64 target argmax over the full vocabulary.
        weights: [B, T] float32, loss weight of predicting token j (0 for padding and j = 0).
        response: [B, T] bool, token j is a response token (accuracy rows).
        steps: TTT steps (>= 1). step_weight: loss weight ratio between consecutive steps.
        attention: `ttt_attention` or `ttt_attention_ref`.
        teacher_temperature: the soft target's temperature (`teacher_distribution`; 1: the target's own).
    """
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    T = tokens.shape[1]
    target_ids = head.target_ids()  # [Vd]
    in_vocab = head.t2d[teacher_argmax]  # [B, T] target argmax is a draft token
    teacher_p = teacher_distribution(teacher_logits, teacher_temperature)  # [B, T, Vd]
    acc = UnrollLoss(captured, step_weight)
    for k, logits in ttt_draft_steps(head, embed, captured, tokens, steps, attention):
        n = T - k - 2  # rows whose predicted token x_{t+k+2} exists
        if n <= 0:
            acc.skip()
            continue
        w = weights[:, k + 2 : k + 2 + n] * in_vocab[:, k + 1 : k + 1 + n]  # [B, n]
        logp = torch.log_softmax(logits[:, :n].float(), dim=-1)  # [B, n, Vd]
        ce = -(teacher_p[:, k + 1 : k + 1 + n] * logp).sum(-1)  # [B, n]
        with torch.no_grad():
            pred = target_ids[logits[:, :n].argmax(-1)]  # [B, n] target ids
        acc.add(k, ce, w, pred, teacher_argmax[:, k + 1 : k + 1 + n], response[:, k + 2 : k + 2 + n])
    return acc.result()


def ttt_draft_steps(head, embed, captured: torch.Tensor, tokens: torch.Tensor, steps: int, attention=ttt_attention):
    """The unroll's forward: yields (k, logits [B, T, Vd]) for TTT steps k = 0..steps-1, row t of
    step k the head's draft after x_0..x_{t+k+1} (teacher-forced), predicting x_{t+k+2}.
    `ttt_unroll` puts its loss on these; `scripts/head_ranking.py` ranks them."""
    B, T = tokens.shape
    base = torch.arange(T, device=tokens.device)[None].expand(B, T)
    attend = [growing_attend(attention, head.config.head_dim**-0.5) for _ in range(head.config.num_layers)]  # each layer grows its own keys
    hidden = captured
    for k in range(steps):
        emb = embed(_shift_tokens(tokens, k + 1))  # [B, T, d]: x_{t+k+1}
        hidden, logits = head(emb, hidden, base + k, attend, first_step=k == 0)  # [B, T, d], [B, T, Vd]
        yield k, logits


def estimated_accept_length(step_acc: list[float], depth: int = 5) -> float:
    """Rough chain acceptance length from per-step accuracies: 1 + sum_k prod_{j<=k} acc_j."""
    tau, run = 1.0, 1.0
    for a in step_acc[:depth]:
        run *= a
        tau += run
    return tau
