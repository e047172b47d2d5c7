"""The engine's step loop on a table-driven target: hook order, losslessness, stops, slots.

The target here is a bigram table (logits depend on the current token only), so the target's
own greedy continuation is known exactly and the engine logic is tested apart from models.
"""

import dataclasses

import pytest
import torch

from specdec import SamplingParams, SpecConfig, hookimpl
from specdec.config import ConfigError
from specdec.engine import SpecEngine
from specdec.registry import get_plugin_manager, resolve
from specdec.strategies import TargetInfo
from specdec.types import DraftTree

V = 11
EOS = 10


class BigramRunner:
    """Target whose logits at a node are `table[token]`; it keeps no KV, only checks reservations."""

    hidden_width = 0  # the drafters here read no target state
    dtype = torch.float32

    def __init__(self, table, batch_size, eos=(EOS,)):
        self.table = table  # [V, V]
        self.info = TargetInfo(num_layers=8, hidden_size=4, vocab_size=V, eos_token_ids=eos)
        self.cache = object()
        self.reserved = {}
        self.calls = []

    def reserve(self, slot, n, flush=True):
        self.reserved[slot] = max(n, self.reserved.get(slot, 0))

    def capacity(self, slot):
        return self.reserved.get(slot, 0)

    def flush(self):
        pass

    def free(self, slot):
        self.reserved.pop(slot, None)

    def prefill(self, slot, prompt, start=0):
        return self.table[prompt[-1]], None

    def verify(self, tokens, tree, committed_len, num_nodes, kv_len):
        assert kv_len % 128 == 0 or kv_len == 64  # bucketed, or capped at max_seq_len
        self.calls.append("target_forward")
        return self.table[tokens], None  # [B, N, V]


def greedy_reference(table, prompt, n, eos=EOS):
    out, tok = [], prompt[-1]
    for _ in range(n):
        tok = int(table[tok].argmax())
        out.append(tok)
        if tok == eos:
            break
    return out


class ChainDrafter:
    """Proposes a chain of `depth` tokens from `guess(token) -> next token`."""

    reads = "nothing"  # required capabilities (specdec.strategies.Drafter)
    runs_on_host = False
    samples_drafts = False

    def __init__(self, depth, guess, log=None):
        self.depth, self.guess, self.log = depth, guess, log
        self.num_tree_slots = depth + 1

    def prefill(self, slot, next_tokens, hidden):
        pass

    def reset_slot(self, slot):
        pass

    def propose(self, state, max_kv_len=None, draft=True):
        if self.log is not None:
            self.log.append("draft")
        B = state.root_tokens.shape[0]
        toks = [state.root_tokens]
        for _ in range(self.depth):
            toks.append(self.guess(toks[-1]))
        tokens = torch.stack(toks, 1)  # [B, N]
        parents = torch.arange(-1, self.depth).expand(B, -1).clone()
        return DraftTree(tokens, parents, torch.full((B,), self.depth + 1))


def make_engine(table, drafter, config, log=None, eos=(EOS,)):
    pm = get_plugin_manager(load_entrypoints=False)

    class Plugin:
        @hookimpl(tryfirst=True)
        def specdec_strategy_names(self):
            return {"drafter": ["test-chain"]}

        @hookimpl(tryfirst=True)
        def specdec_capture_layers(self, config, target):
            if log is not None:
                log.append("resolve:capture")
            return ()

        @hookimpl(tryfirst=True)
        def specdec_draft(self, config, target):
            return drafter

        @hookimpl(tryfirst=True)
        def specdec_relocate_kv(self, config):
            def relocate(cache, committed_len, accept_nodes, accept_length):
                if log is not None:
                    log.append("relocate")

            return relocate

    pm.register(Plugin())
    strategies = resolve(config, TargetInfo(8, 4, V), pm)
    if log is not None:
        build, verify = strategies.build_tree, strategies.verifier

        def logged_build(*a, **k):
            log.append("build_tree")
            return build(*a, **k)

        class LoggedVerifier:
            lossless, needs_draft_probs = verify.lossless, verify.needs_draft_probs

            def __call__(self, *a, **k):
                log.append("verify")
                return verify(*a, **k)

        strategies = dataclasses.replace(strategies, build_tree=logged_build, verifier=LoggedVerifier())
    runner = BigramRunner(table, config.cache.max_batch_size, eos)
    gen = torch.Generator().manual_seed(0)
    return SpecEngine(config, runner, strategies, generator=gen), runner


def random_table(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g)


def test_one_step_runs_the_hooks_in_pipeline_order():
    log = []
    table = random_table(0)
    config = SpecConfig(drafter="test-chain", max_draft_len=3, max_batch_size=2)
    engine, runner = make_engine(table, ChainDrafter(3, lambda t: (t + 1) % V, log), config, log)
    assert log == ["resolve:capture", "build_tree"]  # the root-only tree, built once with the step
    engine.add_request([1, 2], SamplingParams(max_new_tokens=8, ignore_eos=True))
    runner.calls = log  # the target forward is logged into the same list
    log.clear()
    engine.step()
    assert log == ["draft", "build_tree", "target_forward", "verify", "relocate"]


