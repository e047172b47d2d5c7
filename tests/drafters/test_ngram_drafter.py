"""The n-gram drafter on token streams: options, matching, trees grown by the tree policies,
slot lifecycle, and the acceptance it reaches on repetitive text under an oracle verifier (the
true continuation)."""

import random

import pytest
import torch

from specdec.config import ConfigError, SpecConfig
from specdec.drafters.ngram_drafter import NgramDrafter, NgramIndex, NgramOptions
from specdec.step_state import StepState


def cfg(**kw):
    return SpecConfig(**{"drafter": "ngram", "max_batch_size": 2, "max_seq_len": 2048, **kw})


def test_options_default_from_the_config_and_bad_values_are_clear_errors():
    assert NgramOptions.from_config(cfg(max_draft_len=5)) == NgramOptions(1, 3)
    assert NgramOptions.from_config(cfg(), {"min_match": 2, "max_match": 4}) == NgramOptions(2, 4)
    bad = [
        ({"min_match": 4}, r"\['min_match'\]=4 is out of range; allowed: \[1, 3\]"),
        ({"max_match": 0}, r"\['max_match'\]=0 is out of range; allowed: \[1, 64\]"),
        ({"max_match": 2.5}, r"\['max_match'\] must be an int, got 2.5"),
        ({"window": 3}, r"unknown keys \['window'\]; allowed: \['max_match', 'min_match'\]"),
        # the tree's size and branching moved to the tree policy (tree, topk, max_total_draft_tokens)
        ({"max_branches": 2}, r"keys \['max_branches'\] were removed: the tree's size and branching belong to the tree policy"),
    ]
    for options, message in bad:
        with pytest.raises(ConfigError, match=message):
            NgramOptions.from_config(cfg(), options)


def index_of(tokens, lo=1, hi=3):
    index = NgramIndex(lo, hi)
    index.extend(tokens)
    return index


def test_the_longest_matching_suffix_wins_and_children_rank_by_count_then_recency():
    #          a b c 1 2 . b c 7 8 . a b c 3 4 . a b c 1 2 . x a b c
    stream = [10, 11, 12, 1, 2, 0, 11, 12, 7, 8, 0, 10, 11, 12, 3, 4, 0, 10, 11, 12, 1, 2, 0, 9, 10, 11, 12]
    index = index_of(stream)
    occ = index.match()
    assert occ == [2, 13, 19]  # "a b c" (n=3) matched; "b c 7 8" (n=2) never considered
    kids = index.children(occ)
    assert [(tok, count) for tok, count, _ in kids] == [(1, 2), (3, 1)]  # 1 twice, then 3
    assert [(tok, count) for tok, count, _ in index.children(kids[0][2])] == [(2, 2)]  # then 2 after "1"
    recency = index_of([10, 11, 12, 5, 0, 10, 11, 12, 6, 0, 10, 11, 12])
    assert [tok for tok, _, _ in recency.children(recency.match())] == [6, 5]  # tie: the most recent first
    assert index_of([1, 2, 3, 4]).match() == []  # nothing repeats
    assert index_of([5, 1, 2, 9, 1, 2], lo=3, hi=3).match() == []  # below min_match
    tail = index_of([5, 1, 2, 9, 1, 2], lo=2, hi=3)
    node = tail.match()
    for want in (9, 1, 2):  # the continuation stops at the history's end
        (tok, _, node), = tail.children(node)
        assert tok == want
    assert tail.children(node) == []


def test_a_dynamic_tree_over_counted_continuations_keeps_the_likeliest_branches():
    c = cfg(tree="dynamic", topk=2, max_draft_len=2, max_total_draft_tokens=4)
    d = NgramDrafter(c, NgramOptions.from_config(c))
    # after "0 7": 1 2 (three times), 3 4 (twice), 5 6 (once)
    history = [0, 7, 1, 2, 0, 7, 1, 2, 0, 7, 3, 4, 0, 7, 1, 2, 0, 7, 3, 4, 0, 7, 5, 6, 0, 7]
    d.prefill(0, torch.tensor(history), None)
    tokens, parents, num_nodes = d.propose_host([-1, -1], [[], []], [7, 0], [True, False])
    assert tokens[0].tolist() == [7, 1, 3, 2, 4] and parents[0].tolist() == [-1, 0, 0, 1, 2]
    assert num_nodes.tolist() == [5, 1]
    linear = cfg(max_draft_len=4)
    chain = NgramDrafter(linear, NgramOptions.from_config(linear))
    chain.prefill(0, torch.tensor([1, 2, 3, 1]), None)  # "1" -> 2 3 1, then the history ends
    tokens, parents, num_nodes = chain.propose_host([-1, -1], [[], []], [1, 0], [True, False])
    assert num_nodes.tolist() == [4, 1]  # a shorter chain: no continuation past the end
    assert tokens[0, :4].tolist() == [1, 2, 3, 1] and parents[0].tolist() == [-1, 0, 1, 2, -1]


def test_sampling_tree_policies_are_refused_by_name():
    c = cfg(tree="sampled", topk=2, max_draft_len=2)
    with pytest.raises(ConfigError, match=r"drafter='ngram' ranks counted continuations; tree='sampled' needs i.i.d. draws"):
        NgramDrafter(c, NgramOptions.from_config(c))


