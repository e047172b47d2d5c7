"""End to end: `SpecDecoder.generate` equals transformers' greedy `generate` on the target alone.

Tiny random Llama, Qwen3 and Mistral checkpoints (safetensors, saved with save_pretrained),
random EAGLE-3 heads saved in the official layout, batches of prompts of different lengths,
linear and dynamic trees, plus an oracle drafter (proposes the target's own continuation,
so long paths are accepted, relocated across block boundaries, and cut by stop tokens) and
an adversarial drafter (always wrong). Then bad input: each a clear error, nothing lost.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specdec import SamplingParams, SpecConfig, hookimpl
from specdec.config import ConfigError
from specdec.entrypoints.decoder import SpecDecoder
from specdec.drafters.eagle3_checkpoint import Eagle3CheckpointError, save_eagle3
from specdec.models import load_target
from specdec.registry import get_plugin_manager
from specdec.types import DraftTree

from _eagle3_heads import random_head
from _tiny_models import make_checkpoint

D, L, V = 64, 8, 96
NEW = 64
# Random heads are expected to accept ~nothing here; the warning for that is tested below.
pytestmark = pytest.mark.filterwarnings("ignore:drafter='eagle3' accepts almost nothing:UserWarning")


@pytest.fixture(autouse=True)
def torch_reference_ops(monkeypatch):
    """Run the ops through their PyTorch references here: the kernels are compared with them
    op by op in their own suites, and interpreted Triton (~0.3 s a launch on CPU) would make
    these 64-token runs take minutes. `test_generation_through_the_triton_kernels` keeps the
    kernels in the loop. On CUDA the kernels run either way."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """family -> (our Target, the HF model) on the same weights."""
    out = {}
    for family in ("llama", "qwen3", "mistral"):
        folder = tmp_path_factory.mktemp(family)
        hf = make_checkpoint(family, folder, num_hidden_layers=L, seed=3)
        hf.generation_config.eos_token_id = None
        hf.generation_config.pad_token_id = 0
        out[family] = (load_target(folder), hf)
        out[family + "-folder"] = folder
    return out


@pytest.fixture(scope="module")
def head_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("head")
    head = random_head(seed=1, hidden_size=D, target_hidden_size=D, head_dim=16, capture_layers=(1, 3, 4), std=0.1)
    save_eagle3(head, folder)
    return folder


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


PROMPTS = [[5, 17, 33], [9] * 11 + [40, 2], [71], [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 7], [60, 61]]


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("tree, topk, depth", [("linear", None, 4), ("dynamic", 3, 4)])
def test_greedy_eagle3_generation_equals_transformers_greedy(targets, head_path, family, tree, topk, depth):
    target, hf = targets[family]
    batch = PROMPTS if family == "llama" else PROMPTS[:3]
    config = SpecConfig(
        drafter="eagle3", tree=tree, topk=topk, max_draft_len=depth, max_batch_size=len(batch),
        max_seq_len=96, kv_block_size=4,
    )
    dec = SpecDecoder.from_pretrained(target, head_path, config)
    results = dec.generate(batch, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for prompt, res in zip(batch, results):
        assert res.token_ids == hf_greedy(hf, prompt, NEW)
        assert res.stats.lossless and res.stats.steps >= 1
        assert len(res.token_ids) == NEW


@pytest.mark.parametrize("tree, topk, depth", [("linear", None, 4), ("dynamic", 3, 4)])
def test_a_head_of_two_draft_layers_generates_transformers_greedy_output(targets, tmp_path, tree, topk, depth):
    """Saved in speculators' layers.{i} layout, loaded through `from_pretrained`, drafting
    with a draft KV layer per draft layer."""
    target, hf = targets["llama"]
    save_eagle3(random_head(seed=2, hidden_size=D, target_hidden_size=D, head_dim=16, capture_layers=(1, 3, 4),
                            std=0.1, num_layers=2), tmp_path)
    config = SpecConfig(drafter="eagle3", tree=tree, topk=topk, max_draft_len=depth, max_batch_size=len(PROMPTS),
                        max_seq_len=96, kv_block_size=4)
    dec = SpecDecoder.from_pretrained(target, tmp_path, config)
    assert dec.strategies.drafter.cache.num_layers == 2
    results = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for prompt, res in zip(PROMPTS, results):
        assert res.token_ids == hf_greedy(hf, prompt, NEW)


class OracleDrafter:
    """Proposes the target's own greedy continuation (known in advance; request i sits in
    slot i) as a chain, or as a tree where each right child has a wrong elder sibling."""

    reads = "nothing"  # required capabilities (specdec.strategies.Drafter)
    runs_on_host = False
    samples_drafts = False

    def __init__(self, futures: dict[int, list[int]], depth: int, branchy: bool, wrong: bool = False):
        self.futures, self.depth, self.branchy, self.wrong = futures, depth, branchy, wrong
        self.num_tree_slots = (2 * depth if branchy else depth) + 1
        self.generated: dict[int, int] = {}  # slot -> tokens generated so far (root included)

    def prefill(self, slot, next_tokens, hidden):
        self.generated[slot] = 1

    def reset_slot(self, slot):
        self.generated.pop(slot, None)

    def propose(self, inputs, max_kv_len=None, draft=True):  # inputs: the step's StepState
        B, N = inputs.root_tokens.shape[0], self.num_tree_slots
        tokens = torch.zeros(B, N, dtype=torch.int64)
        parents = torch.full((B, N), -1, dtype=torch.int64)
        num_nodes = torch.ones(B, dtype=torch.int64)
        for b, count in self.generated.items():
            a = int(inputs.accept_length[b])
            count += a + 1 if a >= 0 else 0
            self.generated[b] = count
            assert int(inputs.root_tokens[b]) == self.futures[b][count - 1]
            future = self.futures[b][count : count + self.depth]
            if self.wrong:
                future = [(t + 1) % V for t in future]
            tokens[b, 0] = inputs.root_tokens[b]
            n, parent = 1, 0
            for tok in future:
                if self.branchy:
                    tokens[b, n], parents[b, n] = (tok + 7) % V, parent
                    n += 1
                tokens[b, n], parents[b, n] = tok, parent
                parent, n = n, n + 1
            num_nodes[b] = n
        return DraftTree(tokens, parents, num_nodes)


def oracle_decoder(target, drafter, config):
    pm = get_plugin_manager(load_entrypoints=False)

    class Plugin:
        @hookimpl(tryfirst=True)
        def specdec_strategy_names(self):
            return {"drafter": ["oracle"]}

        @hookimpl(tryfirst=True)
        def specdec_capture_layers(self, config, target):
            return () if config.drafter == "oracle" else None

        @hookimpl(tryfirst=True)
        def specdec_draft(self, config, target):
            return drafter if config.drafter == "oracle" else None

    pm.register(Plugin())
    return SpecDecoder(target, config, pm=pm)


@pytest.mark.parametrize("branchy, wrong", [(False, False), (True, False), (False, True)])
def test_oracle_and_adversarial_drafters_keep_the_output_exact(targets, branchy, wrong):
    target, hf = targets["llama"]
    depth = 6
    futures = {b: hf_greedy(hf, p, NEW + depth + 1) for b, p in enumerate(PROMPTS)}
    drafter = OracleDrafter(futures, depth, branchy, wrong)
    config = SpecConfig(drafter="oracle", max_draft_len=2 * depth, max_batch_size=len(PROMPTS), max_seq_len=112, kv_block_size=4)
    dec = oracle_decoder(target, drafter, config)
    if wrong:  # a drafter that is never accepted earns a warning (once)
        with pytest.warns(UserWarning, match=r"drafter='oracle' accepts almost nothing: 0 draft tokens accepted"):
            results = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            results = dec.generate(PROMPTS, SamplingParams(max_new_tokens=NEW, ignore_eos=True))
    for b, res in enumerate(results):
        assert res.token_ids == futures[b][:NEW]
        if wrong:
            assert set(res.stats.accepted_per_step) == {0}
        else:  # every full step accepts the whole path: relocation over block boundaries
            assert max(res.stats.accepted_per_step) == depth
            assert res.stats.mean_accept_length > 0.9 * (depth + 1) * (NEW - 1) / (NEW - 1 + depth)


def test_a_stop_token_inside_an_accepted_oracle_path_ends_the_request_there(targets):
    target, hf = targets["llama"]
    depth = 6
    futures = {b: hf_greedy(hf, p, NEW + depth + 1) for b, p in enumerate(PROMPTS[:2])}
    stop = futures[0][9]  # reached inside an accepted path of the first request
    drafter = OracleDrafter(futures, depth, branchy=False)
    config = SpecConfig(drafter="oracle", max_draft_len=depth, max_batch_size=2, max_seq_len=112, kv_block_size=4)
    dec = oracle_decoder(target, drafter, config)
    results = dec.generate(PROMPTS[:2], [SamplingParams(max_new_tokens=NEW, stop_token_ids=(stop,)), SamplingParams(max_new_tokens=NEW - 5, ignore_eos=True)])
    first = futures[0][: futures[0].index(stop) + 1]
    assert results[0].token_ids == first and results[0].stats.finish_reason == "stop"
    assert results[1].token_ids == futures[1][: NEW - 5] and results[1].stats.finish_reason == "length"


def test_requests_finishing_at_different_steps_reuse_slots_across_calls(targets, head_path):
    target, hf = targets["llama"]
    config = SpecConfig(drafter="eagle3", max_draft_len=3, max_batch_size=3, max_seq_len=96, kv_block_size=4)
    dec = SpecDecoder.from_pretrained(target, head_path, config)
    for round_, lengths in enumerate([(5, 40, 17), (33, 2, 9)]):
        prompts = PROMPTS[round_ : round_ + 3]
        params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
        results = dec.generate(prompts, params)
        for prompt, n, res in zip(prompts, lengths, results):
            assert res.token_ids == hf_greedy(hf, prompt, n)
    assert dec.engine.free_slots() == [0, 1, 2]
    assert dec.engine.runner.cache.num_free_blocks == dec.engine.runner.cache.num_blocks


def test_bad_input_is_a_clear_error_and_loses_nothing(targets, head_path, tmp_path):
    target, hf = targets["llama"]
    config = SpecConfig(drafter="eagle3", max_draft_len=3, max_batch_size=2, max_seq_len=48, kv_block_size=4)
    dec = SpecDecoder.from_pretrained(target, head_path, config)
    small = SamplingParams(max_new_tokens=8)
    with pytest.raises(ConfigError, match=r"prompt is empty"):
        dec.generate([[1, 2], []], small)
    with pytest.raises(ConfigError, match=r"prompt of 50 tokens \+ max_new_tokens=8 \+ 4 positions drafted ahead = 62 exceeds max_seq_len=48"):
        dec.generate([[1] * 50], SamplingParams(max_new_tokens=8))
    with pytest.raises(ConfigError, match=r"temperature=0.8 needs a sampling verifier"):
        dec.generate([[1, 2]], SamplingParams(temperature=0.8, max_new_tokens=8))
    # more prompts than slots is no error: they wait for a slot (continuous batching)
    assert [len(r.token_ids) for r in dec.generate([[1], [2], [3]], SamplingParams(max_new_tokens=4, ignore_eos=True))] == [4] * 3
    with pytest.raises(ConfigError, match=r"prompt token ids \[96\] are out of range; allowed: \[0, 96\)"):
        dec.generate([[1, 96]], small)
    # Nothing was admitted by the failed calls; the decoder still works and is exact.
    assert dec.engine.free_slots() == [0, 1]
    res = dec.generate([[5, 17, 33], [71]], SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert [r.token_ids for r in res] == [hf_greedy(hf, [5, 17, 33], 12), hf_greedy(hf, [71], 12)]
    # A head made for another target: hidden size mismatch.
    other = tmp_path / "other"
    save_eagle3(random_head(hidden_size=32, target_hidden_size=32, head_dim=8, capture_layers=(1, 3, 4)), other)
    with pytest.raises((ConfigError, Eagle3CheckpointError), match=r"hidden"):
        SpecDecoder.from_pretrained(target, other, config)


@pytest.mark.gpu
def test_generation_through_the_triton_kernels(targets, head_path, monkeypatch):
    """The same exactness with every op (tree build, verification, relocation) run by its
    Triton kernel (interpreted on CPU)."""
    target, hf = targets["llama"]
    if torch.cuda.is_available():  # compiled kernels: the target (and so every op) on the GPU
        target = load_target(targets["llama-folder"], device="cuda")
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    config = SpecConfig(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3, max_batch_size=2, max_seq_len=64, kv_block_size=4)
    dec = SpecDecoder.from_pretrained(target, head_path, config)
    results = dec.generate(PROMPTS[:2], SamplingParams(max_new_tokens=10, ignore_eos=True))
    for prompt, res in zip(PROMPTS[:2], results):
        assert res.token_ids == hf_greedy(hf, prompt, 10)