@pytest.mark.parametrize("depth", [1, 3, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_with_an_oracle_drafter_equals_target_greedy(depth, seed):
    table = random_table(seed)
    oracle = lambda t: table[t].argmax(-1)  # noqa: E731 - the target's own continuation
    config = SpecConfig(drafter="test-chain", max_draft_len=depth, max_batch_size=3)
    engine, _ = make_engine(table, ChainDrafter(depth, oracle), config)
    prompts = [[1], [4, 2, 7], [3, 3]]
    reqs = [engine.add_request(p, SamplingParams(max_new_tokens=20 + i)) for i, p in enumerate(prompts)]
    engine.run_until_done(max_steps=100)
    for p, r in zip(prompts, reqs):
        assert r.token_ids == greedy_reference(table, p, r.params.max_new_tokens)
        assert len(r.token_ids) <= r.params.max_new_tokens
    long_runs = [r for r in reqs if r.finish_reason == "length"]
    for r in long_runs:  # an always-right drafter is fully accepted except at the end
        assert max(r.accepted_per_step) == depth


@pytest.mark.parametrize("seed", [0, 3])
def test_greedy_with_an_always_wrong_drafter_equals_target_greedy(seed):
    table = random_table(seed)
    wrong = lambda t: (table[t].argmax(-1) + 1) % V  # noqa: E731
    config = SpecConfig(drafter="test-chain", max_draft_len=4, max_batch_size=2)
    engine, _ = make_engine(table, ChainDrafter(4, wrong), config)
    reqs = [engine.add_request([5, 6], SamplingParams(max_new_tokens=15, ignore_eos=True))]
    engine.run_until_done(max_steps=100)
    assert reqs[0].token_ids == greedy_reference(table, [5, 6], 15, eos=-1)
    assert set(reqs[0].accepted_per_step) == {0}


def test_a_stop_token_inside_an_accepted_draft_ends_the_request_there():
    table = torch.full((V, V), -10.0)
    for t in range(V):  # greedy chain 0 -> 1 -> 2 -> ... -> 9 -> 0
        table[t, (t + 1) % (V - 1)] = 5.0
    oracle = lambda t: table[t].argmax(-1)  # noqa: E731
    config = SpecConfig(drafter="test-chain", max_draft_len=5, max_batch_size=1)
    engine, runner = make_engine(table, ChainDrafter(5, oracle), config)
    req = engine.add_request([0], SamplingParams(max_new_tokens=50, stop_token_ids=(4,)))
    engine.run_until_done(max_steps=10)
    assert req.token_ids == [1, 2, 3, 4] and req.finish_reason == "stop"
    assert runner.reserved == {}  # the slot's blocks were freed


def test_eos_inside_an_accepted_draft_ends_the_request_unless_ignored():
    table = torch.full((V, V), -10.0)
    table[:, EOS] = -20.0
    table[2, EOS] = 5.0  # 1 -> 2 -> EOS
    table[1, 2] = 5.0
    table[EOS, 1] = 5.0
    for t in (0, 3, 4, 5, 6, 7, 8, 9):
        table[t, 1] = 5.0
    oracle = lambda t: table[t].argmax(-1)  # noqa: E731
    config = SpecConfig(drafter="test-chain", max_draft_len=4, max_batch_size=2)
    engine, _ = make_engine(table, ChainDrafter(4, oracle), config)
    a = engine.add_request([0], SamplingParams(max_new_tokens=30))
    b = engine.add_request([0], SamplingParams(max_new_tokens=7, ignore_eos=True))
    engine.run_until_done(max_steps=20)
    assert a.token_ids == [1, 2, EOS] and a.finish_reason == "eos"
    assert b.token_ids == [1, 2, EOS, 1, 2, EOS, 1] and b.finish_reason == "length"


def test_slots_are_reused_after_requests_finish():
    table = random_table(5)
    oracle = lambda t: table[t].argmax(-1)  # noqa: E731
    config = SpecConfig(drafter="test-chain", max_draft_len=2, max_batch_size=2)
    engine, _ = make_engine(table, ChainDrafter(2, oracle), config)
    first = [engine.add_request([i], SamplingParams(max_new_tokens=3 + 4 * i, ignore_eos=True)) for i in range(2)]
    with pytest.raises(ConfigError, match=r"all 2 request slots are busy"):
        engine.add_request([1], SamplingParams())
    while not first[0].finished:
        engine.step()
    late = engine.add_request([7], SamplingParams(max_new_tokens=9, ignore_eos=True))
    assert late.slot == first[0].slot
    engine.run_until_done(max_steps=50)
    assert late.token_ids == greedy_reference(table, [7], 9, eos=-1)
    assert first[1].token_ids == greedy_reference(table, [1], 7, eos=-1)


@pytest.mark.parametrize(
    "prompt, params, message",
    [
        ([], SamplingParams(), r"prompt is empty"),
        ([3, 99], SamplingParams(), r"prompt token ids \[99\] are out of range; allowed: \[0, 11\)"),
        ([1] * 60, SamplingParams(max_new_tokens=10), r"prompt of 60 tokens \+ max_new_tokens=10 \+ 3 positions drafted ahead = 73 exceeds max_seq_len=64"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_error(prompt, params, message):
    config = SpecConfig(drafter="test-chain", max_draft_len=2, max_batch_size=1, max_seq_len=64)
    engine, _ = make_engine(random_table(0), ChainDrafter(2, lambda t: t), config)
    with pytest.raises(ConfigError, match=message):
        engine.add_request(prompt, params)
    assert engine.free_slots() == [0]
