"""Test helpers for MTP / n-gram / typical: tiny MTP heads, constructed targets, references.

Not a test module (leading underscore). Used by tests/drafters/test_mtp_*.py, test_ngram*.py and
test_typical*.py.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from specdec.drafters.mtp_model import MTPConfig, MTPModel, init_random_
from specdec.models.config import RopeConfig

V, D = 96, 64  # vocabulary and hidden size of `_tiny_models`' checkpoints


@pytest.fixture
def e2e_cpu(monkeypatch):
    """End-to-end runs on CPU: the ops' torch references instead of the interpreted Triton
    kernels (those are compared with the references in their own tests; interpreted, one
    generate of 40 requests measured 7.5 s against 0.26 s), on one intra-op thread (tiny
    matmuls: 2 threads on a loaded 2-core box measured ~16x slower). On CUDA nothing changes."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def mtp_config(**kw) -> MTPConfig:
    base = dict(
        hidden_size=D,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=V,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0),
    )
    base.update(kw)
    return MTPConfig(**base)


def random_mtp(seed: int = 0, *, dtype=torch.float32, std: float = 0.2, **kw) -> MTPModel:
    """A random MTP head whose logits are far from uniform (std large for a tiny d)."""
    gen = torch.Generator().manual_seed(seed)
    return init_random_(MTPModel(mtp_config(**kw)), gen, std=std).to(dtype).eval()


def hf_greedy(hf_model, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy `generate` of `n` new tokens (no EOS stop)."""
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt):].tolist()


def make_bigram_checkpoint(folder: Path, *, seed: int = 0, vocab_size: int = V, initializer_range: float = 1.0, **overrides):
    """A real Llama checkpoint whose next token depends on the current token only.

    Every layer's o_proj and down_proj are zero, so each layer adds nothing and the last
    hidden state is norm(embed(t)): logits = lm_head(norm(embed(t))). Its greedy
    continuation from any token follows a fixed map, which soon cycles (a functional graph).
    A large `initializer_range` makes its distributions peaked (top-1 near 1), so score-ranked
    draft trees keep the oracle's whole path. Returns the HF model (eval, float32).
    """
    from _tiny_models import make_checkpoint

    model = make_checkpoint(
        "llama", folder, seed=seed, vocab_size=vocab_size, initializer_range=initializer_range, **overrides
    )
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(str(folder))
    return model


def bigram_oracle_mtp(d: int = D, vocab_size: int = V, eps: float = 1e-5) -> MTPModel:
    """An MTP head that predicts a bigram target (`make_bigram_checkpoint`) exactly.

    input_proj = [I, 0] keeps only token_layernorm(embed(t_{p+1})); the block adds nothing
    (o_proj = down_proj = 0), so logits = lm_head(norm(norm(embed(t)))) = the target's logits
    at t (RMSNorm is idempotent up to eps): the token after t_{p+1}, i.e. at p + 2. The
    recursion feeds the block output back, which the next step ignores the same way.
    """
    model = MTPModel(mtp_config(hidden_size=d, vocab_size=vocab_size, rms_norm_eps=eps, intermediate_size=16))
    init_random_(model, torch.Generator().manual_seed(3), std=0.1)
    with torch.no_grad():
        model.input_proj.weight.zero_()
        model.input_proj.weight[:, :d] = torch.eye(d)
        model.self_attn.o_proj.weight.zero_()
        model.mlp.down_proj.weight.zero_()
    return model.eval()


def tv_bound(truth: dict[tuple[int, ...], float], n: int, delta: float = 1e-6) -> float:
    """A bound that TV(empirical of n i.i.d. draws from `truth`, truth) exceeds with probability < delta.

    E[TV] = 0.5 * sum_i E|p^_i - p_i| <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n) (Jensen), and TV
    moves by at most 1/n when one draw changes, so McDiarmid gives
    P(TV > E[TV] + t) <= exp(-2 n t^2), i.e. t = sqrt(ln(1/delta) / (2n)).
    """
    mean = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in truth.values())
    return mean + math.sqrt(math.log(1 / delta) / (2 * n))


def exact_joint(hf_model, prompt: list[int], steps: int, temperature: float = 1.0) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first `steps` tokens sampled from the target (by enumeration)."""
    probs = {(): 1.0}
    for _ in range(steps):
        prefixes = list(probs)
        x = torch.tensor([prompt + list(p) for p in prefixes])
        with torch.no_grad():
            logits = hf_model(x).logits[:, -1].double()
        p_next = torch.softmax(logits / temperature, -1)
        probs = {pre + (t,): probs[pre] * float(p_next[i, t]) for i, pre in enumerate(prefixes) for t in range(p_next.shape[1])}
    return probs


def tv_distance(samples: list[tuple[int, ...]], truth: dict[tuple[int, ...], float]) -> float:
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    keys = set(truth) | set(counts)
    return 0.5 * sum(abs(counts.get(k, 0) / n - truth.get(k, 0.0)) for k in keys)
