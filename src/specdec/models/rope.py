"""Rotary position embeddings: inverse frequencies per RoPE type, and applying them.

Owns the frequency formulas (default, linear, Llama-3.1 `llama3`, YaRN), written to give
the same float32 values as transformers' `ROPE_INIT_FUNCTIONS`, and applying them with the
half-rotation convention HF checkpoints use (`rotate_half`, defined once in
`specdec.kernels.rope_kv_write`, which the fused kernel's reference shares). The frequencies
depend only on the config, so the forward is shape-static: cos/sin come from
`positions * inv_freq` each step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels.rope_kv_write import rotate_half
from . import fused
from .config import RopeConfig

__all__ = ["Rotary", "apply_rotary", "rope_inv_freq"]


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and the cos/sin scale for one RoPE config.

    Returns:
        inv_freq: [head_dim // 2] float32.
        attention_scaling: multiplies cos and sin (1.0 except YaRN).
    """
    dim = head_dim
    base = rope.theta
    arange = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu")  # real values even under a meta context
    inv_freq = 1.0 / (base ** (arange.to(torch.float) / dim))  # [hd/2] float32
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim)
    raise ValueError(f"rope_type={rope.rope_type!r} has no frequency formula")


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = float(mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim))
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        orig = rope.original_max_position_embeddings
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").to(torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # share of the unscaled (extrapolated) frequency
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


class Rotary(nn.Module):
    """cos/sin for given positions (`fused.rotary_cos_sin`).

    The frequencies are a non-persistent buffer that stays float32 and is recomputed after
    every `.to()` / `.to_empty()` (so a bf16 model or a meta-initialized one keeps exact
    frequencies).
    """

    fused = fused.EAGER  # `fused.use_compiled` swaps in the compiled pieces

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope, self.rope_head_dim = rope, head_dim
        inv_freq, self.attention_scaling = rope_inv_freq(rope, head_dim)
        device = torch.empty(0).device  # follow a `with torch.device(...)` context, like the parameters
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)  # [hd/2] float32

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        if device.type != "meta":
            self.inv_freq = rope_inv_freq(self.rope, self.rope_head_dim)[0].to(device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [B, T] int64 -> cos, sin: [B, T, 1, hd] in `dtype` (broadcast over heads)."""
        return self.fused.rotary_cos_sin(positions, self.inv_freq, self.attention_scaling, dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, hd]; cos, sin: [B, T, 1, hd] -> [B, T, H, hd]."""
    return x * cos + rotate_half(x) * sin
