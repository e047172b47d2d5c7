"""Every tree kernel at every tree size the engine can launch: N in {1, 2, 33, 64, 257}.

A one-node tree (N = 1, the target-only step) is a corner the property suites rarely draw,
and on the GPU it is a different program: Triton's JIT turns an int argument equal to 1 into
a constant (N = 1 once crashed the verify kernels' compilation on the H200). Here each
kernel runs at each N, on the vocabularies of real targets (49152 SmolLM2, 128256 Llama 3,
151936 Qwen) and an odd one, and is compared with its PyTorch reference: compiled and run on
a CUDA device when there is one, in Triton's interpreter on the CPU otherwise (the CPU run
uses the two smaller vocabularies above N = 33 to stay within seconds).

Trees mix shapes (a chain in row 0; random, star, chain or layered in row 1); the target is planted so that most nodes
accept one of their children, so the walks go deep, and every comparison is exact.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec.kernels.kv_relocate import relocate_kv
from specdec.kernels.tree_build import build_tree_ref, build_tree_triton
from specdec.kernels.verify_greedy import verify_greedy_ref, verify_greedy_triton
from specdec.kernels.verify_speculative import verify_speculative_ref, verify_speculative_triton
from specdec.kernels.verify_target_only import verify_target_only_ref, verify_target_only_triton
from specdec.runtime.kv_cache import PagedKVCache
from specdec.testing.strategies import random_tree_parents

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
SIZES = (1, 2, 33, 64, 257)
VOCABS = (49152, 128256, 151936, 1001)
B = 2
pytestmark = pytest.mark.gpu


def _cases():
    for n in SIZES:
        for v in VOCABS:
            if CUDA or n <= 33 or v in (49152, 1001):
                yield n, v


def _tree(n: int, seed: int):
    """parents [B, n] (row 0 a chain, row 1 a random shape), num_nodes, and the built tree's
    (packed_mask, positions, next_token, next_sibling, retrieve_index), on DEVICE."""
    rng = random.Random(seed)
    rows = [[-1] + list(range(n - 1))] + [random_tree_parents(rng, n) for _ in range(B - 1)]
    parents = torch.tensor(rows, dtype=torch.int64, device=DEVICE)
    num_nodes = torch.full((B,), n, dtype=torch.int64, device=DEVICE)
    W = -(-n // 32)
    meta = [torch.empty(B, n, W, dtype=torch.int32, device=DEVICE)] + [torch.empty(B, n, dtype=torch.int64, device=DEVICE) for _ in range(4)]
    build_tree_ref(parents, num_nodes, *meta)
    return parents, num_nodes, meta


def _planted_probs(tokens: torch.Tensor, next_token: torch.Tensor, vocab: int, seed: int) -> torch.Tensor:
    """[B, n, V] float32 distributions; at most nodes (always at the first 5 of row 0's
    chain) the first child's token holds 0.9."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    p = torch.rand(tokens.shape + (vocab,), generator=g, device=DEVICE).pow_(8)
    child = next_token.clamp(min=0)
    planted = torch.rand(tokens.shape, generator=g, device=DEVICE) < 0.8
    planted[0, :5] = True
    planted &= next_token >= 0
    p /= p.sum(-1, keepdim=True)
    p *= torch.where(planted, 0.1, 1.0)[..., None]
    hit = tokens.gather(1, child)  # [B, n] the first child's token
    p.scatter_add_(2, hit[..., None], torch.where(planted, 0.9, 0.0)[..., None])
    return p


def _equal(ref, got, what):
    for name, a, b in zip(("accept_length", "accept_nodes", "accept_tokens"), ref, got):
        assert torch.equal(a, b), f"{what}: {name} differs\nref {a.tolist()}\ngot {b.tolist()}"


@pytest.mark.parametrize("n", SIZES)
def test_build_tree_at_every_size(n):
    parents, num_nodes, want = _tree(n, seed=n)
    got = [torch.full_like(t, 7) for t in want]  # stale values must be overwritten
    build_tree_triton(parents, num_nodes, *got)
    for a, b in zip(want, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n,vocab", list(_cases()))
def test_verify_kernels_at_every_size_and_vocabulary(n, vocab):
    _, _, (_, _, next_token, next_sibling, _) = _tree(n, seed=n * 7 + vocab)
    g = torch.Generator(device=DEVICE).manual_seed(vocab + n)
    tokens = torch.randint(0, vocab, (B, n), generator=g, device=DEVICE)
    probs = _planted_probs(tokens, next_token, vocab, seed=n)
    links = (tokens, next_token, next_sibling)
    uniforms = torch.rand(B, n, 2, generator=g, device=DEVICE, dtype=torch.float64)
    deepest = 0
    for dtype in (torch.float32, torch.bfloat16):
        logits = probs.log().to(dtype)
        ref = verify_greedy_ref(*links, logits)
        _equal(ref, verify_greedy_triton(*links, logits), f"greedy {dtype}")
        _equal(ref, verify_greedy_triton(*links, logits.argmax(-1)), "greedy from argmax")
        deepest = max(deepest, int(ref[0].max()))
    ref = verify_target_only_ref(*links, probs, uniforms)
    _equal(ref, verify_target_only_triton(*links, probs, uniforms), "target-only")
    draft = _planted_probs(tokens, next_token, vocab, seed=n + 1)
    ref = verify_speculative_ref(*links, probs, draft, uniforms)
    _equal(ref, verify_speculative_triton(*links, probs, draft, uniforms), "speculative")
    assert deepest >= min(n - 1, 5)  # the planted chain is accepted: the walks go deep


@pytest.mark.parametrize("n", SIZES)
def test_kv_relocation_at_every_path_length(n):
    block, seq = 16, 320
    cache = PagedKVCache(2, [2, 1], 8, max_batch_size=B, max_seq_len=seq, block_size=block, device=DEVICE, dtype=torch.bfloat16)
    for slot in range(B):
        cache.reserve(slot, seq)
    g = torch.Generator(device=DEVICE).manual_seed(n)
    cache.storage.copy_(torch.randn(cache.storage.shape, generator=g, device=DEVICE))
    parents, _, (_, _, next_token, _, _) = _tree(n, seed=n)
    # an accepted path: from the root, always the first child, as far as it goes
    nodes = torch.full((B, n), -1, dtype=torch.int64, device=DEVICE)
    lengths = []
    for b in range(B):
        path, cur = [0], 0
        while int(next_token[b, cur]) >= 0:
            cur = int(next_token[b, cur])
            path.append(cur)
        nodes[b, : len(path)] = torch.tensor(path, device=DEVICE)
        lengths.append(len(path) - 1)
    committed = torch.tensor([5, 17], dtype=torch.int64, device=DEVICE)
    length = torch.tensor(lengths, dtype=torch.int64, device=DEVICE)
    want = cache.storage.clone()
    ref_cache = PagedKVCache(2, [2, 1], 8, max_batch_size=B, max_seq_len=seq, block_size=block, device=DEVICE, dtype=torch.bfloat16)
    ref_cache.block_tables.copy_(cache.block_tables)
    ref_cache.storage.copy_(want)
    relocate_kv(ref_cache, committed, nodes, length, impl="torch")
    relocate_kv(cache, committed, nodes, length, impl="triton")
    assert torch.equal(cache.storage, ref_cache.storage)
