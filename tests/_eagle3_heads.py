"""Test helpers: tiny random EAGLE-3 heads and a synthetic "world" of target states.

Not a test module (leading underscore). Used by the tests/drafters/test_eagle3_*.py files.
"""

from __future__ import annotations

import torch

from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, init_random_
from specdec.models.config import RopeConfig

V, VD, D_T = 96, 40, 32  # target vocab, draft vocab, target hidden size


def head_config(**kw) -> Eagle3Config:
    base = dict(
        hidden_size=D_T,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=V,
        draft_vocab_size=VD,
        target_hidden_size=D_T,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0),
        capture_layers=(1, 2, 4),
    )
    base.update(kw)
    return Eagle3Config(**base)


def random_head(seed: int = 0, *, dtype=torch.float32, std: float = 0.3, **kw) -> Eagle3Model:
    """A random head whose logits are far from uniform (std large for a tiny d)."""
    gen = torch.Generator().manual_seed(seed)
    model = init_random_(Eagle3Model(head_config(**kw)), gen, std=std)
    return model.to(dtype).eval()


class World:
    """A fixed token sequence and captured target states per position, as a target would give.

    seq[p] is the token at position p; H[p] the captured states at position p.
    """

    def __init__(self, length: int, width: int, *, seed: int = 0, dtype=torch.float32, vocab: int = V):
        gen = torch.Generator().manual_seed(seed)
        self.seq = torch.randint(0, vocab, (length,), generator=gen)
        self.H = torch.randn(length, width, generator=gen).to(dtype)

    def prefill_args(self, L: int):
        """(next_tokens [L], hidden [L, w]) for a prompt seq[:L] whose first generated token is seq[L]."""
        return self.seq[1 : L + 1].clone(), self.H[:L].clone()


def saved_tiny_head(folder, *, seed: int, capture_layers, std: float = 0.3, num_layers: int = 1):
    """A random EAGLE-3 head shaped for the tests' tiny 64-wide targets (hidden 64, head_dim
    16), saved in the official layout to `folder` (several layers: speculators'); returns `folder`."""
    from specdec.drafters.eagle3_checkpoint import save_eagle3

    save_eagle3(random_head(seed=seed, hidden_size=64, target_hidden_size=64, head_dim=16,
                            capture_layers=capture_layers, std=std, num_layers=num_layers), folder)
    return folder
