"""The adaptive speculation rule alone (`specdec.engine.adaptive`), with planted step times and
acceptance histories: its estimates match hand computations, it speculates exactly when the
expected tokens per second say so, it probes the other variant at doubling intervals (plain
only while it could win at its warm-up time) when the bucket's exploration budget covers the
probe's predicted loss, resets the interval when a probe flips the choice, ages a request's
evidence on plain steps, and after a request's acceptance collapses it stops speculating
within a bounded number of steps. Exact decision sequences are pinned. (What the rule is worth
at the H200's step times, on recorded acceptance: `test_adaptive_replay.py`.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specdec.engine.adaptive import (BARE, DEFERRED, EXPLORE_SHARE, FIRST_INTERVAL, PLAIN, SPECULATIVE, AdaptiveRule,
                                     DepthAcceptance, StepCosts, plain_step_due)

D = 4  # draft depth of the planted engine (a chain: N - 1 = 4 drafts)


@dataclass
class Req:
    budget: int = D
    acceptance: DepthAcceptance | None = None


def planted_rule(spec_s: float, plain_s: float, buckets=(1, 4, 64)) -> AdaptiveRule:
    rule = AdaptiveRule(D, chain=True, full_budget=D)
    for b in buckets:
        rule.costs.record(b, SPECULATIVE, [spec_s])
        rule.costs.record(b, PLAIN, [plain_s])
    return rule


def drive(rule: AdaptiveRule, requests, accepts, steps: int, bucket: int, spec_s: float, plain_s: float) -> str:
    """Run `steps` decisions; `accepts(step, i)` = the accepted length request i would get if
    the step speculates. Returns the choices as a string: S speculative, P plain, lower case = a probe."""
    out = []
    for step in range(steps):
        spec = rule.choose(bucket, requests)
        emitted = 0
        for i, r in enumerate(requests):
            a = min(accepts(step, i), r.budget) if spec else 0
            if spec:
                rule.observe(r, a)
            emitted += a + 1
        rule.measured(bucket, SPECULATIVE if spec else PLAIN, emitted, spec_s if spec else plain_s)
        letter = "S" if spec else "P"
        out.append(letter.lower() if rule.last.probe else letter)
    return "".join(out)


# ----------------------------------------------------------------------------- estimates
def test_expected_tokens_is_one_plus_the_sum_of_survival_products():
    est = DepthAcceptance(3, forget=1.0)  # no forgetting: plain counts; one pseudo-observation of
    for a in (3, 1, 0, 3):  # p = 1 at depth 1 and of the depth above's estimate deeper down
        est.observe(a, 3)  # depth 1 tried 4x, accepted 3x; depth 2 tried 3x, 2x; depth 3 tried 2x, 2x
    p1 = (3 + 1) / (4 + 1)
    p2 = (2 + p1) / (3 + 1)
    p3 = (2 + p2) / (2 + 1)
    assert est.p(1) == pytest.approx(p1) and est.p(2) == pytest.approx(p2) and est.p(3) == pytest.approx(p3)
    assert est.expected_tokens(3) == pytest.approx(1 + p1 + p1 * p2 + p1 * p2 * p3)
    assert est.expected_tokens(1) == pytest.approx(1 + p1)
    assert est.expected_tokens(0) == 1.0


def test_a_depth_cut_by_the_budget_is_not_counted_as_rejected():
    est = DepthAcceptance(4, forget=1.0)
    est.observe(2, 2)  # budget 2: both accepted, depth 3 never drafted
    assert est.reached == [1.0, 1.0, 0.0, 0.0] and est.accepted == [1.0, 1.0, 0.0, 0.0]
    est.observe(1, 4)  # depth 2 rejected, depths 3 and 4 not reached
    assert est.reached == [2.0, 2.0, 0.0, 0.0] and est.accepted == [2.0, 1.0, 0.0, 0.0]


def test_forgetting_weighs_recent_steps_more():
    est = DepthAcceptance(1, forget=0.5)
    for a in (1, 1, 1, 0):
        est.observe(a, 1)
    assert est.reached[0] == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert est.accepted[0] == pytest.approx(0.5 + 0.25 + 0.125)


def test_a_depth_never_reached_is_presumed_like_the_one_above():
    pool = DepthAcceptance(4, forget=1.0)
    for _ in range(9):
        pool.observe(0, 4)  # depth 1 always rejected: depths 2-4 never drafted
    assert pool.p(1) == pytest.approx(1 / 10)
    assert pool.p(2) == pool.p(3) == pool.p(4) == pytest.approx(1 / 10)
    assert pool.expected_tokens(4) == pytest.approx(1 + 0.1 + 0.01 + 0.001 + 0.0001)


def test_a_fresh_estimate_is_its_prior():
    pool = DepthAcceptance(2, forget=1.0)
    for _ in range(9):
        pool.observe(0, 2)
    fresh = DepthAcceptance(2, forget=0.7, prior=pool)
    assert fresh.p(1) == pytest.approx(pool.p(1)) == pytest.approx(1 / 10)


def test_expected_tokens_follow_every_observation_of_the_estimate_or_its_prior():
    """The per-request sums are cached between observations (plain steps observe nothing);
    an observation of the request or of the pool it borrows from shows in the next read."""
    pool = DepthAcceptance(3, forget=1.0)
    req = DepthAcceptance(3, forget=0.7, prior=pool)

    def fresh(est, limit):
        ps = est.probabilities()
        return 1 + sum(ps[0] * (ps[1] if d > 1 else 1) * (ps[2] if d > 2 else 1) for d in range(1, limit + 1))

    seen = []
    for step, (who, a) in enumerate([(pool, 0), (req, 2), (pool, 3), (req, 0), (None, 0), (pool, 1)]):
        if who is not None:
            who.observe(a, 3)
        for limit in (3, 1, 3):  # another limit, then back: never a stale sum
            assert req.expected_tokens(limit) == pytest.approx(fresh(req, limit)), (step, limit)
        seen.append(req.expected_tokens(3))
    assert seen[4] == seen[3] and len(set(seen)) == 5  # only the step without an observation repeats


@pytest.mark.parametrize("a, limit", [(-1, 2), (3, 2), (1, 5)])
def test_an_impossible_observation_is_an_error(a, limit):
    with pytest.raises(ValueError, match=rf"accept_length={a} must lie in \[0, depth_limit={limit}\]"):
        DepthAcceptance(4, forget=1.0).observe(a, limit)


def test_step_costs_use_live_medians_and_scale_an_unmeasured_variant_by_the_others():
    costs = StepCosts()
    with pytest.raises(KeyError, match=r"no step time for bucket 8 \(speculative\): call warmup"):
        costs(8, SPECULATIVE)
    costs.record(8, SPECULATIVE, [1.0, 9.0, 1.2])  # warm-up median 1.2
    costs.record(8, PLAIN, [0.6])
    costs.record(8, DEFERRED, [0.5])
    costs.record(16, PLAIN, [0.9])
    assert costs(8, SPECULATIVE) == 1.2 and costs(8, PLAIN) == 0.6
    for s in (3.0, 100.0, 3.6):  # live: a robust median, not a mean
        costs.update(8, SPECULATIVE, s)
    assert costs(8, SPECULATIVE) == 3.6
    assert costs(8, PLAIN) == pytest.approx(0.6 * 3.6 / 1.2)  # live steps ran 3x their warm-up time
    assert costs(16, PLAIN) == 0.9  # another bucket's live times do not leak
    costs.update(8, PLAIN, 1.0)
    assert costs(8, PLAIN) == 1.0
    ratio = (3.0 + 1.0 / 0.6) / 2  # the median of the live / warm-up ratios of the two variants that ran
    assert costs(8, DEFERRED) == pytest.approx(0.5 * ratio)
    assert costs.table() == [(8, {SPECULATIVE: 3.6, PLAIN: 1.0, DEFERRED: pytest.approx(0.5 * ratio)}), (16, {PLAIN: 0.9})]


# ----------------------------------------------------------------------------- decisions
def test_it_speculates_exactly_when_expected_tokens_per_second_say_so():
    """Four requests with one history each; the speculative step costs 2x or 5x the plain."""
    for spec_s, want in ((2.0, True), (5.0, False)):
        rule = planted_rule(spec_s, 1.0)
        requests = [Req() for _ in range(4)]
        for r in requests:
            for a in (4, 4, 2):
                rule.observe(r, a)
        e = rule.expected_tokens(requests[0])
        assert 2.0 < e < 5.0  # so 2x pays and 5x does not
        assert rule.choose(4, requests) is want
        assert rule.last.tokens == {True: pytest.approx(4 * e), False: 4.0}
        assert rule.last.seconds == {True: spec_s, False: 1.0}
        assert rule.last.predicted_rate() == pytest.approx(max(4 * e / spec_s, 4.0))


def test_a_request_without_drafts_counts_one_token_and_a_budget_limits_the_depth():
    rule = planted_rule(2.0, 1.0)
    none, two, full = Req(budget=0), Req(budget=2), Req()
    assert rule.expected_tokens(none) == 1.0
    assert rule.expected_tokens(two) == 3.0 and rule.expected_tokens(full) == 5.0  # optimistic prior p = 1
    rule.observe(none, 0)  # ignored: nothing was drafted
    assert none.acceptance is None and rule.pool.reached == [0.0] * D


def test_decision_sequence_when_speculation_always_pays():
    """Every draft accepted, speculative step 2x the plain: 5 tokens per request per 2 s
    against at most 1 per 1 s (the plain step's warm-up time, which a live step never
    undercuts): speculate every step, and never probe plain (it could only confirm)."""
    rule = planted_rule(2.0, 1.0)
    seq = drive(rule, [Req(), Req()], lambda step, i: D, 70, bucket=4, spec_s=2.0, plain_s=1.0)
    assert seq == "S" * 70
    assert rule.decisions == {True: 70, False: 0} and rule.probes == 0


def test_a_plain_probe_runs_while_the_plain_step_could_win_at_its_cheapest():
    """One draft accepted per step (E[tokens] ~2.02 per request), the speculative step 2 s at
    warm-up but 2.2 s live: the plain step, never run, is priced at its warm-up 1 s scaled
    by that drift (1.1 s), so speculating looks better (4.08 tokens in 2.2 s = 1.85/s against
    2 in 1.1 s = 1.82/s); at its warm-up time plain would win (2.0/s), so it is probed once the
    bucket's exploration budget (EXPLORE_SHARE of its step time, 5.5 ms a step) covers the
    probe's predicted loss (1.1 - 2 x 2.2 / 4.08 = 22 ms): step 6. It runs in 1 s and the rule
    switches to plain; a speculative probe would lose ~0.16 s, which the budget affords after
    ~64 plain steps (step 67)."""
    rule = planted_rule(2.0, 1.0)
    seq = drive(rule, [Req(), Req()], lambda step, i: 1, 80, bucket=4, spec_s=2.2, plain_s=1.0)
    assert FIRST_INTERVAL == 4 and EXPLORE_SHARE == 0.0025
    assert seq == "S" * 5 + "p" + "P" * 60 + "s" + "P" * 13


def test_decision_sequence_when_drafts_are_never_accepted():
    """Nothing accepted and a speculative step 1.5x the plain: the optimistic start speculates
    twice, then plain; a speculative probe runs only when the exploration budget (0.25% of the
    time run) covers its predicted loss (1.5 s - E[tokens] x 1 s, ~0.23 s at first and more as
    the estimate falls), so probes cost at most that share of the run: 7 in 1200 steps, not
    the 8 the doubling schedule alone ran in the first 80 (each one step's worth of time lost
    at 2 of 3 tokens)."""
    rule = planted_rule(1.5, 1.0)
    seq = drive(rule, [Req()], lambda step, i: 0, 1200, bucket=1, spec_s=1.5, plain_s=1.0)
    gaps = [90, 134, 153, 163, 170, 175, 256]  # plain steps before each probe
    assert seq == "SS" + "".join("P" * g + "s" for g in gaps) + "P" * 50
    assert rule.probes == 7  # 3.5 s lost in 1202 s (each probe 0.5 s dearer than the plain step)


def test_after_acceptance_collapses_mid_run_it_stops_speculating_within_seven_steps():
    """Two requests accept every draft for 10 steps, then none: the per-request estimates
    (forgetting 0.7 per step, against two pseudo-observations of the pool) fall below the
    break-even E[tokens] = 2 (speculative = 2x plain) after seven failed speculative steps. The
    ten good steps saved 3 s each against plain, and that saving is the bucket's exploration
    budget: speculative probes follow at the doubling schedule (4, then 8 plain steps), as a
    bucket where speculation paid should check soon whether it pays again. (No plain probe
    while speculating: at 5 tokens per request it pays even against plain's warm-up time.)"""
    rule = planted_rule(2.0, 1.0)
    requests = [Req(), Req()]
    seq = drive(rule, requests, lambda step, i: D if step < 10 else 0, 40, bucket=4, spec_s=2.0, plain_s=1.0)
    assert seq[:10] == "S" * 10
    assert seq[10:] == "S" * 7 + "PPPP" + "s" + "P" * 8 + "s" + "P" * 9
    assert all(r.acceptance.expected_tokens(D) < 2.0 for r in requests)


def test_a_probe_that_flips_the_choice_resets_the_interval():
    """Plain at first (acceptance 0, nothing saved by speculating: no budget but the time
    share); from step 30 every draft would be accepted: the first speculative probe the budget
    affords (step 93) finds it and the rule switches to speculating for good (3.2 tokens per
    1.5 s beat even plain's warm-up time, 1 token per 1 s: no plain probe follows). This is
    the price of rare probes: a head that was never right is retried after ~90 steps here,
    not 4."""
    rule = planted_rule(1.5, 1.0)
    seq = drive(rule, [Req()], lambda step, i: 0 if step < 30 else D, 200, bucket=1, spec_s=1.5, plain_s=1.0)
    assert seq == "SS" + "P" * 90 + "s" + "S" * 107


def test_buckets_keep_their_own_costs_and_probe_schedules():
    """Speculating pays in bucket 1 (1.2x) and not in bucket 64 (8x): the same requests get
    opposite decisions, and the live time of one bucket never leaks into the other."""
    rule = AdaptiveRule(D, chain=True, full_budget=D)
    rule.costs.record(1, SPECULATIVE, [1.2]), rule.costs.record(1, PLAIN, [1.0])
    rule.costs.record(64, SPECULATIVE, [8.0]), rule.costs.record(64, PLAIN, [1.0])
    requests = [Req() for _ in range(3)]
    for r in requests:
        for a in (2, 3, 2):
            rule.observe(r, a)
    assert rule.choose(1, requests) is True
    assert rule.choose(64, requests) is False
    rule.measured(64, PLAIN, 3, 1.0)
    assert rule.costs(1, SPECULATIVE) == 1.2 and rule.costs(64, SPECULATIVE) == 8.0


def test_the_plain_step_due_is_priced_as_itself():
    """A deferred plain step (no drafter) is cheaper than an ingesting one: the same history
    speculates when the ingesting plain step is due and not when the deferred one is."""
    rule = planted_rule(2.0, 1.6)
    rule.costs.record(4, DEFERRED, [1.0])
    requests = [Req(), Req()]
    for r in requests:
        for a in (1, 1, 0, 1):
            rule.observe(r, a)
    e = rule.expected_tokens(requests[0])
    assert 1.6 < e < 2.0  # speculating pays against the 1.6 s plain step, not against the 1.0 s one
    assert rule.choose(4, requests, PLAIN) is True and rule.last.seconds == {True: 2.0, False: 1.6}
    assert rule.choose(4, requests, DEFERRED) is False and rule.last.plain == DEFERRED


# ----------------------------------------------------------------------------- folded in later
def drive_like_the_engine(rule: AdaptiveRule, requests, accepts, steps: int, bucket: int, spec_s: float,
                          plain_s: float) -> str:
    """`drive` in the engine's order: choose, launch, fold the last step's acceptance in while
    the device runs (`fold`), hand-off, keep this step's acceptance for later (`observe_later`)."""
    out = []
    for step in range(steps):
        spec = rule.choose(bucket, requests)
        rule.fold()
        lengths = [min(accepts(step, i), r.budget) if spec else 0 for i, r in enumerate(requests)]
        rule.measured(bucket, SPECULATIVE if spec else PLAIN, sum(a + 1 for a in lengths), spec_s if spec else plain_s)
        rule.observe_later(requests if spec else [], lengths if spec else [])
        out.append(("S" if spec else "P").lower() if rule.last.probe else ("S" if spec else "P"))
    return "".join(out)


def test_folded_in_later_the_estimates_equal_observing_at_once():
    at_once, later = planted_rule(2.0, 1.0), planted_rule(2.0, 1.0)
    requests_a, requests_b = [Req(), Req(budget=2)], [Req(), Req(budget=2)]
    for lengths in ([4, 2], [1, 0], [3, 2]):
        for r, a in zip(requests_a, lengths):
            at_once.observe(r, a)
        later.observe_later(requests_b, lengths)
    later.fold()
    assert [later.expected_tokens(r) for r in requests_b] == pytest.approx([at_once.expected_tokens(r) for r in requests_a])
    assert later.pool.reached == pytest.approx(at_once.pool.reached)


def test_in_the_engines_order_choices_lag_one_step_and_a_speculative_probe_waits_for_its_acceptance():
    """The choice after a step reads estimates without that step (folded in while the next one
    runs): the optimistic start speculates three times, a collapse shows one step later, and a
    speculative probe is judged once its acceptance is in (one plain step later): the probe at
    step 135 finds every draft accepted, and speculation resumes at step 137 for good."""
    rule = planted_rule(1.5, 1.0)
    seq = drive_like_the_engine(rule, [Req()], lambda step, i: 0 if step < 30 else D, 200, bucket=1, spec_s=1.5,
                                plain_s=1.0)
    assert seq == "SSS" + "P" * 131 + "s" + "P" + "S" * 64
    rule = planted_rule(2.0, 1.0)
    seq = drive_like_the_engine(rule, [Req(), Req()], lambda step, i: D if step < 10 else 0, 40, bucket=4,
                                spec_s=2.0, plain_s=1.0)
    assert seq == "S" * 18 + "PPPP" + "s" + "P" * 8 + "s" + "P" * 8


# ----------------------------------------------------------------------------- plain steps age the evidence
def test_a_plain_step_ages_a_requests_evidence_back_to_the_pool():
    """A request whose last drafts were all rejected, in a pool where most are accepted: each
    plain step (`age`) multiplies its own counts by FORGET, so its estimate moves back to the
    pool's; once the evidence has faded, ageing is a no-op (no cache invalidated)."""
    pool = DepthAcceptance(D, 0.98)
    for _ in range(20):
        pool.observe(D, D)
    request = DepthAcceptance(D, 0.7, prior=pool)
    for _ in range(3):
        request.observe(0, D)
    collapsed = request.expected_tokens(D)
    reached = request.reached[0]
    request.age()
    assert request.reached[0] == pytest.approx(0.7 * reached)
    aged = [request.expected_tokens(D)]
    for _ in range(30):
        request.age()
        aged.append(request.expected_tokens(D))
    assert collapsed < aged[0] < aged[5] < aged[-1] == pytest.approx(pool.expected_tokens(D), rel=1e-3)
    version = request.version
    request.age()  # faded: nothing changes
    assert request.version == version


def test_the_requests_of_a_plain_step_age_when_the_step_is_folded_in():
    rule = planted_rule(2.0, 1.0)
    spec, idle = Req(), Req()
    rule.observe_later([spec, idle], [0, 0])
    rule.fold()
    before = idle.acceptance.reached[0]
    rule.observe_later([spec], [2], idle=[idle])
    rule.fold()
    assert idle.acceptance.reached[0] == pytest.approx(0.7 * before)
    assert spec.acceptance.reached[0] == pytest.approx(0.7 * before + 1)


def test_the_exploration_budget_grows_with_what_speculating_saved():
    """Ten steps that each save 3 s against the plain rate leave 30 s (plus the time share) in
    the bucket's budget; a probe's predicted loss comes out of it; a speculative step that
    saved nothing adds only the share."""
    rule = planted_rule(2.0, 1.0)
    requests = [Req(), Req()]
    drive(rule, requests, lambda step, i: D, 10, bucket=4, spec_s=2.0, plain_s=1.0)
    assert rule._budget[4] == pytest.approx(10 * 3.0 + EXPLORE_SHARE * 10 * 2.0)


def test_the_sum_folded_beside_the_device_is_the_sum_the_choice_would_make():
    """`fold` sums the step's expected tokens for the next choice; a choice over the same
    requests reads it, over others (a request came or went) sums afresh, and an observation at
    once drops it."""
    rule = planted_rule(2.0, 1.0)
    a, b, c = Req(), Req(), Req(budget=2)
    rule.observe_later([a, b, c], [3, 0, 2])
    rule.fold()
    want = sum(rule.expected_tokens(r) for r in (a, b, c))
    assert rule._summed[1] == pytest.approx(want)
    rule.choose(4, [a, b, c])
    assert rule.last.tokens[True] == pytest.approx(want)
    rule.choose(4, [a, c])  # b finished
    assert rule.last.tokens[True] == pytest.approx(rule.expected_tokens(a) + rule.expected_tokens(c))
    rule.observe(a, 0)
    assert rule._summed is None
    rule.choose(4, [a, b, c])
    assert rule.last.tokens[True] == pytest.approx(sum(rule.expected_tokens(r) for r in (a, b, c)))


def test_a_step_that_is_no_clean_sample_is_recorded_but_moves_no_estimate():
    """`measured(..., sample=False)` (an overlapped step with a prefill in its window): the
    decision keeps what was measured, the live cost and the exploration budget do not move."""
    rule = planted_rule(2.0, 1.0)
    requests = [Req(), Req()]
    drive(rule, requests, lambda step, i: D, 3, bucket=4, spec_s=2.0, plain_s=1.0)
    live, budget = list(rule.costs.live[(4, SPECULATIVE)]), rule._budget[4]
    assert rule.choose(4, requests) is True
    decision = rule.last
    rule.measured(4, SPECULATIVE, 2 * (D + 1), 50.0, decision, sample=False)
    assert list(rule.costs.live[(4, SPECULATIVE)]) == live and rule.done is decision
    assert decision.measured_seconds == 50.0 and decision.measured_tokens == 2 * (D + 1)
    assert rule._budget[4] == pytest.approx(budget + EXPLORE_SHARE * 2.0)  # the choice's share only
    rule.measured(4, SPECULATIVE, 2 * (D + 1), 50.0, decision)  # the same as a sample is one
    assert list(rule.costs.live[(4, SPECULATIVE)]) == live + [50.0]


def test_a_time_measured_later_moves_the_costs_at_the_next_fold():
    """`measured(..., later=True)` (the engine's order: the cost model's update runs beside the
    device): the decision gets its outcome at once, the live cost and the exploration budget
    at the next `fold`; a second step timed before any fold pushes the first one in."""
    rule = planted_rule(2.0, 1.0)
    requests = [Req(), Req()]
    drive(rule, requests, lambda step, i: D, 3, bucket=4, spec_s=2.0, plain_s=1.0)
    live, budget = list(rule.costs.live[(4, SPECULATIVE)]), rule._budget[4]
    rule.choose(4, requests)
    decision = rule.last
    rule.measured(4, SPECULATIVE, 2 * (D + 1), 3.0, later=True)
    assert rule.done is decision and decision.measured_seconds == 3.0
    assert list(rule.costs.live[(4, SPECULATIVE)]) == live and rule._budget[4] == budget + EXPLORE_SHARE * 2.0
    rule.fold()
    assert list(rule.costs.live[(4, SPECULATIVE)]) == live + [3.0] and rule._budget[4] > budget + EXPLORE_SHARE * 2.0
    rule.choose(4, requests)
    rule.measured(4, SPECULATIVE, 2 * (D + 1), 4.0, later=True)
    rule.choose(4, requests)
    rule.measured(4, SPECULATIVE, 2 * (D + 1), 5.0, later=True)  # no fold in between: 4.0 goes in now
    assert list(rule.costs.live[(4, SPECULATIVE)]) == live + [3.0, 4.0]


def test_a_plain_probe_is_judged_once_its_time_is_in():
    """In the engine's order a plain probe's time reaches the costs at the fold after the next
    launch, so the choice right after the probe does not judge it yet (it would judge the old
    estimate); the one after does, and a probe that left the choice unchanged doubles the interval."""
    rule = planted_rule(3.5, 1.0, buckets=(4,))
    for _ in range(3):  # live plain steps cost twice their warm-up: speculating wins (~12 tokens in 3.5 s
        rule.costs.update(4, PLAIN, 2.0)  # against 4 in 2.0), a plain step at its warm-up time could (4 in 1.0)
    requests = [Req() for _ in range(4)]
    for r in requests:
        for _ in range(6):
            rule.observe(r, 2)
    rule.fold()
    probed_at = None
    for step in range(400):
        spec = rule.choose(4, requests)
        rule.fold(requests)  # after the launch, beside the device
        if probed_at is not None:  # the choice right after the probe: its time is not in yet
            assert 4 in rule._probed and rule._interval.get(4, FIRST_INTERVAL) == interval
            rule.measured(4, SPECULATIVE if spec else PLAIN, 4 * 3 if spec else 4, 3.5 if spec else 2.0, later=True)
            rule.observe_later(requests if spec else [], [2] * 4 if spec else [])
            rule.choose(4, requests)  # now it is (folded above): judged, unchanged: the interval doubles
            assert 4 not in rule._probed and rule._interval[4] == 2 * interval
            return
        if rule.last.probe and not spec:
            probed_at, interval = step, rule._interval.get(4, FIRST_INTERVAL)
        rule.measured(4, SPECULATIVE if spec else PLAIN, 4 * 3 if spec else 4, 3.5 if spec else 2.0, later=True)
        rule.observe_later(requests if spec else [], [2] * 4 if spec else [], idle=[] if spec else requests)
    pytest.fail("no plain probe in 400 steps: the test no longer tests it")


def test_the_plain_step_due_follows_the_budgets_and_the_paths():
    """BARE when no request drafts, DEFERRED while every drafting path has room below the depth
    (an undrafted request's path does not count; an unknown one, None, blocks), else PLAIN; a
    drafter that cannot defer (depth None) runs PLAIN only."""
    drafting, undrafted = Req(), Req(budget=0)
    assert plain_step_due([undrafted, Req(budget=0)], [None, 9], D) == BARE
    assert plain_step_due([drafting, undrafted], [D - 1, None], D) == DEFERRED
    assert plain_step_due([drafting, undrafted], [D, 0], D) == PLAIN  # one more would pass the depth
    assert plain_step_due([drafting, Req()], [0, None], D) == PLAIN  # a speculative step's length unknown
    assert plain_step_due([undrafted], [0], None) == PLAIN and plain_step_due([drafting], [0], None) == PLAIN


# ----------------------------------------------------------------------------- admission
def never_accepted_pool(rule: AdaptiveRule, observations: int = 60) -> None:
    for _ in range(observations):
        rule.pool.observe(0, D)


def test_a_head_that_pays_in_no_bucket_admits_requests_without_their_drafter_exploring_at_doubling_intervals():
    """Nothing accepted, speculation 1.5x the plain step in every bucket: admissions go without
    the drafter, and one in FIRST_INTERVAL, then 2x, 4x ... admissions explores with it; budget
    0 is never given a drafter and not counted."""
    rule = planted_rule(1.5, 1.0)
    assert rule.admit_with_drafter(D) is True  # optimistic before any evidence: E[tokens] = 1 + D pays
    never_accepted_pool(rule)
    assert rule.drafting_pays_somewhere(D) is False
    seq = "".join("D" if rule.admit_with_drafter(D) else "-" for _ in range(60))
    gaps = [FIRST_INTERVAL * 2 ** k for k in range(4)]  # 4, 8, 16, 32 admissions between explorations
    assert seq == "".join("-" * g + "D" for g in gaps[:3]) + "-" * (60 - sum(gaps[:3]) - 3)
    assert rule.admissions == {True: 1 + 3, False: 60 - 3}
    assert rule.admit_with_drafter(0) is False and rule.admissions == {True: 4, False: 57}


def test_a_head_that_pays_in_one_bucket_keeps_every_drafter_and_a_paying_pool_resets_the_schedule():
    """Acceptance that pays at batch 1 (speculation 1.2x there) and not at batch 64 (8x): every
    request keeps its drafter (the batch may shrink to bucket 1). And once the evidence says
    drafting pays again, the exploration interval is back to its first value."""
    rule = AdaptiveRule(D, chain=True, full_budget=D)
    rule.costs.record(1, SPECULATIVE, [1.2]), rule.costs.record(1, DEFERRED, [1.0])
    rule.costs.record(64, SPECULATIVE, [8.0]), rule.costs.record(64, DEFERRED, [1.0])
    for _ in range(60):
        rule.pool.observe(1, D)  # E[tokens] ~ 1.5 + ...: > 1.2, < 8
    assert all(rule.admit_with_drafter(D) for _ in range(20)) and rule.admissions[False] == 0
    never_accepted_pool(rule, 200)
    assert [rule.admit_with_drafter(D) for _ in range(5)] == [False] * 4 + [True]
    assert rule._admit_interval == 2 * FIRST_INTERVAL
    for _ in range(200):
        rule.pool.observe(D, D)
    assert rule.admit_with_drafter(D) is True and rule._admit_interval == FIRST_INTERVAL


def test_before_any_step_is_timed_every_request_keeps_its_drafter():
    rule = AdaptiveRule(D, chain=True, full_budget=D)
    never_accepted_pool(rule)
    assert rule.drafting_pays_somewhere(D) is True and rule.admit_with_drafter(D) is True


# ----------------------------------------------------------------------------- host work per step
def test_a_choice_after_requests_came_and_went_reads_the_folded_figures_and_equals_a_fresh_sum():
    """`fold(upcoming)` keeps each upcoming request's expected tokens; a choice over a batch
    where some finished and others arrived reads those figures for the ones still there and
    derives the rest: the same total a sum over every request gives, to the last bit."""
    rule = planted_rule(2.0, 1.0)
    a, b, c = Req(), Req(), Req(budget=2)
    rule.observe_later([a, b, c], [3, 0, 2])
    rule.fold([a, b, c])
    assert rule._summed[2] == {id(r): rule.expected_tokens(r) for r in (a, b, c)}
    d, e = Req(), Req(budget=0)  # arrived: no estimate yet, and one that drafts nothing
    rule.choose(4, [c, d, a, e])  # b finished
    assert rule.last.tokens[True] == sum(rule.expected_tokens(r) for r in (c, d, a, e))
    assert rule.expected_tokens(e) == 1.0


def test_a_request_without_evidence_expects_exactly_what_the_pool_does():
    """A request that has drafted nothing yet is priced from the pool's cached estimate: equal
    to its own estimate once built (two pseudo-observations of the pool and no counts)."""
    rule = planted_rule(2.0, 1.0)
    seen = Req()
    for length in (4, 1, 0, 3, 2):
        rule.observe(seen, length)
    for budget in (D, 2, 1):
        fresh = Req(budget=budget)
        want = DepthAcceptance(D, 0.7, prior=rule.pool).expected_tokens(rule.depth_limit(fresh))
        assert rule.expected_tokens(fresh) == want and fresh.acceptance is None


def test_a_bare_step_due_prices_speculating_at_one_token_per_request():
    """BARE is due only when no running request drafts: a speculative step would emit one
    token per request, as the plain one, so the choice is plain at any acceptance."""
    rule = planted_rule(2.0, 1.0)
    rule.costs.record(4, BARE, [0.9])
    requests = [Req(budget=0) for _ in range(3)]
    assert rule.choose(4, requests, BARE) is False
    assert rule.last.tokens == {True: 3.0, False: 3.0} and rule.last.plain == BARE


def test_the_admission_answer_is_kept_until_the_pool_or_the_costs_move():
    """Admissions between two steps share one answer; a new observation or step time asks again."""
    rule = AdaptiveRule(D, chain=True, full_budget=D)
    rule.costs.record(4, SPECULATIVE, [3.0])
    rule.costs.record(4, PLAIN, [1.0])
    never = Req()
    for _ in range(30):
        rule.observe(never, 0)  # the pool: drafts are never accepted
    assert rule.drafting_pays_somewhere(D) is False
    cached = rule._pays
    assert rule.drafting_pays_somewhere(D) is False and rule._pays is cached
    rule.costs.update(4, PLAIN, 1.0)
    rule.costs.update(4, SPECULATIVE, 0.5)  # speculating got cheaper than a plain step: it pays now
    assert rule.drafting_pays_somewhere(D) is True
    for _ in range(3):
        rule.costs.update(4, SPECULATIVE, 3.0)
    assert rule.drafting_pays_somewhere(D) is False


def test_a_variant_not_yet_live_drifts_with_the_median_of_its_buckets_live_ratios():
    """Before a variant has run live its cost is its warm-up time times the median live/warm
    ratio of its bucket's other variants (kept per bucket, not re-derived on every read)."""
    costs = StepCosts()
    costs.record(4, SPECULATIVE, [2.0])
    costs.record(4, PLAIN, [1.0])
    costs.record(4, DEFERRED, [0.8])
    costs.record(16, PLAIN, [5.0])
    assert costs(4, DEFERRED) == 0.8
    costs.update(4, SPECULATIVE, 3.0)  # 1.5x its warm-up
    assert costs(4, DEFERRED) == pytest.approx(0.8 * 1.5) and costs(16, PLAIN) == 5.0
    costs.update(4, PLAIN, 1.1)  # 1.1x: the median of (1.5, 1.1) is 1.3
    assert costs(4, DEFERRED) == pytest.approx(0.8 * 1.3)
    assert costs(4, PLAIN) == 1.1 and costs(4, SPECULATIVE) == 3.0


def test_an_exploring_admission_waits_for_a_batch_where_its_drafts_could_be_observed():
    """A head that pays in no bucket: exploration is due at the 5th admission, but beside 15
    undrafted requests (and none coming) even an explorer whose every draft were accepted
    could not make a speculative step pay (15 + 5 tokens against 16 x 2.0 / 1.0): it would
    never be observed. It waits, and the first admission into a batch where it could goes in
    with its drafter. Without the batch (the old call) it explores at once."""
    rule = planted_rule(2.0, 1.0, buckets=(4, 16))
    never = Req()
    for _ in range(30):
        rule.observe(never, 0)
    undrafted = [Req(budget=0) for _ in range(15)]
    assert [rule.admit_with_drafter(D, (16, undrafted[:3], 0)) for _ in range(4)] == [False] * 4
    assert rule.admit_with_drafter(D, (16, undrafted, 0)) is False  # due, but nothing could observe it
    assert rule.admit_with_drafter(D, lambda: (16, undrafted[:12], 3)) is False  # 3 more come in beside it
    assert rule._evidence_can_come(D, 4, undrafted[:2]) is True  # 2 + 5 tokens against 3 x 2.0
    assert rule.admit_with_drafter(D, (4, undrafted[:2], 0)) is True
    assert rule.admissions == {True: 1, False: 6}
    old = planted_rule(2.0, 1.0, buckets=(4, 16))
    for _ in range(30):
        old.observe(never, 0)
    assert [old.admit_with_drafter(D) for _ in range(5)] == [False] * 4 + [True]
