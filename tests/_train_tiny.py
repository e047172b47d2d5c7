"""Test helpers for specdec.train: a tiny random Llama target and self-distilled data from it.

Not a test module (leading underscore). Used by tests/train/test_train_*.py.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec.train.distill import DistillData, generate_responses

VOCAB, LAYERS = 96, 8  # capture layers (1, 3, 4) by the default rule


def make_target(folder, *, seed: int = 0, **overrides):
    """A tiny random Llama saved in `folder` and loaded with `load_target`."""
    from _tiny_models import make_checkpoint

    from specdec.models import load_target

    make_checkpoint("llama", folder, seed=seed, num_hidden_layers=LAYERS, vocab_size=VOCAB, **overrides)
    return load_target(folder)


def make_data(target, *, n: int = 24, seed: int = 0, new_tokens: int = 20) -> DistillData:
    """Random prompts of 4..24 tokens and the target's greedy responses, packed (generated
    through `reference_ops`: the data is the subject of no test here)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(4, 25, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(n)]
    with reference_ops():
        responses = generate_responses(target.model, prompts, max_new_tokens=new_tokens, batch_size=8,
                                       eos_token_ids=(), progress=False)
    seqs = [torch.tensor(p + r) for p, r in zip(prompts, responses)]
    return DistillData.pack(seqs, [len(p) for p in prompts], ["code"] * n)


@contextlib.contextmanager
def reference_ops():
    """On CPU, the ops' torch references instead of the interpreted Triton kernels (those are
    compared with the references in their own suites; interpreted, generating a tiny data set
    took minutes). On CUDA nothing changes."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "0")
        yield


@contextlib.contextmanager
def one_thread():
    """Tiny tensors: more threads only add contention (the CI machine has 2 cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
