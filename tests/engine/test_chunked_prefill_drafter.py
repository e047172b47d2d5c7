"""Chunked prefill, and prefill padded to a length bucket, hand the drafter exactly what an
unchunked eager prefill does.

A prompt prefilled in chunks of 1, 5 or 512 tokens must leave the drafter in the same state
(the draft head's KV for the prompt, the n-gram drafter's token history), so every step then
proposes the same tree. Outputs stay exact whatever the drafter is fed (the verifier
decides), so comparing tokens alone would pass a drafter fed the wrong rows; this records
every proposed tree (tokens, parents, sizes) and every step's acceptance and compares them
across chunk sizes, and with the prefill run through padded length buckets (the forwards the
engine replays from CUDA graphs on a GPU; run directly here). The trees are recorded by wrapping the drafter's `propose` (model
drafters, inside the step) or `propose_host` (the n-gram drafter, between steps).
"""

from __future__ import annotations

import pytest

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _eagle3_heads import saved_tiny_head
from _mtp_heads import e2e_cpu, random_mtp  # noqa: F401  (e2e_cpu: a fixture)

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning")]
PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43], [9] * 9 + [40, 9, 9, 40, 9], [71, 5, 71]]
SETUPS = {
    "eagle3-chain": ("eagle3", dict(drafter="eagle3", max_draft_len=3)),
    "eagle3-tree": ("eagle3", dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
    "mtp-tree": ("mtp", dict(drafter="mtp", tree="dynamic", topk=2, max_draft_len=3)),
    "ngram-chain": (None, dict(drafter="ngram", max_draft_len=4)),
}


@pytest.fixture(scope="module")
def models(tiny_llama8, tmp_path_factory):
    head = tmp_path_factory.mktemp("chunk_head")
    saved_tiny_head(head, seed=1, capture_layers=(1, 3, 4), std=0.3)
    return dict(target=specdec.load_target(tiny_llama8), eagle3=head, mtp=random_mtp(seed=0))


def _record(dec: SpecDecoder) -> dict[int, list]:
    """slot -> the trees proposed for it, step by step (active rows only: a step's other rows
    are idle slots or requests still prefilling, which differ with the chunk size)."""
    drafter, trees = dec.strategies.drafter, {}

    def keep(tokens, parents, num_nodes, active):
        for slot, live in enumerate(active):
            if live:
                trees.setdefault(slot, []).append((tokens[slot].tolist(), parents[slot].tolist(), int(num_nodes[slot])))

    if dec.strategies.drafter_caps.runs_on_host:
        inner = drafter.propose_host

        def propose_host(last_accept, last_tokens, roots, active):
            tokens, parents, num_nodes = inner(last_accept, last_tokens, roots, active)
            keep(tokens, parents, num_nodes, list(active))
            return tokens, parents, num_nodes

        drafter.propose_host = propose_host
    else:
        inner = drafter.propose

        def propose(state, **kw):
            tree = inner(state, **kw)
            keep(tree.tokens, tree.parents, tree.num_nodes, state.active.tolist())
            return tree

        drafter.propose = propose
    return trees


def _use_buckets(dec: SpecDecoder, max_len: int) -> list[list[tuple[int, int]]]:
    """Prefill chunks that start at position 0 through (rows, length) buckets up to `max_len`
    tokens and the batch's rows (target and, when it has them, drafter); returns the buckets
    each part ran, filled as it runs."""
    ran, config = [], dec.config
    for part in (dec.engine.runner, dec.strategies.drafter):
        if hasattr(part, "use_prefill_buckets"):
            got = part.use_prefill_buckets(max_len, capture=False, max_rows=config.cache.max_batch_size,
                                           **({} if part is dec.engine.runner else {"max_tokens": config.schedule.prefill_chunk_size}))
            assert got == 0  # no graph on the CPU
            buckets, log = part.prefill_buckets, []
            buckets.run = lambda key, run=buckets.run, log=log: (log.append(key), run(key))[1]
            ran.append(log)
    return ran


def _run(models, name: str, chunk: int, batch: int = 3, bucket_len: int | None = None):
    """Greedy outputs of PROMPTS: (trees per slot, tokens, acceptance); with `batch` 1 the
    prompts run one after another (so each prefill is a one-slot chunk, what buckets take)."""
    head, cfg = SETUPS[name]
    config = SpecConfig(**cfg, max_batch_size=batch, max_seq_len=96, kv_block_size=4, prefill_chunk_size=chunk)
    dec = SpecDecoder.from_pretrained(models["target"], models[head] if head else None, config)
    ran = _use_buckets(dec, bucket_len) if bucket_len else []
    trees = _record(dec)
    results = dec.generate(PROMPTS, SamplingParams(max_new_tokens=16, ignore_eos=True))
    if bucket_len:
        assert ran and all(ran), "a part never prefilled through a bucket"
    return trees, [r.token_ids for r in results], [r.stats.accepted_per_step for r in results]


@pytest.mark.parametrize("name", list(SETUPS))
def test_chunked_prefill_leaves_the_drafter_proposing_the_same_trees(models, name):
    trees, tokens, accepted = _run(models, name, 512)
    assert sorted(trees) == [0, 1, 2] and all(len(t) >= 4 for t in trees.values())
    assert len({tuple(tree[0]) for t in trees.values() for tree in t}) > 5  # real, varied drafts
    for chunk in (5, 1):
        got = _run(models, name, chunk)
        assert got[1] == tokens and got[2] == accepted, f"chunk {chunk}: outputs or acceptance differ"
        assert got[0] == trees, f"chunk {chunk}: the drafter proposed other trees after a chunked prefill"


@pytest.mark.parametrize("name", list(SETUPS))
def test_prefill_padded_to_a_bucket_leaves_the_drafter_proposing_the_same_trees(models, name):
    """Batch 1 (one prompt per prefill): buckets up to 16 take every prompt (13, 14 and 3
    tokens padded to 16); up to 8 only the 3-token one (the others prefill eagerly); with
    5-token chunks only each first chunk (the 3-token prompt padded to 5). Batch 3: the three
    prompts prefill together, padded to 3 rows x 16 tokens."""
    for batch, cases in ((1, ((512, 16), (512, 8), (5, 5))), (3, ((512, 16),))):
        trees, tokens, accepted = _run(models, name, 512, batch=batch)
        for chunk, max_len in cases:
            got = _run(models, name, chunk, batch=batch, bucket_len=max_len)
            where = f"batch {batch}, chunk {chunk}, buckets to {max_len}"
            assert got[1] == tokens and got[2] == accepted, f"{where}: outputs or acceptance differ"
            assert got[0] == trees, f"{where}: the drafter proposed other trees"


def test_buckets_beyond_a_chunk_or_the_sequence_are_refused(models):
    config = SpecConfig(**SETUPS["eagle3-chain"][1], max_batch_size=1, max_seq_len=96, kv_block_size=4, prefill_chunk_size=32)
    dec = SpecDecoder.from_pretrained(models["target"], models["eagle3"], config)
    with pytest.raises(ValueError, match=r"max_len=33 is out of range; allowed: \[1, 32\]"):
        dec.engine.runner.use_prefill_buckets(33, capture=False)  # the capture buffer holds one chunk
    with pytest.raises(ValueError, match=r"max_len=97 is out of range; allowed: \[1, max_seq_len=96\]"):
        dec.strategies.drafter.use_prefill_buckets(97, capture=False)
    with pytest.raises(ValueError, match=r"max_rows=2 is out of range; allowed: \[1, max_batch_size=1\]"):
        dec.engine.runner.use_prefill_buckets(16, capture=False, max_rows=2)
