"""The EAGLE-3 draft head as an `nn.Module`, and its frozen config.

Owns the head's math: ``fc`` over the captured target states (first draft step only, by an
explicit flag), one decoder layer whose QKV reads ``[input_layernorm(embed); hidden_norm(x)]``
(2d wide) while the residual carries only the hidden path, ``norm``, and ``lm_head`` over the
draft vocabulary with ``d2t`` (target id = draft id + d2t[draft id]). Parameter names are
the official SafeAILab / SpecForge ones, so ``state_dict()`` *is* the official layout.

A head may stack more layers (``num_layers``, the speculators / vLLM convention): the first is
the EAGLE-3 layer above, each later one a plain Llama decoder layer over the first's output
(``later_layers``, saved as ``layers.1.*``, ``layers.2.*``: `eagle3_checkpoint`). Each layer
has its own K/V, so ``attend`` is then one callback per layer.

It knows nothing of KV caches or checkpoints: attention is a callback (``attend(q, k, v)``)
that the drafter supplies, and files are read by `eagle3_checkpoint.py`. Embeddings are the
target's (passed in as ``embeds``) unless the checkpoint carries its own ``embed_tokens``.
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

from .draft_layers import DraftAttention, SwiGLU, take_rows

__all__ = ["Eagle3Config", "Eagle3Model", "Eagle3ShapeError", "random_vocab_map"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Eagle3ShapeError(ValueError):
    """A tensor handed to the head does not have the width the head was built for."""


@dataclass(frozen=True)
class Eagle3Config:
    """Shape and options of one EAGLE-3 head. d = hidden_size, d_t = target_hidden_size.

    capture_layers are target layer *output* indices (specdec's convention, see
    `capture_conventions`), or None when the checkpoint does not say (the default
    (1, L//2-1, L-4) is then used).
    """

    hidden_size: int  # d
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # V: the target vocabulary (t2d length, embedding rows)
    draft_vocab_size: int  # Vd: lm_head rows
    target_hidden_size: int  # d_t: width of one captured state
    num_capture: int = 3  # captured layers concatenated into fc's input
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 2048
    capture_layers: tuple[int, ...] | None = None  # output convention
    fc_bias: bool = False  # fc.bias present (early speculators heads)
    fc_norm: bool = False  # SpecForge: one RMSNorm(d_t) per captured chunk before fc
    norm_before_fc: bool = False  # speculators: one RMSNorm(n * d_t) over the concatenation
    norm_before_residual: bool = False  # speculators: residual = hidden_norm(x) instead of x
    attention_bias: bool = False
    has_embed_tokens: bool = False  # the checkpoint carries its own embedding
    num_layers: int = 1  # draft decoder layers: the EAGLE-3 layer, then num_layers - 1 plain ones

    def __post_init__(self) -> None:
        for name in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size", "num_capture", "num_layers",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Eagle3Config.{name}={value!r} must be an int >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} exceeds the target vocab_size={self.vocab_size}"
            )
        if self.capture_layers is not None:
            layers = tuple(self.capture_layers)
            if len(layers) != self.num_capture:
                raise ValueError(
                    f"capture_layers={layers} has {len(layers)} entries but fc reads num_capture={self.num_capture} "
                    "captured states"
                )
            object.__setattr__(self, "capture_layers", tuple(sorted(layers)))

    @property
    def fc_in_features(self) -> int:
        return self.num_capture * self.target_hidden_size


class Eagle3Layer(nn.Module):
    """The (first) draft decoder layer, official name ``midlayer``: QKV over [embed; hidden]."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # embedding path
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # hidden path
        d = cfg.hidden_size
        self.self_attn = DraftAttention(2 * d, d, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                        qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, embeds, hidden, cos, sin, attend: Attend, final_norm: RMSNorm | None = None):
        """embeds, hidden: [B, T, d] -> the layer output [B, T, d] (fed to the next draft step),
        or with `final_norm` (output, final_norm(output)), the residual add fused with it."""
        ln, hn = self.input_layernorm, self.hidden_norm
        x, normed = ln.fused.norm_cat(embeds, hidden, ln.weight, hn.weight, ln.eps, hn.eps)  # [B, T, 2d], [B, T, d]
        residual = normed if self.norm_before_residual else hidden
        h, gate_up = self.post_attention_layernorm.into(self.mlp.gate_up_proj, residual,
                                                        self.self_attn(x, cos, sin, attend))
        if final_norm is not None:
            return final_norm.add_forward(h, self.mlp.down(gate_up))
        return h + self.mlp.down(gate_up)


class DraftDecoderLayer(nn.Module):
    """A later draft layer (the second and on): a plain Llama decoder layer over the previous
    layer's output, d wide (speculators' ``layers.{i}``, i >= 1)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(d, d, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                        qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)

    def forward(self, x, normed_x, cos, sin, attend: Attend, final_norm: RMSNorm):
        """x [B, T, d] and its input_layernorm(x) (computed by the layer before, fused with its
        residual add) -> (output [B, T, d], final_norm(output)): `final_norm` is the next
        layer's input norm, or the head's norm after the last layer."""
        h, gate_up = self.post_attention_layernorm.into(self.mlp.gate_up_proj, x,
                                                        self.self_attn(normed_x, cos, sin, attend))
        return final_norm.add_forward(h, self.mlp.down(gate_up))


class Eagle3Model(nn.Module):
    """EAGLE-3 head. ``state_dict()`` keys are the official layout (see `eagle3_checkpoint`).

    Buffers: ``d2t`` [Vd] int64 (target id = draft id + d2t[draft id]),
    ``t2d`` [V] bool (target id is in the draft vocabulary).
    """

    def __init__(self, config: Eagle3Config):
        super().__init__()
        cfg = self.config = config
        d = cfg.hidden_size
        self.fc = Linear(cfg.fc_in_features, d, bias=cfg.fc_bias)
        self.fc_norm = (
            nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_capture))
            if cfg.fc_norm
            else None
        )
        self.input_norm = RMSNorm(cfg.fc_in_features, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.midlayer = Eagle3Layer(cfg)
        self.later_layers = nn.ModuleList(DraftDecoderLayer(cfg) for _ in range(cfg.num_layers - 1))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = Linear(d, cfg.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d) if cfg.has_embed_tokens else None
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))  # [Vd]
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool))  # [V]
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    # ------------------------------------------------------------------ pieces
    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (any shape, int64)."""
        return draft_ids + self.d2t[draft_ids]

    def target_ids(self) -> torch.Tensor:
        """[Vd] int64: the target id of every draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, captured: torch.Tensor) -> torch.Tensor:
        """First draft step: captured target states [..., n * d_t] (ascending layers) -> [..., d]."""
        if captured.shape[-1] != self.config.fc_in_features:
            raise Eagle3ShapeError(
                f"first draft step got captured states of width {captured.shape[-1]}; fc expects "
                f"num_capture * target_hidden_size = {self.config.num_capture} * {self.config.target_hidden_size} = "
                f"{self.config.fc_in_features} (is the capture layer set right?)"
            )
        if self.fc_norm is not None:
            chunks = captured.split(self.config.target_hidden_size, dim=-1)
            captured = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        if self.input_norm is not None:
            captured = self.input_norm(captured)
        return self.fc(captured)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-layer output [..., d] -> draft-vocabulary logits [..., Vd] float32 (float64 for a float64 head)."""
        return self._head(self.norm(hidden))

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        """The final norm's output [..., d] -> logits [..., Vd], at least float32."""
        logits = self.lm_head(normed)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        *,
        first_step: bool,
        logits_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft forward.

        Args:
            embeds: [B, T, d] target embeddings of the input tokens (the token at p + 1).
            hidden: [B, T, n * d_t] captured target states when `first_step`, else [B, T, d]
                draft-layer outputs of the parent rows.
            positions: [B, T] int64 RoPE positions (p: the position of the hidden state).
            attend: ``(q [B,T,H,hd], k [B,T,Hkv,hd], v [B,T,Hkv,hd]) -> [B,T,H,hd]``; it stores
                the new K/V and attends over the draft cache. A head of several layers takes a
                sequence of them, one per layer (each layer's K/V are its own).
            first_step: apply fc to `hidden` (an explicit flag; never inferred from widths).
            logits_rows: [B] int64, or None: the logits of row logits_rows[b] only (a prompt
                chunk needs its last row's; the head over every row of a long chunk is ~30% of
                its work and a [B, T, Vd] float32 tensor).
        Returns:
            (next_hidden [B, T, d], logits [B, T, Vd] float32; [B, 1, Vd] with logits_rows).
        """
        d = self.config.hidden_size
        if first_step:
            hidden = self.fuse(hidden)
        elif hidden.shape[-1] != d:
            raise Eagle3ShapeError(
                f"later draft steps take the draft layer's own output of width d={d}, got {hidden.shape[-1]}"
            )
        if embeds.shape[-1] != d:
            raise Eagle3ShapeError(f"embeddings have width {embeds.shape[-1]}; the head's hidden size is {d}")
        attends = self.layer_attends(attend)
        cos, sin = self.rotary(positions, hidden.dtype)  # [B, T, 1, hd]
        # each layer's last residual add runs fused with the norm that reads it next
        norms = [layer.input_layernorm for layer in self.later_layers] + [self.norm]
        out, normed = self.midlayer(embeds.to(hidden.dtype), hidden, cos, sin, attends[0], final_norm=norms[0])
        for layer, attend_i, norm in zip(self.later_layers, attends[1:], norms[1:]):
            out, normed = layer(out, normed, cos, sin, attend_i, final_norm=norm)  # [B, T, d] x2
        return out, self._head(normed if logits_rows is None else take_rows(normed, logits_rows))

    def layer_attends(self, attend) -> tuple[Attend, ...]:
        """One ``attend`` per layer: a single callback for a single-layer head, or a sequence
        of one per layer, checked (a single callback for several layers would mix their K/V)."""
        n = self.config.num_layers
        if callable(attend):
            if n != 1:
                raise TypeError(f"this head has num_layers={n}: pass one attend callback per layer (a sequence of {n}), "
                                "not a single one")
            return (attend,)
        attends = tuple(attend)
        if len(attends) != n or not all(callable(a) for a in attends):
            raise TypeError(f"this head has num_layers={n}: pass {n} attend callbacks, got {len(attends)}")
        return attends


def random_vocab_map(vocab_size: int, draft_vocab_size: int, generator: torch.Generator | None = None):
    """A valid (d2t, t2d) pair like SpecForge builds: Vd distinct target ids, ascending.

    Returns:
        d2t: [Vd] int64 with target = draft + d2t[draft]; t2d: [V] bool.
    """
    if draft_vocab_size == vocab_size:
        used = torch.arange(vocab_size)
    else:
        used = torch.randperm(vocab_size, generator=generator)[:draft_vocab_size].sort().values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def init_random_(model: Eagle3Model, generator: torch.Generator | None = None, std: float = 0.02) -> Eagle3Model:
    """Random weights (normal(0, std) linears, unit norms) and a random vocab map; in place."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in f".{name}" or name.startswith("fc_norm"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        d2t, t2d = random_vocab_map(model.config.vocab_size, model.config.draft_vocab_size, generator)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    return model
