"""verifier="typical": the acceptance rule against a plain-Python oracle on random trees, greedy
rows equal greedy verification, options, and end to end (lossy runs are reported as lossy)."""

import math

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

import specdec
from specdec import SamplingParams, SpecConfig
from specdec.config import ConfigError
from specdec.entrypoints.decoder import SpecDecoder
from specdec.ops import build_tree, sample_from_probs, verify_greedy
from specdec.plugins.typical import TypicalOptions, TypicalVerifier, typical_walk
from specdec.types import SamplingTensors

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)
from _mtp_heads import hf_greedy, random_mtp
from tree_cases import children_lists, trees


def meta(parents, num_nodes):
    return build_tree(parents, num_nodes, impl="ref")


def oracle(parents, n, tokens, probs, threshold, alpha, max_depth):
    """First acceptable child in index order, node by node: (path root first, limit used)."""
    kids = children_lists(parents, n)
    path, u = [0], 0
    while len(path) - 1 < max_depth:
        p = probs[u]
        entropy = -sum(x * math.log(x) for x in p if x > 0)
        limit = min(threshold, alpha * math.exp(-entropy))
        ok = [c for c in kids[u] if p[tokens[c]] > limit]
        if not ok:
            break
        u = ok[0]
        path.append(u)
    return path


@settings(max_examples=40)
@given(t=trees(max_batch=4, max_slots=40), seed=st.integers(0, 2**31 - 1),
       threshold=st.sampled_from([0.09, 0.3, 1.0, 1e-3]), alpha=st.sampled_from([0.0, 0.3, 1.0]))
def test_the_walk_takes_the_first_acceptable_child_like_a_python_oracle(t, seed, threshold, alpha):
    B, N, V = t.batch, t.slots, 5
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(B, N, V, generator=g) * 2.5, -1)  # [B, N, V]
    tokens = torch.randint(0, V, (B, N), generator=g)
    u = torch.rand(B, N, 2, generator=g, dtype=torch.float64)
    depth = int(torch.randint(1, max(N, 2), (1,), generator=g))
    acc = typical_walk(tokens, meta(t.parents, t.num_nodes), probs, u, threshold=threshold, alpha=alpha, max_depth=depth)
    for b in range(B):
        n = int(t.num_nodes[b])
        path = oracle(t.parents[b].tolist(), n, tokens[b].tolist(), probs[b].double().tolist(), threshold, alpha, depth)
        note(f"row {b}: path {path}")
        a = len(path) - 1
        assert int(acc.accept_length[b]) == a
        assert acc.accept_nodes[b].tolist() == path + [-1] * (N - a - 1)
        bonus = int(sample_from_probs(probs[b, path[-1]], u[b, path[-1], 1]))
        emitted = [int(tokens[b, c]) for c in path[1:]] + [bonus]
        assert acc.accept_tokens[b].tolist() == emitted + [-1] * (N - a - 1)


def test_a_worked_example_with_the_numbers():
    # root distribution p = [0.05, 0.5, 0.3, 0.15]; H = 1.142 nats; alpha * exp(-H) = 0.3 * 0.319 = 0.0957
    # limit = min(0.09, 0.0957) = 0.09: token 0 (0.05) fails, tokens 2 (0.3) and 1 (0.5) pass.
    p = torch.tensor([0.05, 0.5, 0.3, 0.15])
    probs = torch.zeros(1, 4, 4)
    probs[0, 0] = p
    probs[0, 1:] = torch.tensor([1.0, 0, 0, 0])
    tokens = torch.tensor([[3, 0, 2, 1]])  # children of the root in sibling order: tokens 0, 2, 1
    parents = torch.tensor([[-1, 0, 0, 0]])
    u = torch.zeros(1, 4, 2, dtype=torch.float64)
    acc = typical_walk(tokens, meta(parents, torch.tensor([4])), probs, u, threshold=0.09, alpha=0.3, max_depth=3)
    assert acc.accept_nodes[0].tolist() == [0, 2, -1, -1]  # token 2, the first acceptable sibling, not the likelier 1
    assert acc.accept_tokens[0].tolist() == [2, 0, -1, -1]  # then the bonus from node 2's distribution
    strict = typical_walk(tokens, meta(parents, torch.tensor([4])), probs, u, threshold=0.4, alpha=1.0, max_depth=3)
    assert strict.accept_nodes[0].tolist() == [0, 3, -1, -1]  # limit 0.319: only token 1 (p = 0.5) passes


@settings(max_examples=20)
@given(t=trees(max_batch=4, max_slots=40), seed=st.integers(0, 2**31 - 1))
def test_greedy_rows_accept_exactly_what_greedy_verification_accepts(t, seed):
    B, N, V = t.batch, t.slots, 7
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, N, V, generator=g)
    tokens = torch.where(torch.rand(B, N, generator=g) < 0.6, logits.argmax(-1).roll(1, 1), torch.randint(0, V, (B, N), generator=g))
    tree = meta(t.parents, t.num_nodes)
    verifier = TypicalVerifier(TypicalOptions(), max_depth=N - 1)
    sampling = SamplingTensors.from_params([SamplingParams()] * B)
    got = verifier(tokens, tree, logits, sampling, uniforms=torch.rand(B, N, 2, generator=g, dtype=torch.float64))
    ref = verify_greedy(tokens, tree, logits, impl="ref")
    assert torch.equal(got.accept_length, ref.accept_length)
    assert torch.equal(got.accept_nodes, ref.accept_nodes)
    assert torch.equal(got.accept_tokens, ref.accept_tokens)


