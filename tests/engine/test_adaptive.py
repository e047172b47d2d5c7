"""Adaptive speculation in the engine (`SpecConfig(adaptive=True)`): greedy output stays exactly
target-only whichever step runs (the rule's own choices, and random ones), a drafter that is
never accepted ends up running plain steps, an oracle drafter keeps speculating, the cost
model holds both steps of every bucket, and every decision reaches a step observer with its
prediction and its measured outcome. The rule alone: test_adaptive_rule.py."""

from __future__ import annotations

import random

import pytest
import torch

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder
from specdec.engine.adaptive import DecisionLog, StepCosts

from _mtp_heads import bigram_oracle_mtp, e2e_cpu, random_mtp  # noqa: F401

pytestmark = [
    pytest.mark.usefixtures("e2e_cpu"),
    pytest.mark.filterwarnings("ignore:drafter=.* accepts almost nothing:UserWarning"),
]
PROMPTS = [[5, 17, 33], [9] * 11 + [40, 2], [71], [3, 14, 15, 92, 65], [60, 61]]
BASE = dict(max_batch_size=2, max_seq_len=112, kv_block_size=4)


@pytest.fixture(scope="module")
def targets(tiny_llama8, bigram_llama, tiny_eagle3_head):
    return dict(llama=specdec.load_target(tiny_llama8), bigram=specdec.load_target(bigram_llama), head=tiny_eagle3_head)


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
    variants = ["bare", "deferred", "plain", "speculative"] if draft in ("eagle3", "oracle") else ["plain", "speculative"]
    assert sorted(dec.engine.adaptive_rule.costs.warm) == [(b, v) for b in (1, 2) for v in variants]
    assert _run(dec) == plain


class PlantedCosts(StepCosts):
    """Step seconds fixed by the test (as at a large batch: the speculative step dearer), so the
    decisions follow acceptance and not this machine's timing noise."""

    def __init__(self, speculative: float, plain: float) -> None:
        super().__init__()
        self.fixed = {"speculative": speculative, "plain": plain, "deferred": plain, "bare": plain}

    def __call__(self, bucket, variant):
        return self.fixed[variant]


def test_a_never_accepted_drafter_runs_plain_steps_and_an_oracle_speculates(targets):
    never = SpecDecoder.from_pretrained(targets["llama"], random_mtp(seed=0), SpecConfig(**BASE, drafter="mtp", max_draft_len=4, adaptive=True))
    oracle = SpecDecoder.from_pretrained(targets["bigram"], bigram_oracle_mtp(), SpecConfig(**BASE, drafter="mtp", max_draft_len=4, adaptive=True))
    for dec in (never, oracle):
        dec.warmup(progress=False)
        dec.engine.adaptive_rule.costs = PlantedCosts(speculative=2.0, plain=1.0)
        _run(dec, n=60)
    n_spec, n_plain = never.engine.adaptive_rule.decisions[True], never.engine.adaptive_rule.decisions[False]
    # 5 prompts x 60 tokens on 2 slots: ~150 plain steps; speculative: the first (optimistic)
    # steps and the probes (rare: paid from the bucket's exploration budget, `adaptive.py`)
    assert n_plain > 10 * n_spec, never.engine.adaptive_rule.decisions
    o_spec, o_plain = oracle.engine.adaptive_rule.decisions[True], oracle.engine.adaptive_rule.decisions[False]
    assert o_plain <= never.engine.adaptive_rule.probes and o_spec > 6 * o_plain, oracle.engine.adaptive_rule.decisions


def test_greedy_output_is_exact_whatever_the_rule_decides(targets):
    """Random decisions (a seeded coin per step) switch between the speculative and the plain
    step at every point a request can be in; the output stays target-only's."""
    plain = _run(SpecDecoder(targets["llama"], SpecConfig(**BASE, drafter="none")))
    for cfg in (dict(drafter="eagle3", max_draft_len=3), dict(drafter="eagle3", tree="dynamic", topk=3, max_draft_len=3)):
        dec = SpecDecoder.from_pretrained(targets["llama"], targets["head"], SpecConfig(**BASE, **cfg, adaptive=True))
        dec.warmup(progress=False)
        coin = random.Random(7)
        rule = dec.engine.adaptive_rule
        rule.choose = lambda bucket, running, plain: coin.random() < 0.5
        assert _run(dec) == plain
        assert rule.last is None  # the planted choose bypassed the rule


