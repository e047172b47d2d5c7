"""The adaptive rule replayed on recorded acceptance with step times measured on the H200
(`specdec.engine.adaptive_replay`): the replay's own bookkeeping, and what the rule is worth
at those costs (the decisions that cost `bench_batch.py` its target on the GPU, as numbers).

The step times are the H200's at 32cbac7 (bf16; `examples/bench_rule_replay.py` `MS`); the
SmolLM2 traces are the accepted lengths of an always-speculating EAGLE-3 chain D=5 with the
shipped head on the 20 held-out prompts (fp32, CPU, `examples/data/`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.engine.adaptive import BARE, DEFERRED, EXPLORE_SHARE, PLAIN, SPECULATIVE
from specdec.engine.adaptive_replay import StepTimes, replay, replay_warm

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"
MS = 1e-3
SMOLLM2_B1 = StepTimes(1.917 * MS, 1.330 * MS, 1.087 * MS, 0.994 * MS)  # spec, plain, deferred, target-only
SMOLLM2_B16 = StepTimes(2.780 * MS, 1.309 * MS, 1.309 * MS, 1.322 * MS)
EIGHT_B_B4 = StepTimes(8.002 * MS, 5.199 * MS, 4.907 * MS, 4.851 * MS)
EIGHT_B_B16 = StepTimes(9.247 * MS, 5.714 * MS, 5.389 * MS, 5.330 * MS)
EIGHT_B_B64 = StepTimes(15.253 * MS, 6.838 * MS, 6.241 * MS, 6.341 * MS)
SMOLLM2_B4 = StepTimes(2.174 * MS, 1.330 * MS, 1.073 * MS, 1.033 * MS)
SMOLLM2_B64 = StepTimes(3.935 * MS, 1.957 * MS, 1.957 * MS, 1.664 * MS)
SMOLLM2_BUCKETS = {1: SMOLLM2_B1, 4: SMOLLM2_B4, 16: SMOLLM2_B16, 64: SMOLLM2_B64}


def smollm2_traces(*names: str) -> list[list[int]]:
    """Accepted lengths per request of the trace files `acceptance_smollm2_e3_{name}.jsonl`
    (default: the held-out prompts)."""
    traces = []
    for name in names or ("heldout",):
        with open(DATA / f"acceptance_smollm2_e3_{name}.jsonl") as f:
            traces += [json.loads(line)["accepted"] for line in f]
    return traces


# ----------------------------------------------------------------------------- bookkeeping
def test_fixed_policies_emit_every_token_in_the_steps_they_should():
    times = StepTimes(3.0, 2.0, 1.0, 0.5)
    plain = replay([[0]], times, batch=2, new_tokens=12, requests=3, policy="never")
    assert plain.tokens == 36
    # 3 requests, 2 slots: 12 steps for two, then 12 for the third; a path holds D + 1 = 6 rows,
    # so every 6th step of a request ingests (plain), the rest defer
    assert plain.steps == {SPECULATIVE: 0, PLAIN: 4, DEFERRED: 20, BARE: 0}
    assert plain.seconds == 4 * 2.0 + 20 * 1.0
    spec = replay([[5]], times, batch=2, new_tokens=12, requests=3, policy="always")
    assert spec.tokens == 36 and spec.steps[SPECULATIVE] == 4  # 6 tokens a step: 2 steps each, 2 rounds
    only = replay([[5]], times, batch=2, new_tokens=12, requests=3, policy="no-drafter")
    assert only.tokens == 36 and only.seconds == 24 * 0.5


def test_a_speculative_step_cut_by_max_new_tokens_emits_only_what_is_left():
    run = replay([[5]], StepTimes(1.0, 1.0, 1.0), batch=1, new_tokens=8, policy="always")
    assert run.tokens == 8 and run.steps[SPECULATIVE] == 2  # 6, then 2 of 6


@pytest.mark.parametrize("kw, match", [
    (dict(policy="sometimes"), "policy='sometimes'"),
    (dict(traces=[[6]]), r"\[0, depth=5\]"),
    (dict(traces=[[]]), "at least one"),
    (dict(batch=0), "batch=0"),
    (dict(policy="no-drafter", times=StepTimes(1.0, 1.0, 1.0)), "target_only"),
])
def test_bad_arguments_are_errors_that_name_them(kw, match):
    args = dict(traces=[[1]], times=StepTimes(1.0, 1.0, 1.0, 1.0), batch=1, new_tokens=4)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        replay(args.pop("traces"), args.pop("times"), **args)


def test_a_runs_tail_steps_in_the_smallest_bucket_that_holds_its_requests():
    """Step times per bucket: 3 requests in a batch of 4 (bucket 4), one of them longer, whose
    last steps run alone (bucket 1), as the engine's smaller captured graphs do."""
    one, four = StepTimes(1.0, 1.0, 1.0, 1.0), StepTimes(4.0, 4.0, 4.0, 4.0)
    traces = [[0], [0], [0]]
    run = replay(traces, {1: one, 4: four, 16: StepTimes(9.0, 9.0, 9.0, 9.0)}, batch=4, new_tokens=3,
                 requests=3, policy="no-drafter")
    assert run.tokens == 9 and run.seconds == 3 * 4.0  # 3 steps of 3 requests: bucket 4, never 16
    run = replay([[0], [5]], {1: one, 4: four}, batch=4, new_tokens=12, requests=2, policy="always")
    # request 1 (6 tokens a step) is done in 2 steps, request 0 (1 a step) runs 10 more alone
    assert run.tokens == 24 and run.steps[SPECULATIVE] == 12 and run.seconds == 2 * 4.0 + 10 * 1.0
    # one bucket's times price the tail at that bucket (the replay before step times per bucket)
    assert replay([[0], [5]], four, batch=4, new_tokens=12, requests=2, policy="always").seconds == 12 * 4.0


