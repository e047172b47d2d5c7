"""drafter="mtp" end to end: greedy output equals transformers' greedy `generate`, no capture
buffer, an oracle head is fully accepted, and sampled output follows the target distribution."""

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.drafters.mtp_checkpoint import save_mtp
from specdec.registry import get_plugin_manager

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)
from _mtp_heads import bigram_oracle_mtp, exact_joint, hf_greedy, make_bigram_checkpoint, random_mtp, tv_bound, tv_distance
from _tiny_models import make_checkpoint

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]]
NEW = 32
pytestmark = pytest.mark.usefixtures("e2e_cpu")


def spec(**kw) -> SpecConfig:
    base = dict(drafter="mtp", max_batch_size=3, max_seq_len=96, kv_block_size=4, max_draft_len=3)
    return SpecConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def random_target(tiny_llama3_with_hf):
    folder, hf = tiny_llama3_with_hf
    refs = [hf_greedy(hf, p, NEW) for p in PROMPTS]
    return specdec.load_target(folder), refs


@pytest.fixture(scope="module")
def bigram_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bigram_llama")
    hf = make_bigram_checkpoint(folder, seed=1)
    refs = [hf_greedy(hf, p, NEW) for p in PROMPTS]
    return specdec.load_target(folder), refs


TREES = [dict(tree="linear"), dict(tree="dynamic", topk=3, max_total_draft_tokens=7)]


@pytest.mark.parametrize("shape", TREES, ids=["chain", "tree"])
def test_greedy_mtp_with_a_random_head_equals_transformers_greedy_generate(random_target, shape, tmp_path):
    target, refs = random_target
    save_mtp(random_mtp(seed=0), tmp_path / "head")  # through the checkpoint path, as a user would
    dec = SpecDecoder.from_pretrained(target, tmp_path / "head", spec(**shape))
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    one = dec.generate([PROMPTS[1]], params)  # a batch of one, then three of different lengths (slots reused)
    three = dec.generate(PROMPTS, params)
    assert one[0].token_ids == refs[1]
    for b, out in enumerate(three):
        assert out.token_ids == refs[b], b
        assert out.stats.lossless and out.stats.steps <= NEW - 1


@pytest.mark.parametrize("shape", TREES, ids=["chain", "tree"])
def test_an_oracle_head_on_a_bigram_target_is_accepted_in_full_and_stays_exact(bigram_target, shape):
    target, refs = bigram_target
    dec = SpecDecoder.from_pretrained(target, bigram_oracle_mtp(), spec(**shape))
    outs = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for b, out in enumerate(outs):
        assert out.token_ids == refs[b], b
        # D + 1 = 4 tokens per step but the last (31 tokens after the prefill's first: 8 steps)
        assert out.stats.mean_accept_length >= 3.8, out.stats.accepted_per_step


