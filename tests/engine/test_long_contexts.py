"""Exact output at contexts that cross every multiple of 128 up to 1024, and at draft budgets
at their limit.

Eager steps bound the keys they scan by the live slot's reach rounded up to 128
(`engine.KV_LEN_BUCKET`), and a tree writes its rows at committed + 0 .. N - 1: a bound off by
one row, a block-table lookup at a block edge, or a relocation across a block boundary only
shows when committed + tree rows crosses such a multiple, with `max_seq_len` above it. Every
other test stays at `max_seq_len <= 128` or far from the multiples. Here each prompt ends a
few tokens before a multiple of 128 from 128 to 1024 and runs alone (in a batch the longest
context would set the bound for all), and greedy output must equal transformers' `generate`
token for token (fp32, CPU).

The target is a random Llama with large weights (initializer_range 1.0), so that one key more
or less changes its output (with HF's default scale, attention over ~128 keys is so flat that
a dropped key changed nothing in 16 tokens). Drafters: a random EAGLE-3 head (a dynamic tree
of 7 rows every step, nothing accepted), and an oracle tree: the n-gram host drafter's tree
replaced by [root, a wrong child, then the target's true continuation under the root's
second child], so paths through a sibling are accepted and relocated across the boundary.
Per-request draft budgets cycle through the config's, 0, 1 and the whole tree (the limit).
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _eagle3_heads import saved_tiny_head
from _mtp_heads import e2e_cpu, hf_greedy  # noqa: F401  (e2e_cpu: a fixture)
from _tiny_models import make_checkpoint

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]
NEW = 16
V = 96
BOUNDARIES = range(128, 1025, 128)


@pytest.fixture(scope="module")
def boundary_cases(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("long")
    make_checkpoint("llama", root / "llama", num_hidden_layers=8, seed=3, max_position_embeddings=2048,
                    initializer_range=1.0)
    saved_tiny_head(root / "eagle3", seed=1, capture_layers=(1, 3, 4), std=0.1)
    hf = AutoModelForCausalLM.from_pretrained(str(root / "llama"), dtype=torch.float32, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, V, (edge - 3,), generator=gen).tolist() for edge in BOUNDARIES]  # 3 before the multiple
    truth = [hf_greedy(hf, p, NEW + 8) for p in prompts]
    assert all(len(set(t)) > 4 for t in truth)  # a model whose output is not one repeated token
    return dict(root=root, prompts=prompts, truth=truth)


def _oracle(dec: SpecDecoder, truth: list[int]) -> None:
    """The n-gram drafter's tree -> [root, wrong, t1, t2, t3, t4] with t1 under the root (the
    second child) and each t under the one before: the true continuation through a sibling."""
    drafter, engine = dec.strategies.drafter, dec.engine
    inner = drafter.propose_host

    def propose_host(last_accept, last_tokens, roots, active):
        tokens, parents, num_nodes = inner(last_accept, last_tokens, roots, active)
        for b, live in enumerate(active):
            if live:
                done = len(engine.slots[b].token_ids)  # the root is truth[done - 1]
                nxt = truth[done : done + 4]
                tokens[b, 1:] = 0
                parents[b, 1:] = -1
                tokens[b, 1], parents[b, 1] = (nxt[0] + 1) % V, 0
                for j, tok in enumerate(nxt):
                    tokens[b, 2 + j], parents[b, 2 + j] = tok, (0 if j == 0 else 1 + j)
                num_nodes[b] = 2 + len(nxt)
        return tokens, parents, num_nodes

    drafter.propose_host = propose_host


SETUPS = {
    "eagle3-tree": (dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7), "eagle3"),
    "oracle-tree": (dict(drafter="ngram", tree="dynamic", topk=2, max_draft_len=4, max_total_draft_tokens=5), None),
}


@pytest.mark.parametrize("name", list(SETUPS))
def test_greedy_output_is_exact_across_every_multiple_of_128(boundary_cases, name):
    cfg, head = SETUPS[name]
    config = SpecConfig(**cfg, max_batch_size=1, max_seq_len=1100, kv_block_size=16)
    target = specdec.load_target(boundary_cases["root"] / "llama")
    full = config.shape.max_total_draft_tokens
    budgets = [None, 0, 1, full]  # the config's, none, the least, the whole tree (the limit)
    accepted = 0
    for i, (prompt, truth) in enumerate(zip(boundary_cases["prompts"], boundary_cases["truth"])):
        dec = SpecDecoder.from_pretrained(target, boundary_cases["root"] / head if head else None, config)
        if head is None:
            _oracle(dec, truth)
        result = dec.generate([prompt], SamplingParams(max_new_tokens=NEW, ignore_eos=True, num_draft_tokens=budgets[i % 4]))[0]
        assert result.token_ids == truth[:NEW], f"prompt of {len(prompt)} tokens, budget {budgets[i % 4]}"
        accepted = max([accepted, *result.stats.accepted_per_step])
    if head is None:  # whole sibling paths were accepted, so KV relocation crossed the boundaries
        assert accepted == 4
