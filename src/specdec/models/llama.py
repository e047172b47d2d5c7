"""The compact decoder for Llama 2/3/3.1, Mistral, Qwen2/2.5 and Qwen3 over the paged KV cache.

Owns the layer math (RMSNorm, fused QKV with optional bias, per-head q/k RMSNorm, RoPE,
GQA attention through `specdec.runtime.attention`, fused gate/up SiLU MLP), hidden-state
capture calls and the logits head. It never allocates or frees cache blocks and never
reads checkpoints (see `loader.py`). The forward is shape-static: no `.item()`, no Python
branching on tensor values; per-layer choices (window, capture) are static config.
Parameter names follow HF (`layers.{i}.self_attn...`), with q/k/v fused into `qkv_proj`
and gate/up fused into `gate_up_proj`.

Tensor parallelism (`tp`, a `specdec.distributed.TPGroup` of size > 1): each layer holds
its rank's shard (`parallel.ShardLayout`: its query heads and their KV heads, its ffn rows,
its vocabulary rows); o_proj and down_proj all-reduce, the embedding all-reduces its masked
lookup and the head all-gathers the logits, so every rank's hidden states and logits are
identical and everything after the forward runs unchanged. Size 1 builds exactly the
unsharded modules (`nn.Embedding`, `nn.Linear`), with no collective anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..distributed import SINGLE, TPGroup
from ..runtime.attention import AttentionBatch, attention
from ..runtime.kv_cache import PagedKVCache
from . import fused
from .capture import CaptureBuffer, LayerTap
from .linear import Linear, fused_norm_linear, swiglu_down
from .config import ModelConfig
from .parallel import RowParallelLinear, ShardLayout, VocabParallelEmbedding, VocabParallelHead
from .rope import Rotary

__all__ = ["DecoderLM", "ModelOutput", "RMSNorm"]


@dataclass
class ModelOutput:
    """logits: [B, T, V] float32 (or [B, M, V] rows picked by logits_index);
    last_hidden: [B, T, d] after the final norm (what MTP-style drafters read)."""

    logits: torch.Tensor
    last_hidden: torch.Tensor


class RMSNorm(nn.Module):
    """HF-exact RMSNorm: normalize in float32, cast back, then scale (`fused.rms_norm`)."""

    fused = fused.EAGER  # `fused.use_compiled` swaps in the compiled pieces

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta)) in one fused piece."""
        return self.fused.add_rms_norm(x, delta, self.weight, self.eps)

    def into(self, linear: nn.Module, x: torch.Tensor, delta: torch.Tensor | None = None):
        """(h, linear(norm(h))) with h = x + delta (x without delta): the norm and the projection
        that reads it, one kernel where `linear` runs few rows on the small-linear kernels
        (`models.linear.fused_norm_linear`), else the norm piece and the projection."""
        fused_pair = fused_norm_linear(x, delta, self.weight, self.eps, linear)
        if fused_pair is not None:
            return fused_pair
        if delta is None:
            return x, linear(self(x))
        h, normed = self.add_forward(x, delta)
        return h, linear(normed)


class Attention(nn.Module):
    fused = fused.EAGER

    def __init__(self, cfg: ModelConfig, layer: int, shard: ShardLayout, tp: TPGroup = SINGLE):
        super().__init__()
        self.layer = layer
        # this rank's heads (all of them for tp size 1)
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, cfg.head_dim
        self.sliding_window = cfg.sliding_windows[layer]
        self.scale = cfg.head_dim**-0.5
        q, kv = shard.num_heads * cfg.head_dim, shard.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, q + 2 * kv, bias=cfg.qkv_bias)  # column-parallel: local rows
        if tp.size == 1:
            self.o_proj = Linear(q, cfg.hidden_size, bias=cfg.o_bias)
        else:
            self.o_proj = RowParallelLinear(q, cfg.hidden_size, cfg.o_bias, tp)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x, cos, sin, cache: PagedKVCache, batch: AttentionBatch, attn_impl: str,
                rope_impl: str = "auto") -> torch.Tensor:
        """x [B, T, d] (normed) -> the attention block's output [B, T, d] (before the residual add)."""
        return self.attend(self.qkv_proj(x), cos, sin, cache, batch, attn_impl, rope_impl)

    def attend(self, qkv, cos, sin, cache: PagedKVCache, batch: AttentionBatch, attn_impl: str,
               rope_impl: str = "auto") -> torch.Tensor:
        """qkv [B, T, (H + 2 Hkv) hd] (the projection, which the layer may fuse with its norm) ->
        RoPE, the K/V write, attention and o_proj: [B, T, d]."""
        B, T, _ = qkv.shape
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd)  # [B, T, H, hd]
        k = k.view(B, T, Hkv, hd)  # [B, T, Hkv, hd]
        v = v.view(B, T, Hkv, hd)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # RoPE and the new rows' K/V store (before attention), one launch where Triton runs
        q = cache.write_rotated(self.layer, q, k, v, cos, sin, batch.write_index, rotary=self.fused.rotary_qk,
                                impl=rope_impl)
        o = attention(q, cache, self.layer, batch, scale=self.scale, sliding_window=self.sliding_window, impl=attn_impl)
        return self.o_proj(o.reshape(B, T, H * hd))


