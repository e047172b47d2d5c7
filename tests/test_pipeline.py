"""`specdec.pipeline.build`: the strategies resolved once and every derived size fixed once.
For every built-in drafter and tree shape, the sizes the pipeline derives are the ones the
target runner, the engine, its step state, its hand-off buffers and a request's budget use."""

from __future__ import annotations

import pytest

import specdec
from specdec import SamplingParams, SpecConfig
from specdec.drafters.mtp_checkpoint import save_mtp
from specdec.entrypoints.decoder import SpecDecoder
from specdec.pipeline import build, derive_sizes

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)
from _mtp_heads import random_mtp

pytestmark = pytest.mark.usefixtures("e2e_cpu")

BASE = dict(max_batch_size=3, max_seq_len=96, kv_block_size=4, max_draft_len=3, prefill_chunk_size=8)
SHAPES = {  # tree shapes the built-in policies take (the budget below the config's bound where it may be)
    "linear": dict(tree="linear"),
    "dynamic": dict(tree="dynamic", topk=2, max_total_draft_tokens=5),
    "static": dict(tree="static", max_total_draft_tokens=6),
    "sampled": dict(tree="sampled", topk=2, max_total_draft_tokens=4, verifier="speculative"),
}
SETUPS = ([("none", "linear")] + [("eagle3", s) for s in SHAPES] + [("ngram", s) for s in SHAPES if s != "sampled"]
          + [("mtp", "linear"), ("mtp", "dynamic")])  # n-gram ranks counts: it draws no i.i.d. samples


@pytest.fixture(scope="module")
def mtp_head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp_head")
    save_mtp(random_mtp(seed=0), folder)
    return folder


def decoder(drafter, shape, tiny_llama8, tiny_eagle3_head, tiny_llama3_with_hf, mtp_head):
    cfg = SpecConfig(drafter=drafter, **{**BASE, **SHAPES[shape]})
    if drafter == "mtp":
        return SpecDecoder.from_pretrained(specdec.load_target(tiny_llama3_with_hf[0]), mtp_head, cfg)
    head = tiny_eagle3_head if drafter == "eagle3" else None
    return SpecDecoder.from_pretrained(specdec.load_target(tiny_llama8), head, cfg)


@pytest.mark.parametrize("drafter, shape", SETUPS, ids=[f"{d}-{s}" for d, s in SETUPS])
def test_every_part_uses_the_pipelines_sizes(drafter, shape, tiny_llama8, tiny_eagle3_head, tiny_llama3_with_hf,
                                             mtp_head):
    dec = decoder(drafter, shape, tiny_llama8, tiny_eagle3_head, tiny_llama3_with_hf, mtp_head)
    sizes, engine, runner = dec.pipeline.sizes, dec.engine, dec.engine.runner
    N = sizes.num_tree_slots
    assert N <= dec.config.shape.num_tree_slots
    assert N == dec.strategies.drafter.num_tree_slots == engine.num_slots_tree == runner.num_tree_slots
    assert engine.sizes == sizes  # the engine derives nothing of its own
    assert engine.state.num_nodes == N and engine.state.draft_tokens.shape == (BASE["max_batch_size"], N)
    assert all(h.shape == (BASE["max_batch_size"], N + 1) for h in engine._handoff_hosts)
    assert engine.lookahead == sizes.lookahead >= N
    assert engine.buckets == sizes.batch_buckets == dec.config.batch_buckets
    if dec.strategies.policy_caps is not None and drafter != "none":
        assert dec.strategies.policy_caps.num_nodes + 1 == N  # the policy's tree fills the drafter's N
    if runner.capture is not None:
        assert runner.capture.buffer.shape[0] == sizes.capture_rows
    assert sizes.draft_budget == N - 1 and sizes.adaptive_depth == min(BASE["max_draft_len"], N - 1)
    request = engine.submit([1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0 if shape != "sampled" else 0.7))
    assert request.budget == sizes.draft_budget
    assert request.max_positions == 3 + 4 + sizes.lookahead
    engine.abort(request)


def test_build_resolves_once_and_derives_the_same_sizes(tiny_llama8):
    target = specdec.load_target(tiny_llama8)
    cfg = SpecConfig(drafter="ngram", **{**BASE, **SHAPES["dynamic"]})
    pipeline = build(cfg, target.info)
    assert pipeline.config is cfg
    assert derive_sizes(cfg, pipeline.strategies) == pipeline.sizes
    assert pipeline.sizes.num_tree_slots == 6 and pipeline.sizes.draft_budget == 5


def test_a_drafter_wider_than_the_configs_tree_slots_is_a_config_error(tiny_llama8):
    target = specdec.load_target(tiny_llama8)
    cfg = SpecConfig(drafter="ngram", **BASE)
    pipeline = build(cfg, target.info)

    class Wide:
        num_tree_slots = cfg.shape.num_tree_slots + 1

    strategies = type(pipeline.strategies)(**{**vars(pipeline.strategies), "drafter": Wide()})
    with pytest.raises(specdec.ConfigError, match=r"drafter proposes 5 tree slots, more than config.shape.num_tree_slots=4"):
        derive_sizes(cfg, strategies)
