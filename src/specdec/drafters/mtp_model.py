"""The MTP (multi-token prediction) head as an `nn.Module`, and its frozen config.

Owns the head's math, DeepSeek-V3 / MiMo style:

    x  = input_proj([token_layernorm(embed(t)); hidden_layernorm(h)])   # (or [h; e], MiMo)
    h' = Block(x)                       # one pre-norm decoder layer (attention + SwiGLU MLP)
    logits = lm_head(final_layernorm(h'))

where ``h`` is the target's *last* hidden state (after its final norm) at position p and
``t`` the token at position p + 1, so the logits predict the token at p + 2. In "MTP-Eagle"
mode the one module is applied recursively: the next draft step takes ``h'`` (or its
normalized form, `MTPConfig.feed_normed`) in place of the target's state.

Parameter names are the MiMo ones without the ``model.mtp_layers.{i}.`` prefix
(``token_layernorm``, ``hidden_layernorm``, ``input_proj``, ``self_attn.{q,k,v,o}_proj``,
``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``,
``final_layernorm``, optional ``lm_head``), so ``state_dict()`` *is* specdec's standalone
layout (see `mtp_checkpoint`).

It knows nothing of KV caches or files: the decode path takes attention as a callback
(``attend(q, k, v)``) that the drafter supplies; `sequence_forward` is the plain causal
full-sequence forward a trainer uses. The embedding and (without its own ``lm_head``) the
output head are the target's, passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from specdec.models.config import RopeConfig
from specdec.models.linear import Linear
from specdec.models.llama import RMSNorm
from specdec.models.rope import Rotary

from .draft_attention import causal_attend
from .draft_layers import DraftAttention, SwiGLU, take_rows

__all__ = ["MTPConfig", "MTPModel", "MTPShapeError", "CONCAT_ORDERS", "init_random_"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Head = Callable[[torch.Tensor], torch.Tensor]

CONCAT_ORDERS = ("embed_first", "hidden_first")  # DeepSeek-V3 eh_proj / MiMo input_proj


class MTPShapeError(ValueError):
    """A tensor handed to the head does not have the width the head was built for."""


@dataclass(frozen=True)
class MTPConfig:
    """Shape and options of one MTP module. d = hidden_size (= the target's hidden size).

    concat_order: "embed_first" ([enorm(e); hnorm(h)], DeepSeek-V3) or "hidden_first"
        ([hnorm(h); enorm(e)], MiMo).
    feed_normed: what a recursive (MTP-Eagle) step feeds back: False = the block output h'
        (DeepSeek-V3 paper, TensorRT-LLM), True = final_layernorm(h') (vLLM's MiMo MTP).
    has_final_norm: final_layernorm before the head (without it, logits = head(h')).
    has_lm_head: the module has its own lm_head [V, d]; else the target's head is shared.
    """

    hidden_size: int  # d
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # V
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    qkv_bias: bool = False  # Qwen2 / MiMo: True
    o_bias: bool = False
    qk_norm: bool = False  # Qwen3-style per-head q/k RMSNorm
    concat_order: str = "embed_first"
    feed_normed: bool = False
    has_final_norm: bool = True
    has_lm_head: bool = False

    def __post_init__(self) -> None:
        for name in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "vocab_size", "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MTPConfig.{name}={value!r} must be an int >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"MTPConfig: num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.concat_order not in CONCAT_ORDERS:
            raise ValueError(f"MTPConfig.concat_order={self.concat_order!r} is unknown; allowed: {list(CONCAT_ORDERS)}")
        if not (isinstance(self.rms_norm_eps, float) and 0.0 < self.rms_norm_eps < 1.0):
            raise ValueError(f"MTPConfig.rms_norm_eps={self.rms_norm_eps!r} must be a float in (0, 1)")


class MTPModel(nn.Module):
    """One MTP module. ``state_dict()`` keys are specdec's standalone layout (MiMo names)."""

    def __init__(self, config: MTPConfig):
        super().__init__()
        cfg = self.config = config
        d = cfg.hidden_size
        self.token_layernorm = RMSNorm(d, cfg.rms_norm_eps)  # enorm: embedding path
        self.hidden_layernorm = RMSNorm(d, cfg.rms_norm_eps)  # hnorm: target-state path
        self.input_proj = Linear(2 * d, d, bias=False)  # eh_proj
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(d, d, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                        qkv_bias=cfg.qkv_bias, o_bias=cfg.o_bias, qk_norm=cfg.qk_norm,
                                        eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)
        self.final_layernorm = RMSNorm(d, cfg.rms_norm_eps) if cfg.has_final_norm else None
        self.lm_head = Linear(d, cfg.vocab_size, bias=False) if cfg.has_lm_head else None
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    # ------------------------------------------------------------------ pieces
    def _check(self, embeds: torch.Tensor, hidden: torch.Tensor) -> None:
        d = self.config.hidden_size
        if hidden.shape[-1] != d:
            raise MTPShapeError(
                f"the MTP head reads hidden states of width d={d} (the target's last hidden state or its own "
                f"output), got {hidden.shape[-1]}"
            )
        if embeds.shape[-1] != d:
            raise MTPShapeError(f"embeddings have width {embeds.shape[-1]}; the head's hidden size is {d}")
        if embeds.shape[:-1] != hidden.shape[:-1]:
            raise MTPShapeError(f"embeds {tuple(embeds.shape)} and hidden {tuple(hidden.shape)} must pair row by row")

    def fuse(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[..., d] embeddings of the token at p + 1 and [..., d] states at p -> [..., d]."""
        e, tn, hn = embeds.to(hidden.dtype), self.token_layernorm, self.hidden_layernorm
        if self.config.concat_order == "embed_first":  # both norms and the concatenation in one piece
            pair, _ = tn.fused.norm_cat(e, hidden, tn.weight, hn.weight, tn.eps, hn.eps)
        else:
            pair, _ = tn.fused.norm_cat(hidden, e, hn.weight, tn.weight, hn.eps, tn.eps)
        return self.input_proj(pair)  # [..., d]

    def normed(self, state: torch.Tensor) -> torch.Tensor:
        """The block output h' -> what the head reads (final_layernorm(h'), or h')."""
        return state if self.final_layernorm is None else self.final_layernorm(state)

    def logits(self, state: torch.Tensor, head: Head | None = None) -> torch.Tensor:
        """Block output [..., d] -> logits [..., V] float32 (float64 for a float64 head).

        head: the target's shared output head (or a draft-vocabulary slice of it,
            `mtp_drafter.restricted_head`), used when the module has no ``lm_head``.
        """
        x = self.normed(state)
        if self.lm_head is not None:
            out = self.lm_head(x)
        elif head is None:
            raise ValueError("this MTP head has no lm_head of its own; pass the target's head (head=...)")
        else:
            out = head(x)
        return out.to(torch.promote_types(out.dtype, torch.float32))

    def feedback(self, state: torch.Tensor) -> torch.Tensor:
        """What the next recursive step reads as its hidden input (see `MTPConfig.feed_normed`)."""
        return self.normed(state) if self.config.feed_normed else state

    def block(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The decoder block: [B, T, d] -> [B, T, d] (residual included)."""
        cos, sin = self.rotary(positions, x.dtype)  # [B, T, 1, hd]
        _, qkv = self.input_layernorm.into(self.self_attn.qkv_proj, x)  # the norm fused into qkv where it can be
        h, gate_up = self.post_attention_layernorm.into(self.mlp.gate_up_proj, x,
                                                        self.self_attn.from_qkv(qkv, cos, sin, attend))
        return h + self.mlp.down(gate_up)

    # ------------------------------------------------------------------ forwards
    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        *,
        head: Head | None = None,
        logits_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward (decode path; attention through the drafter's callback).

        Args:
            embeds: [B, T, d] target embeddings of the tokens at p + 1.
            hidden: [B, T, d] the target's last hidden state at p (first step), or the
                `feedback` of the parent row (recursive steps).
            positions: [B, T] int64 RoPE positions (p).
            attend: ``(q [B,T,H,hd], k [B,T,Hkv,hd], v [B,T,Hkv,hd]) -> [B,T,H,hd]``.
            head: the target's output head when the module has no ``lm_head``.
            logits_rows: [B] int64, or None: the logits of row logits_rows[b] only (a prompt
                chunk needs its last row's).
        Returns:
            (feedback [B, T, d] for the next recursive step, logits [B, T, V] float32;
            [B, 1, V] with logits_rows).
        """
        self._check(embeds, hidden)
        state = self.block(self.fuse(embeds, hidden), positions, attend)  # [B, T, d]
        return self.feedback(state), self.logits(state if logits_rows is None else take_rows(state, logits_rows), head)

    def sequence_forward(
        self,
        hidden: torch.Tensor,
        next_embeds: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        head: Head | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-sequence causal forward, as a trainer runs it (differentiable).

        Row p pairs the target's last hidden state at position p with the embedding of the
        token at p + 1; the logits at row p predict the token at p + 2. For k-step (MTP-Eagle)
        training, call again with the returned feedback as `hidden` and embeddings shifted
        by one more position.

        Args:
            hidden: [B, T, d] target last hidden states (after its final norm).
            next_embeds: [B, T, d] embeddings of tokens 1..T (the input shifted by one).
            positions: [B, T] int64 RoPE positions (default 0..T-1).
            head: the target's output head when the module has no ``lm_head``.
        Returns:
            (feedback [B, T, d], logits [B, T, V] float32).
        """
        self._check(next_embeds, hidden)
        B, T, _ = hidden.shape
        if positions is None:
            positions = torch.arange(T, device=hidden.device)[None].expand(B, T)
        attend = causal_attend(self.config.head_dim**-0.5)
        state = self.block(self.fuse(next_embeds, hidden), positions, attend)
        return self.feedback(state), self.logits(state, head)


def init_random_(model: MTPModel, generator: torch.Generator | None = None, std: float = 0.02) -> MTPModel:
    """Random weights in place: normal(0, std) linears, zero biases, unit norms."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model