class MLP(nn.Module):
    fused = fused.EAGER

    def __init__(self, cfg: ModelConfig, shard: ShardLayout, tp: TPGroup = SINGLE):
        super().__init__()
        self.ffn = f = shard.intermediate_size  # this rank's ffn rows of gate and of up
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * f, bias=cfg.mlp_bias)  # column-parallel: [gate; up]
        if tp.size == 1:
            self.down_proj = Linear(f, cfg.hidden_size, bias=cfg.mlp_bias)
        else:
            self.down_proj = RowParallelLinear(f, cfg.hidden_size, cfg.mlp_bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [..., 2f] -> down_proj(silu(gate) * up) [..., d] (`models.linear.swiglu_down`)."""
        return swiglu_down(gate_up, self.down_proj, self.fused)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, shard: ShardLayout, tp: TPGroup = SINGLE):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, shard, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, shard, tp)

    def forward(self, h, delta, cos, sin, cache, batch, attn_impl: str, rope_impl: str = "auto"):
        """h [B, T, d] and delta [B, T, d] (the layer before's last residual add, not yet done; None
        for the first layer) -> (the layer's input h + delta, the residual after attention, the
        MLP's output [B, T, d] each): the MLP's residual add is left to the next layer.

        Each residual add is done with the norm after it and that norm with the projection after
        it (`RMSNorm.into`): one kernel where the few-row kernels run, else the add+norm piece and
        the projection."""
        h, qkv = self.input_layernorm.into(self.self_attn.qkv_proj, h, delta)
        attn_out = self.self_attn.attend(qkv, cos, sin, cache, batch, attn_impl, rope_impl)
        mid, gate_up = self.post_attention_layernorm.into(self.mlp.gate_up_proj, h, attn_out)
        return h, mid, self.mlp.down(gate_up)


class DecoderLM(nn.Module):
    """Decoder-only LM over a `PagedKVCache`.

    Attributes:
        config: the `ModelConfig` (global sizes).
        tp: the `TPGroup` (`SINGLE` unless tensor-parallel).
        shard: the `ShardLayout` of this rank (local heads, ffn rows, vocabulary rows).
        num_kv_heads_per_layer: tuple[int, ...], Hkv of each layer held here (the cache's heads).
        head_dim: hd.
        sliding_window_per_layer: tuple[int | None, ...].
        attn_impl: passed to `specdec.runtime.attention` ("auto", "ref", ...).
        rope_impl: passed to `PagedKVCache.write_rotated` ("auto": RoPE fused into the K/V write
            on CUDA; "triton" forces the fused kernel, also in the interpreter), as the draft
            heads' `rope_impl`.
    """

    def __init__(self, config: ModelConfig, *, attn_impl: str = "auto", tp: TPGroup | None = None):
        super().__init__()
        tp = SINGLE if tp is None else tp
        self.config = config
        self.tp = tp
        self.shard = shard = ShardLayout.of(config, tp.size, tp.rank)
        self.attn_impl = attn_impl
        self.rope_impl = "auto"
        self.num_kv_heads_per_layer = (shard.num_kv_heads,) * config.num_layers
        self.head_dim = config.head_dim
        self.sliding_window_per_layer = tuple(config.sliding_windows)
        d = config.hidden_size
        if tp.size == 1:
            self.embed_tokens = nn.Embedding(config.vocab_size, d)
        else:
            self.embed_tokens = VocabParallelEmbedding(shard, d, tp)
        self.layers = nn.ModuleList(DecoderLayer(config, i, shard, tp) for i in range(config.num_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        if tp.size == 1:
            self.lm_head = Linear(d, config.vocab_size, bias=False)
        else:
            self.lm_head = VocabParallelHead(shard, d, tp)  # gathers: every rank gets [.., V]
        self.rotary = Rotary(config.rope, config.head_dim)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the head when the config ties them (again after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] int64 -> [B, T, d] (the same on every rank; a collective when tensor-parallel)."""
        return self.embed_tokens(tokens)

    @property
    def embed_lookup(self) -> nn.Embedding | None:
        """The embedding as a plain table (`embed` is then one row lookup), or None when it is
        more (tensor-parallel: a sharded lookup and a collective). Draft heads that share the
        target's embeddings read the table inside their own compiled glue."""
        return self.embed_tokens if isinstance(self.embed_tokens, nn.Embedding) else None

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        batch: AttentionBatch,
        *,
        capture: "CaptureBuffer | LayerTap | None" = None,
        logits_index: torch.Tensor | None = None,
    ) -> ModelOutput:
        """One forward over B rows of T tokens (prefill, decode or tree verify).

        Args:
            tokens: [B, T] int64; padding tokens (t >= q_len) may hold any valid id.
            positions: [B, T] int64 RoPE positions (tree node: cache_len + depth).
            cache: written in place for every valid token (batch.write_index).
            batch: attention metadata shared by all layers.
            capture: if given, the captured layers' outputs are stored in it (a buffer: real rows only).
            logits_index: [B, M] int64 token columns to compute logits for (None = all T).
        Returns:
            ModelOutput(logits [B, T or M, V] float32, last_hidden [B, T, d]).
        """
        h = self.embed_tokens(tokens)  # [B, T, d]
        cos, sin = self.rotary(positions, h.dtype)  # [B, T, 1, hd]
        rows = capture.row_index(batch.q_len, tokens.shape[1]) if capture is not None else None  # [B, T]
        delta = None  # [B, T, d]: the last residual add, done by the next norm's kernel
        for i, layer in enumerate(self.layers):
            layer_input, h, delta = layer(h, delta, cos, sin, cache, batch, self.attn_impl, self.rope_impl)
            if capture is not None and i - 1 in capture.column:  # layer i's input is layer i - 1's output
                capture.write(i - 1, layer_input, rows)
        h, last_hidden = self.norm.add_forward(h, delta)  # [B, T, d]: the last layer's output, its final norm
        last = len(self.layers) - 1
        if capture is not None and last in capture.column:
            capture.write(last, h, rows)
        picked = last_hidden
        if logits_index is not None:
            idx = logits_index[..., None].expand(-1, -1, last_hidden.shape[-1])  # [B, M, d]
            picked = torch.gather(last_hidden, 1, idx)
        logits = self.lm_head(picked).float()  # [B, T or M, V] float32
        return ModelOutput(logits=logits, last_hidden=last_hidden)

    def make_cache(self, config, device=None, dtype=None) -> PagedKVCache:
        """A paged cache sized by a `SpecConfig` (B slots, max_seq_len, block size, pool)."""
        p = next(self.parameters())
        return PagedKVCache(
            self.config.num_layers,
            self.num_kv_heads_per_layer,
            self.head_dim,
            max_batch_size=config.cache.max_batch_size,
            max_seq_len=config.cache.max_seq_len,
            block_size=config.cache.kv_block_size,
            num_blocks=config.cache.total_kv_blocks,
            device=p.device if device is None else device,
            dtype=p.dtype if dtype is None else dtype,
        )

    def make_capture(self, config, *, device=None, dtype=None, max_num_tokens=None) -> CaptureBuffer | None:
        """The capture buffer for `config.layers_to_capture`, or None for an empty layer set."""
        p = next(self.parameters())
        return CaptureBuffer.for_config(
            config,
            self.config.num_layers,
            self.config.hidden_size,
            device=p.device if device is None else device,
            dtype=p.dtype if dtype is None else dtype,
            max_num_tokens=max_num_tokens,
        )