class Stream:
    """Drive an `NgramDrafter` like the engine does, with a verifier that knows the truth: a
    node is accepted iff it is the true next token (greedy verification of a target whose
    greedy output is `truth`)."""

    def __init__(self, drafter, prompt, truth):
        self.d, self.truth = drafter, truth
        N = drafter.num_tree_slots
        self.pos = 0  # truth[:pos] emitted; truth[pos - 1] is the root
        drafter.prefill(0, torch.tensor(prompt[1:] + truth[:1]), None)
        self.pos = 1
        self.accept_length = torch.tensor([-1, -1])
        self.accept_tokens = torch.full((2, N), -1)
        self.steps = []

    def step(self):
        inp = StepState.for_drafting(
            root_tokens=torch.tensor([self.truth[self.pos - 1], 0]), committed_len=torch.zeros(2, dtype=torch.int64),
            accept_length=self.accept_length, accept_tokens=self.accept_tokens, active=torch.tensor([True, False]),
        )
        tree = self.d.propose(inp)
        assert int(tree.num_nodes[1]) == 1  # the idle slot drafts nothing
        toks, par, n = tree.tokens[0].tolist(), tree.parents[0].tolist(), int(tree.num_nodes[0])
        node, path = 0, []
        while self.pos + len(path) < len(self.truth):
            want = self.truth[self.pos + len(path)]
            child = next((j for j in range(1, n) if par[j] == node and toks[j] == want), None)
            if child is None:
                break
            node = child
            path.append(want)
        a = len(path)
        emitted = path + self.truth[self.pos + a : self.pos + a + 1]  # + the bonus
        self.accept_length = torch.tensor([a, -1])
        self.accept_tokens = torch.full_like(self.accept_tokens, -1)
        self.accept_tokens[0, : len(emitted)] = torch.tensor(emitted)
        self.pos += len(emitted)
        self.steps.append(len(emitted))

    def run(self):
        while self.pos < len(self.truth) - 1:
            self.step()
        return sum(self.steps) / len(self.steps)


def code_file(rng, n_lines=40):
    """A token stream shaped like code: lines of keyword / identifier / punctuation ids, with
    a function name (id 99) used on several lines."""
    lines = []
    for i in range(n_lines):
        line = [rng.choice([20, 21, 22]), rng.randrange(30, 80), 1, rng.randrange(30, 80), 2]
        if i % 5 == 0:
            line[1] = 99  # the function name
        lines.append(line + [3])  # 3 = newline
    return [t for line in lines for t in line]


@pytest.mark.parametrize("tree", [dict(tree="linear"), dict(tree="dynamic", topk=3, max_total_draft_tokens=12)])
def test_repeating_a_code_file_with_a_renamed_function_reaches_mean_acceptance_over_3(tree):
    rng = random.Random(0)
    file = code_file(rng)
    prompt = [7, 8] + file + [5, 6]  # "Here is a file: <file>. Repeat it with the function renamed"
    truth = [100 if t == 99 else t for t in file]  # the copy, with the function renamed
    d = NgramDrafter(cfg(max_draft_len=6, **tree), NgramOptions.from_config(cfg(max_draft_len=6, **tree)))
    mean = Stream(d, prompt, truth).run()
    assert mean >= 3.0, mean


def test_a_tree_of_continuations_beats_a_chain_where_the_history_branches():
    rng = random.Random(1)
    endings = [[40, 41, 42, 43], [50, 51, 52, 53], [60, 61, 62, 63]]
    stem = [10, 11, 12]
    history = []
    for _ in range(12):  # the same stem, followed by one of three endings, at random
        history += stem + rng.choice(endings) + [rng.randrange(70, 90)]
    truth = []
    for _ in range(12):
        truth += stem + rng.choice(endings) + [rng.randrange(70, 90)]
    means = {}
    for name, shape in {"chain": {}, "tree": dict(tree="dynamic", topk=3, max_total_draft_tokens=12)}.items():
        c = cfg(max_draft_len=4, **shape)
        means[name] = Stream(NgramDrafter(c, NgramOptions.from_config(c)), history, truth).run()
    assert means["tree"] > means["chain"] + 0.3, means


def test_reset_slots_draft_root_only_and_a_history_out_of_sync_is_an_error():
    c = cfg(max_draft_len=3)
    d = NgramDrafter(c, NgramOptions.from_config(c))
    d.prefill(0, torch.tensor([1, 2, 3, 1, 2]), None)
    inp = StepState.for_drafting(
        root_tokens=torch.tensor([2, 0]), committed_len=torch.tensor([6, 0]), accept_length=torch.tensor([-1, -1]),
        accept_tokens=torch.full((2, 4), -1), active=torch.tensor([True, True]),
    )
    t = d.propose(inp)
    assert t.tokens[0].tolist() == [2, 3, 1, 2] and t.parents[0].tolist() == [-1, 0, 1, 2]
    assert t.num_nodes.tolist() == [4, 1] and t.parents[1].tolist() == [-1] * 4
    d.reset_slot(0)
    assert d.propose(inp).num_nodes.tolist() == [1, 1]
    d.prefill(0, torch.tensor([1, 2, 3, 1, 2]), None)
    inp.root_tokens = torch.tensor([7, 0])
    with pytest.raises(RuntimeError, match=r"out of sync in slot 0: history ends with 2, root token is 7"):
        d.propose(inp)
    with pytest.raises(ValueError, match=r"slot=2 is out of range; allowed: \[0, 2\)"):
        d.reset_slot(2)
