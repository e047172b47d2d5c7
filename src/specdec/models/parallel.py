"""Megatron-style tensor parallelism of the target: which slice of every weight a rank holds,
and the layers that need a collective.

Owns `ShardLayout` (the checks of `tp_size` against a `ModelConfig`, the local head / ffn /
vocabulary sizes and, per checkpoint tensor, the slice this rank reads), `RowParallelLinear`
(o_proj, down_proj: a partial product, one all-reduce, the bias added once after it),
`VocabParallelEmbedding` (masked lookup + all-reduce) and `VocabParallelHead` (local
logits, one all-gather along the vocabulary). Column-parallel projections (fused
`qkv_proj`, fused `gate_up_proj`) need no collective and stay plain `nn.Linear`s with
fewer rows. It never reads files (`loader.py` does, slice by slice) and never touches the
KV cache (a rank's cache simply has its local KV heads).

The split, for rank r of T ranks:
- `qkv_proj` rows are [q heads; k heads; v heads]: rank r keeps query heads
  [r*H/T, (r+1)*H/T) and the KV heads they read, in the same fused order
  [its q heads; its k heads; its v heads]. With Hkv >= T, KV heads [r*Hkv/T, (r+1)*Hkv/T);
  with Hkv < T (T a multiple of Hkv), one KV head, r*Hkv // T, replicated on the T/Hkv ranks
  whose query heads share it.
- `gate_up_proj` rows are [gate; up]: rank r keeps ffn rows [r*F/T, (r+1)*F/T) of both
  halves, as [its gate rows; its up rows], so the fused SiLU-and-multiply is unchanged.
- `o_proj` / `down_proj` keep the matching input columns; their biases are replicated.
- The vocabulary is padded to T * ceil(V/T) rows: rank r holds token rows [r*Vp, (r+1)*Vp)
  (rows past V are zeros, never looked up, and their logits are dropped after the gather),
  so any vocabulary size runs at any `tp_size`.

Why the logits are gathered (and verification is not done on vocabulary shards): after
one all-gather every rank holds the same full [B, N, V] logits, so the verifiers, tree
building, the draws and the token hand-off run unchanged (the existing kernels, no
sharded softmax / argmax / residual sampling) and identically on every rank. The cost is
one gather of V*N*B logits per step (the model's dtype: 128256 * 61 * 2 bytes = 15.6 MB for
an 8B target's N=60 tree at batch 1, next to ~16 GB of weights read).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import TPGroup
from ..errors import ConfigError
from .config import ModelConfig

__all__ = ["RowParallelLinear", "ShardLayout", "VocabParallelEmbedding", "VocabParallelHead", "allowed_tp_sizes"]


def _problems(config: ModelConfig, tp_size: int) -> list[str]:
    H, Hkv, F_ = config.num_heads, config.num_kv_heads, config.intermediate_size
    out = []
    if H % tp_size:
        out.append(f"num_heads={H} (query heads are split across ranks)")
    if Hkv % tp_size and tp_size % Hkv:
        out.append(f"num_kv_heads={Hkv} (KV heads are split, or replicated when tp_size is a multiple of them)")
    if F_ % tp_size:
        out.append(f"intermediate_size={F_} (the MLP's ffn rows are split)")
    return out


def allowed_tp_sizes(config: ModelConfig) -> list[int]:
    """The tensor-parallel sizes this model splits into (the vocabulary is padded: any size fits it)."""
    return [t for t in range(1, config.num_heads + 1) if not _problems(config, t)]


@dataclass(frozen=True)
class ShardLayout:
    """What rank `rank` of `size` holds of a model with `ModelConfig` `config` (local sizes).

    Attributes:
        num_heads: local query heads (H/T).
        num_kv_heads: local KV heads (Hkv/T, or 1 when replicated).
        kv_head_start: the first global KV head this rank holds.
        total_kv_heads: Hkv of the whole model.
        intermediate_size: local ffn rows (F/T).
        vocab_per_rank: Vp = ceil(V/T), local embedding / head rows (padding included).
        vocab_size: V, the real vocabulary (logits are cut to it after the gather).
    """

    size: int
    rank: int
    head_dim: int
    num_heads: int
    num_kv_heads: int
    kv_head_start: int
    total_kv_heads: int
    intermediate_size: int
    vocab_per_rank: int
    vocab_size: int

    @classmethod
    def of(cls, config: ModelConfig, size: int = 1, rank: int = 0) -> "ShardLayout":
        """Raises `ConfigError` when `size` does not split the heads or the ffn (before any weight loads)."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"tp_size must be an int >= 1, got {size!r}")
        if not 0 <= rank < size:
            raise ConfigError(f"rank={rank} is out of range for tp_size={size}; allowed: [0, {size})")
        bad = _problems(config, size)
        if bad:
            raise ConfigError(
                f"tp_size={size} does not divide {'; '.join(bad)}; allowed tp_size for this "
                f"{config.model_type} model: {allowed_tp_sizes(config)}"
            )
        H, Hkv = config.num_heads, config.num_kv_heads
        kv_local = Hkv // size if Hkv >= size else 1
        kv_start = rank * kv_local if Hkv >= size else rank * Hkv // size
        return cls(
            size=size, rank=rank, head_dim=config.head_dim, num_heads=H // size, num_kv_heads=kv_local,
            kv_head_start=kv_start, total_kv_heads=Hkv, intermediate_size=config.intermediate_size // size,
            vocab_per_rank=-(-config.vocab_size // size), vocab_size=config.vocab_size,
        )

    @property
    def fused_rows(self) -> dict[str, tuple[int, ...]]:
        """Chunk boundaries of the local fused rows: qkv_proj (q, k, v) and gate_up_proj (gate, up)."""
        q, kv, f = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.intermediate_size
        return {"qkv_proj": (0, q, q + kv, q + 2 * kv), "gate_up_proj": (0, f, 2 * f)}

    def source_slice(self, name: str, chunk: int) -> tuple[int, int, int, int] | None:
        """The slice of checkpoint tensor `name` (our parameter name; `chunk` of a fused one, or -1)
        that this rank reads: (dim, start, stop, full length along dim), or None for the whole.

        Always None for size 1 (every rank reads whole tensors, today's path).
        """
        if self.size == 1:
            return None
        hd, r = self.head_dim, self.rank
        if name.endswith(("embed_tokens.weight", "lm_head.weight")):
            V, Vp = self.vocab_size, self.vocab_per_rank
            return 0, min(r * Vp, V), min((r + 1) * Vp, V), V
        q = self.num_heads * hd
        if ".qkv_proj." in name:
            if chunk == 0:
                return 0, r * q, (r + 1) * q, self.size * q
            kv = self.num_kv_heads * hd
            return 0, self.kv_head_start * hd, self.kv_head_start * hd + kv, self.total_kv_heads * hd
        if name.endswith(".o_proj.weight"):
            return 1, r * q, (r + 1) * q, self.size * q
        f = self.intermediate_size
        if ".gate_up_proj." in name:
            return 0, r * f, (r + 1) * f, self.size * f
        if name.endswith(".down_proj.weight"):
            return 1, r * f, (r + 1) * f, self.size * f
        return None  # norms, q/k norms, o_proj / down_proj biases: replicated


class RowParallelLinear(nn.Module):
    """y = all_reduce(x @ W_r^T) + b: the input features are split across ranks.

    weight: [out, in/T] (this rank's columns); bias: [out], replicated and added once after
    the sum. x: [..., in/T] -> [..., out], identical on every rank.
    """

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=in_local**-0.5 / tp.size**0.5)  # filled by the loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))  # [..., out]
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token rows [r*Vp, (r+1)*Vp) on rank r; a token another rank holds looks up zeros here,
    and one all-reduce sums the one real row with zeros (exact: the result equals the
    unsharded lookup bit for bit). tokens: [...] int64 -> [..., d]."""

    def __init__(self, layout: ShardLayout, dim: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.start, self.rows = layout.rank * layout.vocab_per_rank, layout.vocab_per_rank
        self.weight = nn.Parameter(torch.empty(self.rows, dim))
        nn.init.normal_(self.weight)  # filled by the loader

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        inside = (local >= 0) & (local < self.rows)  # [...] bool
        e = F.embedding(torch.where(inside, local, 0), self.weight)  # [..., d]
        return self.tp.all_reduce(e.masked_fill(~inside[..., None], 0))


class VocabParallelHead(nn.Module):
    """Logits over the full vocabulary on every rank: local rows [..., Vp], one all-gather
    along the vocabulary, the padding columns cut. x: [..., d] -> [..., V] (x's dtype)."""

    def __init__(self, layout: ShardLayout, dim: int, tp: TPGroup):
        super().__init__()
        self.tp = tp
        self.vocab_size = layout.vocab_size
        self.weight = nn.Parameter(torch.empty(layout.vocab_per_rank, dim))
        nn.init.normal_(self.weight, std=dim**-0.5)  # filled by the loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        full = self.tp.all_gather_last(F.linear(x, self.weight))  # [..., T * Vp]
        if full.shape[-1] == self.vocab_size:
            return full
        return full[..., : self.vocab_size].contiguous()  # [..., V]
