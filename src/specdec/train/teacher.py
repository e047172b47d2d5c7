"""The target's side of training: a dense causal forward over full sequences (no KV cache).

Owns `teacher_forward`: the captured layer outputs (the draft head's input) and the target's
next-token logits restricted to the draft vocabulary plus its full-vocabulary argmax (the
head's training targets), all from ONE forward. It calls the layers of a `DecoderLM`
itself (the same weights and math as `specdec.models.llama`, with PyTorch SDPA instead of the
paged attention), so training needs neither a paged cache nor changes to the model file.
Rows are right-padded: causal attention keeps real tokens from ever seeing padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.models.rope import apply_rotary

__all__ = ["TeacherOutput", "dense_forward", "teacher_forward"]


@dataclass
class TeacherOutput:
    """captured: [B, T, n * d] target layer outputs (ascending layers);
    logits: [B, T, Vd] float32 target logits of the draft vocabulary's tokens (position t
    predicts token t + 1); argmax: [B, T] int64 target argmax over the full vocabulary."""

    captured: torch.Tensor
    logits: torch.Tensor
    argmax: torch.Tensor


def _sdpa(q, k, v, scale: float, window: int | None) -> torch.Tensor:
    """q: [B, H, T, hd], k/v: [B, Hkv, T, hd] -> [B, H, T, hd], causal (and windowed)."""
    T = q.shape[2]
    if k.shape[1] != q.shape[1]:
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    if window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    i = torch.arange(T, device=q.device)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)  # [T, T]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def dense_forward(model, tokens: torch.Tensor, capture_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal forward of whole sequences through a `DecoderLM`'s layers.

    Args:
        model: `specdec.models.DecoderLM`.
        tokens: [B, T] int64 (right padding is harmless: causal attention).
        capture_layers: layer OUTPUT indices to return, ascending.
    Returns:
        captured [B, T, len(layers) * d] (model dtype), last_hidden [B, T, d] after the final norm.
    """
    layers = tuple(capture_layers)
    if list(layers) != sorted(set(layers)) or any(not 0 <= i < len(model.layers) for i in layers):
        raise ValueError(f"capture_layers={layers} must be ascending, distinct and in [0, {len(model.layers)})")
    B, T = tokens.shape
    h = model.embed_tokens(tokens)  # [B, T, d]
    positions = torch.arange(T, device=tokens.device)[None].expand(B, T)
    cos, sin = model.rotary(positions, h.dtype)  # [B, T, 1, hd]
    captured = []
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        H, Hkv, hd = attn.num_heads, attn.num_kv_heads, attn.head_dim
        x = layer.input_layernorm(h)
        q, k, v = attn.qkv_proj(x).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q, k, v = q.view(B, T, H, hd), k.view(B, T, Hkv, hd), v.view(B, T, Hkv, hd)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rotary(q, cos, sin).to(v.dtype), apply_rotary(k, cos, sin).to(v.dtype)  # fp32 RoPE under autocast
        o = _sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn.scale, attn.sliding_window)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(B, T, H * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        if i in layers:
            captured.append(h)
    return torch.cat(captured, dim=-1), model.norm(h)


@torch.no_grad()
def teacher_forward(
    model,
    tokens: torch.Tensor,
    capture_layers: tuple[int, ...],
    draft_target_ids: torch.Tensor,
    *,
    chunk_rows: int = 8192,
) -> TeacherOutput:
    """Captured states and next-token targets of the target for whole sequences.

    Args:
        tokens: [B, T] int64.
        draft_target_ids: [Vd] int64, the target id of every draft id (`Eagle3Model.target_ids()`).
        chunk_rows: rows of the full-vocabulary logits materialized at once.
    """
    captured, last = dense_forward(model, tokens, capture_layers)
    B, T, d = last.shape
    flat = last.reshape(B * T, d)
    w = model.lm_head.weight  # [V, d]
    w_draft = w[draft_target_ids]  # [Vd, d]
    argmax = torch.empty(B * T, dtype=torch.int64, device=tokens.device)
    logits = torch.empty(B * T, draft_target_ids.shape[0], dtype=torch.float32, device=tokens.device)
    for s in range(0, B * T, chunk_rows):
        rows = flat[s : s + chunk_rows]
        argmax[s : s + chunk_rows] = F.linear(rows, w).argmax(-1)
        logits[s : s + chunk_rows] = F.linear(rows, w_draft).float()
    return TeacherOutput(captured, logits.view(B, T, -1), argmax.view(B, T))