@pytest.mark.parametrize("times, match", [
    ({1: StepTimes(1.0, 1.0, 1.0)}, r"batch=4 exceeds the largest bucket with step times \(1\)"),
    ({0: StepTimes(1.0, 1.0, 1.0)}, r"bucket sizes >= 1; got \[0\]"),
    ({4: 1.0}, "must be StepTimes"),
    ({}, "bucket sizes"),
])
def test_bad_step_times_per_bucket_are_errors_that_name_them(times, match):
    with pytest.raises(ValueError, match=match):
        replay([[1]], times, batch=4, new_tokens=4)


def test_step_times_must_be_positive():
    with pytest.raises(ValueError, match=r"StepTimes.plain=0"):
        StepTimes(1.0, 0, 1.0)


# ----------------------------------------------------------------------------- what the rule is worth
@pytest.mark.parametrize("times, batch", [(EIGHT_B_B4, 4), (EIGHT_B_B16, 16), (EIGHT_B_B64, 64)])
def test_with_a_head_never_right_probes_cost_at_most_the_exploration_share(times, batch):
    """8B shape, drafts never accepted: the rule runs the plain steps a fixed plain policy
    runs, and its speculative probes cost at most EXPLORE_SHARE of the run. (Before probes
    were priced, the doubling schedule alone probed 3-4 times in such a run: 0.984x plain at
    batch 16, 0.968x at 64 here; on the H200 at 32cbac7 4-5 probes cost batch 4 and 16
    1.3-2.2%: `notes/gpu/issue22/bench_8b_none_4_16_32cbac7.log`.)"""
    kw = dict(batch=batch, new_tokens=64, requests=2 * batch)
    plain = replay([[0]], times, policy="never", **kw)
    adaptive = replay_warm([[0]], times, **kw)
    assert adaptive.tokens == plain.tokens
    assert adaptive.tokens_per_second >= (1 - EXPLORE_SHARE - 0.002) * plain.tokens_per_second
    assert adaptive.steps[SPECULATIVE] <= 1