def test_every_decision_reaches_an_observer_with_its_prediction_and_outcome(targets):
    dec = SpecDecoder.from_pretrained(targets["llama"], targets["head"], SpecConfig(**BASE, drafter="eagle3", max_draft_len=3, adaptive=True))
    dec.warmup(progress=False)
    log = DecisionLog()
    dec.add_observer(log)
    results = dec.generate(PROMPTS[:2], SamplingParams(max_new_tokens=12, ignore_eos=True))
    steps = len(results[0].stats.accepted_per_step)
    assert len(log.decisions) == steps == len(results[1].stats.accepted_per_step)  # 2 prompts, 2 slots: in lockstep
    for i, d in enumerate(log.decisions):
        assert d.bucket == 2 and d.requests == 2
        assert d.tokens[False] == 2.0 and 2.0 <= d.tokens[True] <= 2 * 4  # 1 + up to 3 drafts per request
        emitted = sum(r.stats.accepted_per_step[i] + 1 for r in results)
        assert d.measured_tokens == emitted and d.measured_seconds > 0
        assert d.speculative or all(r.stats.accepted_per_step[i] == 0 for r in results)
    rows = log.summary()
    assert sum(r["steps"] for r in rows) == steps
    # every token after the prefill's first came from a step (the last step may overshoot the length)
    assert sum(r["tokens"] for r in rows) >= sum(len(r.token_ids) - 1 for r in results)


@pytest.mark.parametrize("cfg", [dict(max_draft_len=3), dict(tree="dynamic", topk=3, max_draft_len=3)], ids=["chain", "tree"])
def test_deferred_plain_steps_leave_the_drafter_where_ingesting_ones_do(targets, cfg):
    """Plain steps that skip the drafter (their tokens join the path it ingests later) must
    feed it exactly what plain steps that run it do: under one forced decision sequence, the
    drafter's state after every speculative step (which has ingested everything) agrees with
    that of an engine whose plain steps all ingest, and so do the outputs."""
    pattern = "PPPPPSPSSPPPPPPPPSPPSPPPSSS" * 4

    def run(defer: bool):
        dec = SpecDecoder.from_pretrained(targets["llama"], targets["head"], SpecConfig(**BASE, drafter="eagle3", **cfg, adaptive=True))
        engine = dec.engine
        if not defer:
            engine.defer_depth = None
        dec.warmup(progress=False)
        decisions = iter(pattern)
        kinds, states = [], []
        engine.adaptive_rule.choose = lambda bucket, running, plain: (kinds.append(plain), next(decisions) == "S")[1]
        drafter = engine.strategies.drafter

        class AfterSpeculativeSteps:
            def on_step(self, engine, accept_length):
                if pattern[len(kinds) - 1] == "S":
                    states.append((drafter.root_logits[:2].clone(), drafter.ctx_hidden[:2].clone()))

        dec.add_observer(AfterSpeculativeSteps())
        out = dec.generate(PROMPTS[:2], SamplingParams(max_new_tokens=60, ignore_eos=True))
        return out, kinds, states

    (ref, ref_kinds, ref_states), (got, kinds, states) = run(False), run(True)
    assert set(ref_kinds) == {"plain"} and "deferred" in kinds and "plain" in kinds  # runs of 5+ plain steps hit the depth
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]
    assert [r.stats.accepted_per_step for r in got] == [r.stats.accepted_per_step for r in ref]
    assert len(states) == len(ref_states) >= 10
    for (logits, ctx), (ref_logits, ref_ctx) in zip(states, ref_states):
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ctx, ref_ctx, rtol=1e-4, atol=1e-4)


def _forced(dec, pattern: str):
    """Force the rule's choices: 'S' speculative, anything else the plain step due."""
    decisions = iter(pattern)
    dec.engine.adaptive_rule.choose = lambda bucket, running, plain: next(decisions, "P") == "S"