def test_with_drafter_mtp_no_capture_buffer_exists_and_no_capture_hook_returns_layers(random_target):
    target, _ = random_target
    config = spec()
    dec = SpecDecoder.from_pretrained(target, random_mtp(), config)
    assert dec.strategies.capture_layers == ()
    assert dec.engine.runner.capture is None and dec.engine.runner.keep_last_hidden
    info = dec.strategies  # every plugin's capture hook: None (not mine) or () (no layers)
    pm = get_plugin_manager(load_entrypoints=False)
    answers = [impl.function(config=config, target=target.info) for impl in pm.hook.specdec_capture_layers.get_hookimpls()]
    assert all(a is None or tuple(a) == () for a in answers) and () in answers
    seen = []
    drafter = info.drafter
    prefill = drafter.prefill
    drafter.prefill = lambda slot, nt, hidden: (seen.append(tuple(hidden.shape)), prefill(slot, nt, hidden))
    dec.generate([PROMPTS[0]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert seen == [(3, target.info.hidden_size)]  # the last hidden state, one row per prompt token
    assert dec.engine.state.hidden_path.shape[-1] == target.info.hidden_size


# ----------------------------------------------------------------------------- sampling
SAMPLE_V = 4
SAMPLE_PROMPT = [1, 3, 2]
SAMPLES = 2000  # per case
STEPS = 3  # the first 3 tokens: 1 from the prefill, the others from speculative steps


@pytest.fixture(scope="module")
def small_vocab_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_vocab")
    hf = make_checkpoint("llama", folder, seed=2, vocab_size=SAMPLE_V, initializer_range=0.3)
    truth = exact_joint(hf, SAMPLE_PROMPT, STEPS)
    return specdec.load_target(folder), truth


@pytest.mark.parametrize(
    "verifier, shape",
    [("target-only", dict(tree="linear")), ("speculative", dict(tree="linear")),
     ("target-only", dict(tree="dynamic", topk=2, max_total_draft_tokens=4))],
    ids=["target-only-chain", "speculative-chain", "target-only-tree"],
)
def test_sampled_mtp_output_follows_the_target_distribution(small_vocab_target, verifier, shape):
    """Empirical joint of the first 3 tokens (4^3 = 64 outcomes, n = 2000) against the exact joint
    (enumerated with transformers). Bound: E[TV] <= 0.5 * sum sqrt(p(1-p)/n) = 0.033 for this
    target, plus the McDiarmid term sqrt(ln(1e6)/(2n)) = 0.059: 0.092 (false alarm < 1e-6).
    Measured: 0.02-0.03 for these verifiers; a verifier that accepts every draft gives 0.94."""
    target, truth = small_vocab_target
    B = 40
    config = spec(verifier=verifier, max_batch_size=B, max_seq_len=32, **shape)
    head = random_mtp(seed=3, vocab_size=SAMPLE_V, std=0.5)
    dec = SpecDecoder.from_pretrained(target, head, config, seed=123)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, ignore_eos=True)
    samples, accepted = [], 0
    for _ in range(SAMPLES // B):
        for out in dec.generate([SAMPLE_PROMPT] * B, params):
            samples.append(tuple(out.token_ids))
            accepted += sum(out.stats.accepted_per_step)
    assert dec.strategies.drafter.samples_drafts == (verifier == "speculative")
    assert accepted > 0.2 * SAMPLES  # drafts really were accepted, so the acceptance path is tested
    tv, bound = tv_distance(samples, truth), tv_bound(truth, SAMPLES)
    assert bound < 0.1
    assert tv < bound, f"TV={tv:.3f} >= {bound:.3f}"


def test_bad_mtp_options_are_clear_errors(random_target, tmp_path):
    target, _ = random_target
    with pytest.raises(specdec.ConfigError, match=r"drafter='mtp' needs a head: SpecDecoder.from_pretrained\(target, draft=PATH"):
        SpecDecoder.from_pretrained(target, None, spec())
    with pytest.raises(specdec.ConfigError, match=r"plugin_options\['mtp'\] has unknown keys \['topk'\]"):
        SpecDecoder.from_pretrained(target, random_mtp(), spec(plugin_options={"mtp": {"topk": 2}}))
    with pytest.raises(specdec.ConfigError, match=r"must be a path or an MTPModel, got int"):
        SpecDecoder.from_pretrained(target, 3, spec())
    with pytest.raises(specdec.ConfigError, match=r"reads the target's last hidden state only; layers_to_capture=\(1,\)"):
        SpecDecoder.from_pretrained(target, random_mtp(), spec(layers_to_capture=(1,)))
    from specdec.drafters.mtp_checkpoint import MTPCheckpointError

    save_mtp(random_mtp(vocab_size=100), tmp_path)
    with pytest.raises(MTPCheckpointError, match=r"vocab_size=100 differs from the target's vocab_size=96"):
        SpecDecoder.from_pretrained(target, tmp_path, spec())


def test_a_draft_vocabulary_beside_the_checkpoint_is_used_and_output_stays_exact(random_target, tmp_path):
    from specdec.drafters.mtp_checkpoint import MTPCheckpointError, load_draft_vocab, save_draft_vocab

    target, refs = random_target
    head = tmp_path / "head"
    save_mtp(random_mtp(seed=0), head)
    ids = torch.arange(0, 96, 2)  # drafts may only be even ids
    save_draft_vocab(head, ids)
    assert torch.equal(load_draft_vocab(head, vocab_size=96), ids)
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    for options in ({}, {"draft_vocab": "full"}, {"draft_vocab": ids}):
        dec = SpecDecoder.from_pretrained(target, head, spec(tree="dynamic", topk=3, plugin_options={"mtp": options}))
        drafter = dec.strategies.drafter
        if options.get("draft_vocab") == "full":
            assert drafter.target_ids is None
        else:
            assert torch.equal(drafter.target_ids, ids)
        assert [o.token_ids for o in dec.generate(PROMPTS, params)] == refs
    from safetensors.torch import save_file

    save_file({"target_ids": torch.tensor([5, 3])}, str(tmp_path / "draft_vocab.safetensors"))  # not ascending
    with pytest.raises(MTPCheckpointError, match=r"draft_vocab.safetensors: target_ids must be strictly ascending"):
        SpecDecoder.from_pretrained(target, head, spec(plugin_options={"mtp": {"draft_vocab": tmp_path}}))
    with pytest.raises(MTPCheckpointError, match=r"target_ids span \[0, 96\]; allowed: \[0, 96\)"):
        SpecDecoder.from_pretrained(target, head, spec(plugin_options={"mtp": {"draft_vocab": torch.arange(97)}}))
    with pytest.raises(specdec.ConfigError, match=r"\['draft_vocab'\]=3; allowed: 'auto', 'full', a path"):
        SpecDecoder.from_pretrained(target, head, spec(plugin_options={"mtp": {"draft_vocab": 3}}))