@pytest.mark.parametrize("times, batch, explorers", [(EIGHT_B_B4, 4, 1), (EIGHT_B_B16, 16, 0), (EIGHT_B_B64, 64, 0)])
def test_with_a_head_never_right_requests_come_in_without_the_drafter_and_beat_the_plain_policy(times, batch, explorers):
    """The same head, its requests admitted after a warm-up: they come in without the drafter
    (it pays in no bucket), and while none of them drafts the step is the bare one (priced here
    at the cheaper of the deferred and target-only steps). At batch 4 one is admitted to
    explore: beside three undrafted requests, an explorer whose every draft were accepted
    could make a speculative step pay, so its evidence can come in. At batch 16 and 64 it could
    not (on the H200 such an explorer ran ~60 deferred and ingesting steps of ~128 and no
    speculative one), so none is admitted and every step is bare. With every request drafting,
    a fixed plain policy runs one ingest per D + 1 steps; the rule beats it (at 12501d9's rule
    it could not: 0.998-1.000x)."""
    kw = dict(batch=batch, new_tokens=64, requests=2 * batch)
    plain = replay([[0]], times, policy="never", **kw)
    warm = replay([[0]], times, policy="adaptive", **dict(kw, new_tokens=8))  # as `replay_warm`, counted apart
    warm.rule.admissions = {True: 0, False: 0}
    adaptive = replay([[0]], times, policy="adaptive", rule=warm.rule, **kw)
    assert adaptive.rule.admissions == {True: explorers, False: 2 * batch - explorers}
    assert adaptive.steps[PLAIN] <= plain.steps[PLAIN] / 2 and adaptive.steps[BARE] > 0, (adaptive.steps, plain.steps)
    if not explorers:
        assert adaptive.steps[BARE] == sum(adaptive.steps.values()), adaptive.steps
    assert adaptive.tokens_per_second > 1.003 * plain.tokens_per_second


@pytest.mark.parametrize("times, batch", [(SMOLLM2_B1, 1), (SMOLLM2_B16, 16)])
def test_with_the_shipped_head_it_is_within_one_percent_of_the_better_fixed_choice(times, batch):
    """SmolLM2 and its head (tau ~3.3): speculating pays at batch 1 (1.7x) and barely at 16
    (1.1x); the rule must not lose it to plain steps chosen on a few short drafts (at 32cbac7
    batch 1 ran 29 plain steps in 333 on the H200; here, with a request's own evidence weighed
    against one pseudo-observation of the pool instead of two, 0.985x the fixed chain)."""
    traces = smollm2_traces()
    kw = dict(batch=batch, new_tokens=128, requests=max(len(traces), 2 * batch))
    best = max(replay(traces, times, policy=p, **kw).tokens_per_second for p in ("always", "never"))
    assert replay_warm(traces, times, **kw).tokens_per_second >= 0.99 * best


def test_at_batch_64_its_decisions_match_the_better_fixed_choice_when_the_tail_steps_in_smaller_buckets():
    """SmolLM2 batch 64 at the H200's step times (32cbac7): priced at bucket 64 throughout, the
    run's tail (few requests left, long ones) made speculating look worse than it is and the
    replay put the rule at 0.907x the better fixed choice; with the tail in smaller buckets, as
    the engine runs it, the rule is within 1% of it (0.997x, `bench_rule_replay.py`; both
    trace files, as there: the category prompts' low-acceptance requests make the long tail)."""
    traces = smollm2_traces("heldout", "categories")
    kw = dict(batch=64, new_tokens=128, requests=128)

    def decisions(times) -> float:  # adaptive over the better of always and never speculating
        best = max(replay(traces, times, policy=p, **kw).tokens_per_second for p in ("always", "never"))
        return replay_warm(traces, times, **kw).tokens_per_second / best

    assert decisions(SMOLLM2_BUCKETS) >= 0.99
    assert decisions(SMOLLM2_B64) < 0.95  # the same run priced at bucket 64 throughout (0.907x)
