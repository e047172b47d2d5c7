"""Test helpers: tiny random HF checkpoints of each family, and running our model over the paged cache.

Not a test module (leading underscore). Used by test_models_parity, test_capture and test_loader.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec import SpecConfig
from specdec.runtime.batch import decode_batch, prefill_batch, tree_batch
from specdec.types import TreeMeta

_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=112,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.08,  # larger than HF's default so attention is far from uniform
)

FAMILIES = {
    # Llama 3.1 style: llama3 RoPE scaling with an original context short enough to matter here.
    "llama": dict(
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
        ),
    ),
    # Qwen2.5 style: qkv bias, tied embeddings; layers >= 1 use a sliding window of 8.
    "qwen2": dict(tie_word_embeddings=True, use_sliding_window=True, sliding_window=8, max_window_layers=1),
    # Qwen3: q/k RMSNorm, head_dim decoupled from hidden/heads, attention_bias on (covers o_proj bias).
    "qwen3": dict(head_dim=32, attention_bias=True),
    # Mistral: sliding window on every layer.
    "mistral": dict(sliding_window=8, head_dim=16),
}


def hf_config(family: str, **overrides):
    from transformers import AutoConfig

    kw = {**_COMMON, **FAMILIES[family], **overrides}
    return AutoConfig.for_model(family, **kw)


def make_checkpoint(family: str, folder: Path, *, seed: int = 0, max_shard_size=None, **overrides):
    """Random-init `<Family>ForCausalLM`, saved as safetensors in `folder`. Returns the HF model (eval, fp32)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = hf_config(family, **overrides)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    kw = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(folder), **kw)
    return model


def spec_config(max_batch_size: int = 3, max_seq_len: int = 96, block_size: int = 4, **kw) -> SpecConfig:
    return SpecConfig(max_batch_size=max_batch_size, max_seq_len=max_seq_len, kv_block_size=block_size, **kw)


def _dev(model) -> torch.device:
    return next(model.parameters()).device


def run_prefill(model, cache, prompts: list[list[int]], slots: list[int], *, capture=None):
    """Prefill `prompts` into `slots` (fresh slots). Returns (ModelOutput, q_len [B]) on the model's device."""
    dev = _dev(model)
    T = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), T, dtype=torch.int64)
    for b, p in enumerate(prompts):
        tokens[b, : len(p)] = torch.tensor(p)
        cache.reserve(slots[b], len(p))
    tokens = tokens.to(dev)
    q_len = torch.tensor([len(p) for p in prompts], device=dev)
    batch = prefill_batch(cache, torch.tensor(slots, device=dev), torch.zeros_like(q_len), q_len, T)
    with torch.no_grad():
        out = model(tokens, batch.positions, cache, batch, capture=capture)
    return out, q_len


def run_decode(model, cache, tokens: torch.Tensor, cache_len: torch.Tensor, active: torch.Tensor):
    """One decode step: tokens [B] (row b = slot b). Reserves blocks for active slots."""
    dev = _dev(model)
    for s in range(tokens.shape[0]):
        if bool(active[s]):
            cache.reserve(s, int(cache_len[s]) + 1)
    batch = decode_batch(cache, cache_len.to(dev), active.to(dev))
    with torch.no_grad():
        return model(tokens[:, None].to(dev), batch.positions, cache, batch)


def tree_meta(parents: list[list[int]], N: int) -> TreeMeta:
    """packed_mask and positions from parent lists (plain Python walk); rows past len(parents[b]) are padding."""
    B = len(parents)
    meta = TreeMeta.empty(B, N)
    meta.packed_mask.zero_()
    for b, par in enumerate(parents):
        for i in range(N):
            if i >= len(par):
                meta.packed_mask[b, i, i // 32] |= _bit(i % 32)
                continue
            j, depth = i, 0
            while j >= 0:
                meta.packed_mask[b, i, j // 32] |= _bit(j % 32)
                j = par[j]
                depth += 1
            meta.positions[b, i] = depth - 1
    return meta


def _bit(k: int) -> int:
    return -(1 << 31) if k == 31 else 1 << k  # int32 sign bit


def path_to(parents: list[int], i: int) -> list[int]:
    """Node indices from the root to node i."""
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def run_tree(model, cache, tokens: torch.Tensor, parents: list[list[int]], cache_len: torch.Tensor, *, capture=None):
    """Tree verification forward: tokens [B, N] (row b = slot b), parents per slot (empty = idle)."""
    dev = _dev(model)
    B, N = tokens.shape
    meta = tree_meta(parents, N)
    meta = TreeMeta(*(getattr(meta, f).to(dev) for f in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index")))
    num_nodes = torch.tensor([len(p) for p in parents], device=dev)
    for s in range(B):
        if parents[s]:
            cache.reserve(s, int(cache_len[s]) + N)
    batch = tree_batch(cache, cache_len.to(dev), meta, num_nodes)
    with torch.no_grad():
        return model(tokens.to(dev), batch.positions, cache, batch, capture=capture), num_nodes


def random_parents(gen: torch.Generator, n: int) -> list[int]:
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref| (ours is moved to ref's device)."""
    ours, ref = ours.detach().float().to(ref.device), ref.detach().float()
    return float((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# Our model runs here: on CUDA its attention is the Triton kernel (impl "auto"), on CPU the
# reference; transformers always runs on the CPU.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
