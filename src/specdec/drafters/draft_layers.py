"""The decoder-layer pieces the draft heads share: GQA attention with RoPE whose K/V go to a
caller-supplied ``attend(q, k, v)`` (EAGLE-3 reads [embed; hidden] of width 2d, an MTP
module the fused d), and the SwiGLU MLP. Parameter names are the Hugging Face Llama ones, so
checkpoints load by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specdec.models import fused
from specdec.models.llama import RMSNorm

__all__ = ["DraftAttention", "SwiGLU"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DraftAttention(nn.Module):
    """q/k/v from `in_features` wide rows, optional per-head q/k RMSNorm (Qwen3), RoPE, then
    `attend`; o_proj back to `hidden_size`."""

    fused = fused.EAGER

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(in_features, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(in_features, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(in_features, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x: [B, T, in_features] -> [B, T, hidden_size]; `attend` stores the new K/V and attends."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)  # [B, T, H, hd]
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)  # [B, T, Hkv, hd]
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.fused.rotary_qk(q, k, cos, sin)
        o = attend(q, k, v)  # [B, T, H, hd]
        return self.o_proj(o.reshape(B, T, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    fused = fused.EAGER

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.fused.silu_mul2(self.gate_proj(x), self.up_proj(x)))