def test_a_plain_step_runs_no_draft_forward_and_verifies_the_root_alone(targets, monkeypatch):
    """An ingesting plain step runs the drafter's ingest forward only (the draft loop once ran
    there too and its trees were thrown away: the plain step cost what a speculative one did),
    and the engine's verifier picks its token on a one-node tree (the greedy walk, not a sort
    over the vocabulary)."""
    ref = _run(SpecDecoder(targets["llama"], SpecConfig(**BASE, drafter="none")), n=12)
    dec = SpecDecoder.from_pretrained(targets["llama"], targets["head"],
                                      SpecConfig(**BASE, drafter="eagle3", max_draft_len=3, adaptive=True))
    dec.engine.defer_depth = None  # every plain step ingests
    dec.warmup(progress=False)
    drafter, verifier_type = dec.engine.strategies.drafter, type(dec.engine.strategies.verifier)
    forwards, trees = [], []
    inner_forward, inner_verifier = drafter._forward, verifier_type.__call__

    def forward(*args, first: bool, logits_rows=None, **kw):
        if logits_rows is None:  # a step's forward (a prompt's keeps only its last rows' logits)
            forwards[-1].append(first)
        return inner_forward(*args, first=first, logits_rows=logits_rows, **kw)

    def verifier(self, tokens, *args, **kw):
        trees.append(tokens.shape[1])
        return inner_verifier(self, tokens, *args, **kw)

    drafter._forward = forward
    monkeypatch.setattr(verifier_type, "__call__", verifier)
    pattern = "SPPSPP"

    class StepMarks:
        def on_step(self, engine, accept_length):
            forwards.append([])

    forwards.append([])
    dec.add_observer(StepMarks())
    _forced(dec, pattern)
    assert [r.token_ids for r in dec.generate(PROMPTS[:2], SamplingParams(max_new_tokens=12, ignore_eos=True))] == ref[:2]
    steps = forwards[:-1]  # the last entry opened after the last step
    assert len(steps) >= len(pattern) and trees == [4 if k == "S" else 1 for k in pattern + "P" * (len(steps) - len(pattern))]
    for kind, calls in zip(pattern, steps):  # chain D=3: 4 nodes; plain: the root alone
        if kind == "S":  # the ingest, then one forward per draft depth after the root's
            assert calls == [True, False, False], steps
        else:
            assert calls == [True], steps  # the ingest alone


def test_root_only_trees_are_built_once_not_per_step(targets):
    """Target-only steps (N = 1) and plain steps (ingesting and deferred) verify the root-only
    tree built when the step was made: no tree is built per step (that was one launch per
    step), only the speculative steps' trees are, and the tree built once is what the builder
    gives for the root alone, at every bucket's rows."""
    from specdec.ops import build_tree

    ref = _run(SpecDecoder(targets["llama"], SpecConfig(**BASE, drafter="none")), n=12)
    plain = SpecDecoder(targets["llama"], SpecConfig(**BASE, drafter="none"))
    adaptive = SpecDecoder.from_pretrained(targets["llama"], targets["head"],
                                           SpecConfig(**BASE, drafter="eagle3", max_draft_len=3, adaptive=True))
    for dec, pattern in ((plain, None), (adaptive, "PPSPPPPPSP")):
        builds, s = [], dec.engine.strategies
        inner = s.build_tree

        def counted(parents, num_nodes, *args, inner=inner, builds=builds, **kw):
            builds.append(parents.shape[1])
            return inner(parents, num_nodes, *args, **kw)

        object.__setattr__(s, "build_tree", counted)  # the resolved strategies are frozen
        if pattern is not None:
            _forced(dec, pattern)
        assert _run(dec, n=12) == ref
        speculative = 0 if pattern is None else pattern.count("S")
        assert builds == [4] * speculative, builds  # chain D=3: 4 nodes; nothing built for a root-only step
        B = BASE["max_batch_size"]
        want = build_tree(torch.full((B, 1), -1), torch.ones(B, dtype=torch.int64))
        got = dec.engine.state.tree1
        for name in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index"):
            assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name


@pytest.mark.parametrize("verifier, cfg", [("target-only", dict(max_draft_len=3)),
                                           ("speculative", dict(tree="dynamic", topk=2, max_draft_len=3))])
def test_sampled_plain_steps_draw_what_target_only_decoding_draws(targets, verifier, cfg):
    """A sampled request's plain steps draw with the verifiers' rule and the step's counter-based
    uniforms (node 0's lanes), so an engine that only runs plain steps emits, seed for seed,
    exactly the tokens of target-only decoding with the target-only verifier, whose one-node
    trees draw the same way (what makes its output follow the target distribution, which
    test_sampling checks statistically)."""
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True, temperature=0.9, top_p=0.95, seed=s) for s in (3, 11)]
    ref = SpecDecoder(targets["llama"], SpecConfig(**BASE, drafter="none", verifier="target-only"))
    want = [r.token_ids for r in ref.generate(PROMPTS[:2], params)]
    dec = SpecDecoder.from_pretrained(targets["llama"], targets["head"],
                                      SpecConfig(**BASE, drafter="eagle3", verifier=verifier, **cfg, adaptive=True))
    dec.warmup(progress=False)
    _forced(dec, "")
    assert [r.token_ids for r in dec.generate(PROMPTS[:2], params)] == want
