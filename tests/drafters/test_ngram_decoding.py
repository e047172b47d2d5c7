"""drafter="ngram" end to end: greedy output equals transformers' greedy `generate` (chain and
tree), and a target whose greedy continuation repeats what the prompt holds is drafted at
mean acceptance >= 3."""

import pytest

import specdec
from specdec import SamplingParams, SpecConfig
from specdec.config import ConfigError
from specdec.entrypoints.decoder import SpecDecoder

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)
from _mtp_heads import hf_greedy, make_bigram_checkpoint

pytestmark = pytest.mark.usefixtures("e2e_cpu")

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]
NEW = 40
TREES = [dict(tree="linear"), dict(tree="dynamic", topk=3, max_total_draft_tokens=10)]


def spec(**kw) -> SpecConfig:
    return SpecConfig(**{"drafter": "ngram", "max_batch_size": 3, "max_seq_len": 128, "kv_block_size": 4,
                         "max_draft_len": 4, **kw})


@pytest.fixture(scope="module")
def random_target(tiny_llama3_with_hf):
    folder, hf = tiny_llama3_with_hf
    return specdec.load_target(folder), [hf_greedy(hf, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("shape", TREES, ids=["chain", "tree"])
def test_greedy_ngram_equals_transformers_greedy_generate(random_target, shape):
    target, refs = random_target
    dec = SpecDecoder.from_pretrained(target, None, spec(**shape))
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    one = dec.generate([PROMPTS[2]], params)
    three = dec.generate(PROMPTS, params)
    assert one[0].token_ids == refs[2]
    for b, out in enumerate(three):
        assert out.token_ids == refs[b], b
        assert out.stats.lossless
    # a tiny random model soon repeats itself, which the drafter picks up
    assert max(max(o.stats.accepted_per_step) for o in three) >= 2


@pytest.mark.parametrize("shape", TREES, ids=["chain", "tree"])
def test_a_target_that_repeats_its_prompt_is_drafted_at_mean_acceptance_over_3(tmp_path, shape):
    """The target is a real Llama checkpoint made bigram (see `make_bigram_checkpoint`): its greedy
    continuation follows a fixed token map and so cycles. The prompt is that continuation's first
    48 tokens, so what follows repeats text the prompt holds: the n-gram drafter's use case."""
    hf = make_bigram_checkpoint(tmp_path, seed=4)
    target = specdec.load_target(tmp_path)
    prompt = [7] + hf_greedy(hf, [7], 47)
    ref = hf_greedy(hf, prompt, NEW)
    dec = SpecDecoder.from_pretrained(target, None, spec(**shape))
    out = dec.generate([prompt], SamplingParams(max_new_tokens=NEW, ignore_eos=True))[0]
    assert out.token_ids == ref
    assert out.stats.mean_accept_length >= 3.0, out.stats.accepted_per_step


def test_ngram_refuses_a_checkpoint_and_capture_layers(random_target):
    target, _ = random_target
    with pytest.raises(ConfigError, match=r"drafter='ngram' has no model; got a draft checkpoint 'head'"):
        SpecDecoder.from_pretrained(target, "head", spec())
    with pytest.raises(ConfigError, match=r"reads no hidden state; layers_to_capture=\(1,\) must be None"):
        SpecDecoder.from_pretrained(target, None, spec(layers_to_capture=(1,)))
    dec = SpecDecoder.from_pretrained(target, None, spec())
    assert dec.engine.runner.capture is None and not dec.engine.runner.keep_last_hidden
    assert dec.engine.state.hidden_path is None
