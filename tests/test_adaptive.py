"""Adaptive speculation (`SpecConfig(adaptive=True)`): greedy output stays exactly target-only
whichever step runs, a drafter that is never accepted ends up running plain steps, an oracle
drafter keeps speculating, and the cost model holds both steps of every bucket."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.drafters.eagle3_checkpoint import save_eagle3

from _eagle3_heads import random_head
from _mtp_heads import bigram_oracle_mtp, e2e_cpu, make_bigram_checkpoint, random_mtp  # noqa: F401
from _tiny_models import make_checkpoint

pytestmark = [
    pytest.mark.usefixtures("e2e_cpu"),
    pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning"),
]
PROMPTS = [[5, 17, 33], [9] * 11 + [40, 2], [71], [3, 14, 15, 92, 65], [60, 61]]
BASE = dict(max_batch_size=2, max_seq_len=112, kv_block_size=4)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    llama = tmp_path_factory.mktemp("llama8")
    make_checkpoint("llama", llama, num_hidden_layers=8, seed=3)
    bigram = tmp_path_factory.mktemp("bigram")
    make_bigram_checkpoint(bigram, seed=1)
    head = tmp_path_factory.mktemp("head")
    save_eagle3(random_head(seed=1, hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 3, 4), std=0.1), head)
    return dict(llama=specdec.load_target(llama), bigram=specdec.load_target(bigram), head=head)


def _run(dec, n=40):
    return [r.token_ids for r in dec.generate(PROMPTS, SamplingParams(max_new_tokens=n, ignore_eos=True))]


@pytest.mark.parametrize(
    "target, draft, cfg",
    [
        ("llama", "eagle3", dict(drafter="eagle3", max_draft_len=3)),
        ("llama", "eagle3", dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_total_draft_tokens=7)),
        ("bigram", "oracle", dict(drafter="mtp", max_draft_len=4)),
        ("bigram", None, dict(drafter="ngram", tree="dynamic", topk=2, max_draft_len=4)),
    ],
    ids=["eagle3-chain", "eagle3-tree", "mtp-oracle", "ngram"],
)
def test_adaptive_greedy_output_equals_target_only(targets, target, draft, cfg):
    t = targets[target]
    head = {"eagle3": targets["head"], "oracle": bigram_oracle_mtp(), None: None}[draft]
    plain = _run(SpecDecoder(t, SpecConfig(**BASE, drafter="none")))
    dec = SpecDecoder.from_pretrained(t, head, SpecConfig(**BASE, **cfg, adaptive=True))
    dec.warmup(progress=False)
    assert sorted(dec.engine.costs.seconds) == [(b, v) for b in (1, 2) for v in (False, True)]
    assert _run(dec) == plain


def test_a_never_accepted_drafter_runs_mostly_plain_steps_and_an_oracle_mostly_speculates(targets):
    never = SpecDecoder.from_pretrained(targets["llama"], random_mtp(seed=0), SpecConfig(**BASE, drafter="mtp", max_draft_len=4, adaptive=True))
    oracle = SpecDecoder.from_pretrained(targets["bigram"], bigram_oracle_mtp(), SpecConfig(**BASE, drafter="mtp", max_draft_len=4, adaptive=True))
    for dec in (never, oracle):
        dec.warmup(progress=False)
        # the measured costs decide; make the speculative step clearly dearer than the plain one
        # (as at a large batch) so the decision follows acceptance, not CPU timing noise
        for (b, spec), sec in list(dec.engine.costs.seconds.items()):
            dec.engine.costs.seconds[(b, spec)] = 2.0 if spec else 1.0
        _run(dec, n=60)
    n_spec, n_plain = never.engine.policy.decisions[True], never.engine.policy.decisions[False]
    assert n_plain > 2 * n_spec, never.engine.policy.decisions  # probes only, once the estimate fell
    o_spec, o_plain = oracle.engine.policy.decisions[True], oracle.engine.policy.decisions[False]
    assert o_spec > 4 * o_plain, oracle.engine.policy.decisions