def test_options_are_validated_with_the_allowed_range():
    cfg = SpecConfig(verifier="typical", plugin_options={"typical": {"posterior_threshold": 0.2}})
    assert TypicalOptions.from_config(cfg) == TypicalOptions(0.2, 0.3)
    for options, message in [
        ({"posterior_threshold": 0.0}, r"\['posterior_threshold'\]=0.0 is out of range; allowed: \(0, 1\]"),
        ({"posterior_alpha": 1.5}, r"\['posterior_alpha'\]=1.5 is out of range; allowed: \[0, 1\]"),
        ({"posterior_alpha": float("nan")}, r"\['posterior_alpha'\]=nan is out of range"),
        ({"epsilon": 0.1}, r"unknown keys \['epsilon'\]; allowed: \['posterior_alpha', 'posterior_threshold'\]"),
    ]:
        with pytest.raises(ConfigError, match=message):
            TypicalOptions.from_config(SpecConfig(verifier="typical", plugin_options={"typical": options}))
    v = TypicalVerifier(TypicalOptions(), 3)
    assert v.lossless is False and v.needs_draft_probs is False


# ----------------------------------------------------------------------------- end to end
PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]
NEW = 32


@pytest.fixture(scope="module")
def random_target(tiny_llama3_with_hf):
    folder, hf = tiny_llama3_with_hf
    return specdec.load_target(folder), [hf_greedy(hf, p, NEW) for p in PROMPTS]


@pytest.mark.usefixtures("e2e_cpu")
@pytest.mark.parametrize(
    "drafter, draft, shape",
    [("mtp", random_mtp, dict(tree="dynamic", topk=3, max_total_draft_tokens=7)),
     ("ngram", None, dict(tree="dynamic", topk=3, max_total_draft_tokens=7)),
     ("ngram", None, dict(tree="linear"))],
    ids=["mtp-tree", "ngram-tree", "ngram-chain"],
)
def test_typical_is_greedy_exact_at_temperature_0_and_reported_lossy(random_target, drafter, draft, shape):
    target, refs = random_target
    config = SpecConfig(drafter=drafter, verifier="typical", max_batch_size=3, max_seq_len=96, kv_block_size=4,
                        max_draft_len=3, **shape)
    dec = SpecDecoder.from_pretrained(target, draft() if draft else None, config)
    outs = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for b, out in enumerate(outs):
        assert out.token_ids == refs[b], b
        assert out.stats.lossless is False  # the verifier object says lossy, so the stats do too


@pytest.mark.usefixtures("e2e_cpu")
def test_sampled_typical_accepts_more_than_exact_verification_and_stays_in_the_support(random_target):
    target, _ = random_target
    # a random head's greedy draft is in the target's top-5 ~5% of the time: 60 tokens x 3
    # prompts give typical acceptance ~7 chances in expectation (none with probability ~0.1%)
    params = SamplingParams(temperature=1.0, top_k=5, max_new_tokens=60, ignore_eos=True)
    accepted, tokens = {}, {}
    for verifier in ("target-only", "typical"):
        config = SpecConfig(drafter="mtp", verifier=verifier, max_batch_size=3, max_seq_len=96, kv_block_size=4,
                            max_draft_len=3, plugin_options={"typical": {"posterior_threshold": 0.05, "posterior_alpha": 0.05}})
        dec = SpecDecoder.from_pretrained(target, random_mtp(seed=2), config, seed=7)
        outs = dec.generate(PROMPTS, params)
        accepted[verifier] = sum(sum(o.stats.accepted_per_step) for o in outs)
        tokens[verifier] = [o.token_ids for o in outs]
        assert all(o.stats.lossless is (verifier != "typical") for o in outs)
    assert accepted["typical"] > accepted["target-only"], accepted
    # every emitted token lies in the top-5 of the target at its position (top-k filters p for both rules)
    for prompt, out in zip(PROMPTS, tokens["typical"]):
        logits = _full_logits(target.model, prompt + out)
        for i, tok in enumerate(out):
            top5 = logits[len(prompt) - 1 + i].topk(5).indices.tolist()
            assert tok in top5, (i, tok, top5)


def _full_logits(model, ids):
    """Target logits at every position of `ids` (a plain prefill through a fresh paged cache)."""
    from specdec.runtime.batch import prefill_batch

    cfg = SpecConfig(max_batch_size=1, max_seq_len=128, kv_block_size=4)
    cache = model.make_cache(cfg)
    cache.reserve(0, len(ids))
    L = len(ids)
    batch = prefill_batch(cache, torch.tensor([0]), torch.tensor([0]), torch.tensor([L]), L)
    with torch.no_grad():
        return model(torch.tensor([ids]), batch.positions, cache, batch).logits[0]

