"""The decoder-layer pieces the draft heads share: GQA attention with RoPE whose K/V go to a
caller-supplied ``attend(q, k, v)`` (EAGLE-3 reads [embed; hidden] of width 2d, an MTP
module the fused d), the SwiGLU MLP, and `take_rows` (one row of each batch row: a prompt
chunk's head runs on its last row alone).

An ``attend`` that also has ``with_rope(q, k, v, cos, sin, rotary)`` (the drafter's, over
a paged cache) takes the queries and keys before RoPE: the cache rotates them while it
stores K/V, one launch on CUDA (`PagedKVCache.write_rotated`) where the rotary piece and
the K/V write were two, at every draft depth.

Each layer's projections run fused, one matmul where Hugging Face has several (q/k/v in
``qkv_proj``, gate/up in ``gate_up_proj``): a draft step runs these once per draft depth,
so every matmul saved is D launches saved per step (issue 20). Checkpoints keep the Hugging
Face names: ``state_dict()`` splits the fused weights into ``q_proj`` / ``k_proj`` /
``v_proj`` and ``gate_proj`` / ``up_proj``, and ``load_state_dict`` concatenates them back
(`fuse_linear_names`), so checkpoints load and save by name as before."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specdec.models import fused
from specdec.models.linear import Linear, swiglu_down
from specdec.models.llama import RMSNorm

__all__ = ["DraftAttention", "SwiGLU", "fuse_linear_names", "take_rows"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def fuse_linear_names(module: nn.Module, fused_name: str, parts: list[tuple[str, int]]) -> None:
    """Keep the checkpoint names of the linears fused into ``module.<fused_name>``.

    `parts` are (name, output rows) in the fused weight's row order. ``state_dict()`` holds
    ``<name>.weight`` (and ``.bias``) of each part, row slices of the fused tensors, and
    ``load_state_dict`` takes the parts and concatenates them; a checkpoint that lacks some
    part of a tensor is left as it is, so strict loading names the missing keys itself."""
    sizes = [rows for _, rows in parts]

    def split_on_save(mod, state, prefix, local_metadata):
        for kind in ("weight", "bias"):
            key = f"{prefix}{fused_name}.{kind}"
            if key in state:
                whole = state.pop(key)
                for (name, _), piece in zip(parts, whole.split(sizes, dim=0)):
                    state[f"{prefix}{name}.{kind}"] = piece

    def merge_on_load(mod, state, prefix, *args):
        for kind in ("weight", "bias"):
            keys = [f"{prefix}{name}.{kind}" for name, _ in parts]
            if all(k in state for k in keys):
                state[f"{prefix}{fused_name}.{kind}"] = torch.cat([state.pop(k) for k in keys], dim=0)

    module.register_state_dict_post_hook(split_on_save)
    module.register_load_state_dict_pre_hook(merge_on_load)


class DraftAttention(nn.Module):
    """q/k/v from `in_features` wide rows (one fused projection), optional per-head q/k
    RMSNorm (Qwen3), RoPE, then `attend`; o_proj back to `hidden_size`."""

    fused = fused.EAGER

    def __init__(self, in_features: int, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm: bool = False, eps: float = 1e-6):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        q, kv = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = Linear(in_features, q + 2 * kv, bias=qkv_bias)  # rows [q; k; v]
        self.o_proj = Linear(q, hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        fuse_linear_names(self, "qkv_proj", [("q_proj", q), ("k_proj", kv), ("v_proj", kv)])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x: [B, T, in_features] -> [B, T, hidden_size]; `attend` stores the new K/V and attends."""
        return self.from_qkv(self.qkv_proj(x), cos, sin, attend)

    def from_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """qkv [B, T, (H + 2 Hkv) hd] (the projection, which a caller may fuse with its norm) ->
        [B, T, hidden_size]."""
        B, T, _ = qkv.shape
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd)  # [B, T, H, hd]
        k = k.view(B, T, Hkv, hd)  # [B, T, Hkv, hd]
        v = v.view(B, T, Hkv, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        with_rope = getattr(attend, "with_rope", None)
        if with_rope is not None:  # the cache applies RoPE as it stores K/V
            o = with_rope(q, k, v, cos, sin, self.fused.rotary_qk)  # [B, T, H, hd]
        else:
            q, k = self.fused.rotary_qk(q, k, cos, sin)
            o = attend(q, k, v)  # [B, T, H, hd]
        return self.o_proj(o.reshape(B, T, H * hd))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up as one fused projection."""

    fused = fused.EAGER

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)  # rows [gate; up]
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)
        fuse_linear_names(self, "gate_up_proj", [("gate_proj", intermediate_size), ("up_proj", intermediate_size)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [..., 2f] -> down_proj(silu(gate) * up) [..., d] (`models.linear.swiglu_down`)."""
        return swiglu_down(gate_up, self.down_proj, self.fused)


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Row rows[b] of each batch row: x [B, T, w], rows [B] int64 -> [B, 1, w]."""
    return torch.gather(x, 1, rows[:, None, None].expand(-1, 1, x.shape[-1]))
