"""Adaptive speculation: before each step, run the variant that is expected to emit the most
tokens per second.

Why: at a small batch the target forward is bound by memory, and verifying a tree of N rows
costs little more than decoding one row, so speculation multiplies throughput; at a large
batch the forward becomes bound by arithmetic, N rows per request cost up to N times more,
and speculation loses throughput unless acceptance is high. So the engine keeps, per batch
bucket, the speculative step and plain ones (the target verifies the root alone): `plain`
runs the drafter to ingest the path it has not seen (so its KV stays current), `deferred`
does not run the drafter at all and appends its token to that path instead, as if the last
step had accepted one more draft; the engine runs `deferred` while every path stays within
the drafter's depth, so the drafter runs once per D + 1 plain steps and a run of plain steps
costs what target-only steps cost. Per step it picks

    argmax over v in {speculative, the plain step due} of  E[tokens of step v] / E[seconds of step v]

- **Tokens.** A plain step emits one token per running request. A speculative step emits
  `1 + sum_{d <= L} prod_{i <= d} p_i` per request, where p_i is the request's acceptance
  at depth i given depth i-1 was accepted, and L the depth its draft budget reaches
  (`DepthAcceptance`: the request's own counts, forgetting 0.7 per step, against two
  pseudo-observations of the engine-wide estimate, pooled over every request served so far
  and optimistic before the first speculative step). Two, not one: replayed on recorded
  SmolLM2 acceptance (`adaptive_replay`), one made a request that drew two short drafts look
  collapsed (predicted 1.5-2 tokens where 2.5 followed) and chose plain steps that cost 2% at
  batch 1 (`examples/bench_rule_replay.py`). A plain step observes nothing, so a request's
  own evidence fades on it (`age`) and its estimate drifts back to the pool's: a request that
  collapsed on a bad stretch returns to speculating on its own when the head is good
  elsewhere, and stays plain when it is not.
- **Seconds.** The measured step time of that variant in that bucket (`StepCosts`): the
  median of its last live steps (host time, hand-off included), or, before it has run live,
  its warm-up time scaled by how far the live steps of the bucket's other variants ran from
  their warm-up times (warm-up times idle slots; live steps also attend over real contexts).
- **Exploration.** The variant that is not chosen gets no fresh measurements, so after
  `interval` steps of one variant in a bucket the other runs once (a probe). A probe that
  leaves the choice unchanged doubles that bucket's interval (up to `MAX_INTERVAL`), one
  that flips it resets the interval. A probe also has to be paid for: its predicted loss
  (its seconds minus the time the chosen variant needs for its tokens) comes out of the
  bucket's exploration budget, which grows by `EXPLORE_SHARE` of every step's time and by
  the time each speculative step saved against the plain rate. So a bucket where speculation
  has paid probes at the doubling schedule (and notices soon that it pays again), and one
  where it never paid (a head that is never right) spends about 0.25% of its time on
  probes (their predicted loss): on the H200 the doubling schedule alone ran 4-5 probes in
  ~130 steps at batch 4-16 on the 8B shape, 1.3-2.2% of the decode. A plain probe runs only
  while the plain step could win at its cheapest (its warm-up time, which live steps do not
  undercut).
- **When.** The engine folds a step's acceptance into the estimates right after it launches
  the next step (`observe_later`, then `fold`), so that per-request host work overlaps the
  device instead of idling it between steps; a choice therefore reads estimates one step old,
  and a speculative probe is judged once its acceptance is in. The step's measured time goes
  the same way (`measured(..., later=True)`): the cost model's update (a window median, the
  bucket's drift) ran ~13 us between two steps on a 2-core CPU, and the costs a choice reads
  are one step old too; a plain probe is judged once its time is in.

- **Admission.** A request is admitted without its drafter (budget 0: no draft prompt
  pass, its paths never hold back a deferred step, `engine.prefill`) when, with the pool's
  acceptance, a speculative step would not beat the cheapest plain one in any batch bucket
  whose costs are known: a head that is never right. Without new evidence that choice would
  stick, so every so many such admissions one is admitted with its drafter, at the probes'
  doubling schedule (FIRST_INTERVAL .. MAX_INTERVAL admissions; back to the first once
  drafting pays somewhere). A head that pays in some bucket (SmolLM2's at batch 1) keeps
  every request's drafter: the batch may shrink to that bucket later. The comparison is with
  the plain steps a drafting request runs: priced against the bare step below, the pool's
  dips in a good head's acceptance turned requests away for good (0.94x the better fixed
  choice at batch 4 in the SmolLM2 replay). While no running request drafts, the plain step
  is `bare`: no drafter, no captured states, no path (a target-only step's work).
  An exploring admission waits for a batch where its evidence can come in: its drafts are
  observed only on speculative steps. Beside many undrafted requests, no speculative step could
  win even if the explorer's every draft were accepted. There it would only hold the batch in
  deferred and ingesting steps for its whole life: on the H200, 8b-none at batch 16 / 64 ran
  ~60 such steps of ~128 for one explorer, with no speculative step.

The per-slot draft budget is not a candidate of its own: one captured graph serves every
budget of a bucket at one cost, so a request's own budget (`num_draft_tokens`) is always
the best one for it. Every decision (inputs, prediction, then the measured outcome) is
kept in `AdaptiveRule.last` (the latest choice) and `AdaptiveRule.done` (the choice of the
step whose hand-off was read last, with its outcome) for step observers.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from operator import is_, mul

__all__ = ["AdaptiveRule", "Decision", "DecisionLog", "DepthAcceptance", "StepCosts", "SPECULATIVE", "PLAIN", "DEFERRED",
           "BARE", "plain_step_due"]

SPECULATIVE, PLAIN, DEFERRED = "speculative", "plain", "deferred"  # the step variants
BARE = "bare"  # the plain step of a batch whose every request drafts nothing: no drafter, no captured states

FORGET = 0.7  # a request's per-depth counts decay by this per step (half-life ~2 steps)
POOL_FORGET = 0.98  # the engine-wide prior forgets slowly (half-life ~35 observations)
FADED = 1e-3  # a request's decayed count at depth 1 below which its own evidence counts as gone
PRIOR_WEIGHT = 2.0  # pseudo-observations of the engine-wide estimate in a request's own (the value best
# calibrated on recorded SmolLM2 acceptance: examples/data/acceptance_*.jsonl, notes/gpu/issue22/ANALYSIS.md)
WINDOW = 16  # live step times per (bucket, variant) the median is taken over
FIRST_INTERVAL = 4  # steps of one variant before the other is probed, right after a flip
MAX_INTERVAL = 256  # probes never get rarer than this
EXPLORE_SHARE = 0.0025  # a bucket's exploration budget grows by this share of its step time
# (and by what speculating saved there)


def plain_step_due(running: list, path_lens: list, depth: int | None) -> str:
    """The plain step an adaptive step would run for `running` (requests with a `budget`):
    BARE when none of them drafts, DEFERRED while every drafting request's path stays within the
    drafter's `depth` (`path_lens[i]`: request i's tokens past what its drafter has ingested;
    None while a speculative step's accepted length is unknown: not then), else PLAIN (the
    drafter ingests). `depth` None: a drafter that cannot defer (PLAIN only). One rule for the
    engine (`SpecEngine._plain_due`) and its replay (`adaptive_replay`)."""
    if depth is None:
        return PLAIN
    if not any(r.budget for r in running):
        return BARE
    if all(r.budget == 0 or (p is not None and p + 1 <= depth) for r, p in zip(running, path_lens)):
        return DEFERRED
    return PLAIN


def _median_of_sorted(ordered: list[float]) -> float:
    """The median of an already sorted, non-empty list (statistics.median re-sorts and checks: dearer per step)."""
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


class DepthAcceptance:
    """Per-depth acceptance of one request (or the pool): p_d = P(depth d accepted | d - 1 was).

    Counts decay by `forget` per observation (and per `age`: a step that observed nothing);
    `prior` (another `DepthAcceptance`, read at query time) adds PRIOR_WEIGHT pseudo-observations
    per depth, so a fresh estimate is the prior's.
    Without a prior (the engine-wide pool) the pseudo-observation is 1 at depth 1 and, at a
    deeper depth, the estimate of the depth above: a head that is never accepted at depth 1
    has never been tried at depth 2, and is not presumed perfect there (which once made the
    rule speculate on 1 step in 6 with a head that was never right).
    """

    def __init__(self, depth: int, forget: float, prior: "DepthAcceptance | None" = None) -> None:
        self.depth = depth
        self.forget = forget
        self.prior = prior
        self.reached = [0.0] * depth  # [D] decayed count of steps that drafted depth d with d - 1 accepted
        self.accepted = [0.0] * depth  # [D] of those, the ones that accepted depth d
        self._ps: list[float] | None = None  # p(1..D), cached until the next observation (the pool's is read
        # once per request per step; with the recursion it replaced, choose + observe took 324 us a step at
        # batch 64 on a 2-core CPU, 227 us then)
        self.version = 0  # observations so far: a cache key for estimates built on this one
        self._tokens: tuple | None = None  # (version, prior's version, depth_limit, expected tokens)

    def observe(self, accept_length: int, depth_limit: int) -> None:
        """One speculative step that drafted up to `depth_limit` and accepted `accept_length`."""
        if not 0 <= accept_length <= depth_limit <= self.depth:
            raise ValueError(f"accept_length={accept_length} must lie in [0, depth_limit={depth_limit}], "
                             f"depth_limit in [0, {self.depth}]")
        for d in range(min(accept_length + 1, depth_limit)):  # depths 1 .. a+1 were tried
            self.reached[d] = self.forget * self.reached[d] + 1.0
            self.accepted[d] = self.forget * self.accepted[d] + (1.0 if d < accept_length else 0.0)
        self._ps = None
        self.version += 1

    def age(self) -> None:
        """A step that drafted nothing for this request: its evidence fades by `forget` as if a
        step had passed, so the estimate drifts back to its prior (the pool's) while nothing is
        observed. Without it a request whose last few drafts were short kept its collapsed
        estimate through every plain step until a probe. No-op once the evidence has faded."""
        if self.reached[0] < FADED:
            return
        f = self.forget
        self.reached = [f * r for r in self.reached]
        self.accepted = [f * a for a in self.accepted]
        self._ps = None
        self.version += 1

    def probabilities(self) -> list[float]:
        """[p(1), ..., p(D)]: acceptance at each depth given the depth above was accepted."""
        if self.prior is not None:  # the prior may have moved since the last call: read it again
            w = PRIOR_WEIGHT
            return [(a + w * q) / (r + w) for a, q, r in zip(self.accepted, self.prior.probabilities(), self.reached)]
        if self._ps is None:
            ps: list[float] = []
            for d in range(self.depth):
                # optimistic before any evidence; a depth never reached is presumed like the one above it
                prior = 1.0 if d == 0 else ps[d - 1]
                ps.append((self.accepted[d] + prior) / (self.reached[d] + 1.0))
            self._ps = ps
        return self._ps

    def p(self, d: int) -> float:
        """Acceptance at depth d (1-based) given depth d - 1 was accepted."""
        return self.probabilities()[d - 1]

    def expected_tokens(self, depth_limit: int) -> float:
        """Tokens a speculative step emits in expectation: the accepted drafts plus the bonus.
        Cached until this estimate or its prior observes again: a run of plain steps observes
        nothing, and re-deriving every request's sum each step took 131 us of host time per
        step at batch 64 (2-core CPU), ~1-2% of a batch-64 step on the H200."""
        prior_version = -1 if self.prior is None else self.prior.version
        cached = self._tokens
        if cached is not None and cached[0] == self.version and cached[1] == prior_version and cached[2] == depth_limit:
            return cached[3]
        tokens = 1.0 + sum(accumulate(self.probabilities()[:depth_limit], mul))
        self._tokens = (self.version, prior_version, depth_limit, tokens)
        return tokens


@dataclass
class StepCosts:
    """Seconds of a step per (bucket, variant): warm-up medians, then live medians."""

    warm: dict[tuple[int, str], float] = field(default_factory=dict)
    live: dict[tuple[int, str], deque] = field(default_factory=dict)
    # (bucket, variant) -> median of `live`, kept current by `update`: `choose` reads two
    # estimates a step, and re-deriving every median (statistics.median, the drift ratio) on
    # each read cost ~7 us of the step's host time before the launch
    _live_median: dict[tuple[int, str], float] = field(default_factory=dict, repr=False)
    # bucket -> median of live / warm-up over its variants that ran live (how far its live steps
    # drift), kept current by `record` and `update`: an admission reads every bucket's estimates
    # (`AdaptiveRule.drafting_pays_somewhere`), 34 us each when they were re-derived per read
    _drift: dict[int, float] = field(default_factory=dict, repr=False)
    _ratios: dict[int, dict[str, float]] = field(default_factory=dict, repr=False)  # bucket -> {variant: live / warm}
    version: int = 0  # bumped by every `record` / `update`: a cache key for answers built on these costs

    def record(self, bucket: int, variant: str, samples: list[float]) -> None:
        """Warm-up: `samples` seconds of the variant on idle slots."""
        self.warm[(bucket, variant)] = statistics.median(samples)
        self._update_drift(bucket, variant)

    def update(self, bucket: int, variant: str, seconds: float) -> None:
        """A live step's host time (step start to hand-off)."""
        key = (bucket, variant)
        q = self.live.get(key)
        if q is None:
            q = self.live[key] = deque(maxlen=WINDOW)
        q.append(seconds)
        self._live_median[key] = _median_of_sorted(sorted(q))
        self._update_drift(bucket, variant)

    def _update_drift(self, bucket: int, variant: str) -> None:
        """`bucket`'s drift after (bucket, variant) changed (at most one ratio per variant: a short sort)."""
        self.version += 1
        key = (bucket, variant)
        live, warm = self._live_median.get(key), self.warm.get(key)
        if live is None or warm is None:
            return
        ratios = self._ratios.setdefault(bucket, {})
        ratios[variant] = live / warm
        self._drift[bucket] = _median_of_sorted(sorted(ratios.values()))

    def __call__(self, bucket: int, variant: str) -> float:
        key = (bucket, variant)
        live = self._live_median.get(key)
        if live is not None:
            return live
        if key not in self.warm:
            raise KeyError(f"no step time for bucket {bucket} ({variant}): call warmup() first")
        return self.warm[key] * self._drift.get(bucket, 1.0)

    def known(self) -> set[tuple[int, str]]:
        """The (bucket, variant) pairs with a step time, warm-up or live."""
        return self.warm.keys() | self.live.keys()

    def table(self) -> list[tuple]:
        """(bucket, {variant: seconds}) rows: the current estimates."""
        keys = sorted(self.known())
        return [(b, {v: self(b, v) for bb, v in keys if bb == b}) for b in sorted({b for b, _ in keys})]


@dataclass(slots=True)  # one per step: slots make it cheaper to build on the host's critical path
class Decision:
    """One step's choice: the inputs, the prediction, and (after the step) what happened."""

    bucket: int
    speculative: bool
    plain: str  # the plain step that was due (PLAIN or DEFERRED)
    probe: bool  # run to refresh the other variant's estimates, against the prediction
    requests: int  # running requests in the step
    tokens: dict[bool, float]  # predicted tokens, speculative (True) and plain (False)
    seconds: dict[bool, float]  # predicted seconds, speculative (True) and plain (False)
    step: int = 0  # the rule's choice count at this choice (the k-th choice: k)
    measured_tokens: int | None = None
    measured_seconds: float | None = None

    def predicted_rate(self, speculative: bool | None = None) -> float:
        v = self.speculative if speculative is None else speculative
        return self.tokens[v] / self.seconds[v]

    @property
    def measured_rate(self) -> float | None:
        if self.measured_tokens is None or not self.measured_seconds:
            return None
        return self.measured_tokens / self.measured_seconds


class AdaptiveRule:
    """Chooses the speculative or the plain step before each step (host side, no device work)."""

    def __init__(self, max_depth: int, chain: bool, full_budget: int) -> None:
        self.max_depth = max_depth  # D: the deepest draft a step verifies
        self.chain = chain  # one draft per depth, so a budget of k drafts reaches depth k
        self.full_budget = full_budget  # N - 1 draft tokens
        self.costs = StepCosts()
        self.pool = DepthAcceptance(max_depth, POOL_FORGET)
        self.decisions = {True: 0, False: 0}
        self.probes = 0
        self.last: Decision | None = None  # the latest choice
        self.done: Decision | None = None  # the choice of the step whose hand-off was read last (`measured`)
        self._run: dict[int, tuple[bool, int]] = {}  # bucket -> (variant, steps in a row)
        self._interval: dict[int, int] = {}  # bucket -> steps before the next probe
        self._probed: dict[int, tuple[bool, int]] = {}  # bucket -> (the choice a pending probe went against, its step)
        self._step = 0  # choices made so far: step k is the k-th choice
        self._budget: dict[int, float] = {}  # bucket -> seconds its probes may still lose (`choose`, `measured`)
        self._folded = 0  # the last step whose acceptance the estimates hold
        # (requests, sum of their expected tokens, {id(request): its expected tokens}) at the last fold; the
        # list keeps its requests alive, so no other request can hold one of the ids while it is kept
        self._summed: tuple[list, float, dict[int, float]] | None = None
        self._pays: tuple | None = None  # (budget, pool version, costs version, answer): `drafting_pays_somewhere`
        self._pending: tuple[int, list, list] | None = None  # (step, [(request, accepted length)], [idle request])
        # (bucket, variant, tokens, seconds, decision, sample) of a step timed with `measured(later=True)`
        self._pending_time: tuple | None = None
        self._timed = 0  # the last step whose time the costs hold
        self.admissions = {True: 0, False: 0}  # requests admitted with (True) and without (False) their drafter
        self._undrafted_run = 0  # admissions without the drafter since the last one with it
        self._admit_interval = FIRST_INTERVAL  # such admissions before one explores with its drafter

    def depth_limit(self, request) -> int:
        """How deep `request`'s draft budget lets a step draft."""
        return self._budget_depth(request.budget)

    def _budget_depth(self, budget: int) -> int:
        """How deep a draft budget of `budget` tokens lets a step draft."""
        if budget == self.full_budget:
            return self.max_depth
        return min(budget, self.max_depth)  # a tree's k drafts reach at most depth k

    def estimate(self, request) -> "DepthAcceptance":
        if request.acceptance is None:
            request.acceptance = DepthAcceptance(self.max_depth, FORGET, prior=self.pool)
        return request.acceptance

    def expected_tokens(self, request) -> float:
        if request.budget == 0:
            return 1.0
        if request.acceptance is None:  # nothing observed yet: the estimate is the pool's (cached per its version)
            return self.pool.expected_tokens(self.depth_limit(request))
        return request.acceptance.expected_tokens(self.depth_limit(request))

    def choose(self, bucket: int, running: list, plain: str = PLAIN) -> bool:
        """True: run the speculative step for `running` (the requests in `bucket`); False: the
        plain step that is due (`plain`: PLAIN, DEFERRED while the drafter may skip, or BARE
        when no request of the batch drafts)."""
        self._step += 1
        summed = self._summed  # the last folded step's requests and their expected tokens, summed beside the device
        if plain == BARE:  # no running request drafts: a speculative step would emit what the plain one does
            spec_tokens = float(len(running))
        elif summed is not None and len(summed[0]) == len(running) and all(map(is_, summed[0], running)):
            spec_tokens = summed[1]
        elif summed is not None:  # requests came or went since: the folded figures of those still running
            # (their estimates have not moved since the fold) and fresh ones for the rest; at batch 64 with
            # requests finishing every step, re-deriving all of them took ~140 us before each launch (2-core CPU)
            folded = list(map(summed[2].get, map(id, running)))
            spec_tokens = sum(t for t in folded if t is not None)
            if None in folded:
                spec_tokens += sum(self.expected_tokens(r) for r, t in zip(running, folded) if t is None)
        else:
            spec_tokens = sum(self.expected_tokens(r) for r in running)
        tokens = {True: spec_tokens, False: float(len(running))}
        seconds = {True: self.costs(bucket, SPECULATIVE), False: self.costs(bucket, plain)}
        best = tokens[True] / seconds[True] > tokens[False] / seconds[False]
        # once a probe's outcome is in (a plain probe's time, a speculative one's acceptance:
        # each once folded in, or at once without `later`): did it change the choice?
        probed = self._probed.get(bucket)  # (ran plain, its step): a plain probe's outcome is its time
        if probed is not None and probed[1] <= (self._timed if probed[0] else self._folded):
            went_against, _ = self._probed.pop(bucket)
            interval = self._interval.get(bucket, FIRST_INTERVAL)
            self._interval[bucket] = min(2 * interval, MAX_INTERVAL) if best == went_against else FIRST_INTERVAL
        variant, run = self._run.get(bucket, (best, 0))
        probe = variant == best and run >= self._interval.get(bucket, FIRST_INTERVAL)
        if probe and best:  # a plain probe only while the plain step could win at its cheapest
            probe = self._plain_could_win(bucket, plain, tokens, seconds)
        elif probe and tokens[True] <= tokens[False]:  # no request of the step drafts (every budget 0):
            probe = False  # a speculative probe would observe nothing
        budget = self._budget.get(bucket, 0.0)
        if probe:  # and only when the bucket's exploration budget covers what it is expected to lose
            loss = seconds[not best] - tokens[not best] * seconds[best] / tokens[best]
            probe = loss <= budget
            budget -= loss if probe else 0.0
        choice = (not best) if probe else best
        self._budget[bucket] = budget + EXPLORE_SHARE * seconds[choice]
        if probe:
            self._probed[bucket] = (best, self._step)
            self.probes += 1
        self._run[bucket] = (choice, run + 1 if choice == variant else 1)
        self.decisions[choice] += 1
        self.last = Decision(bucket, choice, plain, probe, len(running), tokens, seconds, step=self._step)
        return choice

    def drafting_pays_somewhere(self, budget: int) -> bool:
        """Whether a fresh request of `budget` drafts (the pool's acceptance) would make a
        speculative step beat the cheapest plain step due in some batch bucket with known costs:
        E[tokens] / spec seconds > 1 / plain seconds for a batch of such requests."""
        cached = self._pays  # the admissions between two steps see the same estimates: one answer for all
        if cached is not None and cached[:3] == (budget, self.pool.version, self.costs.version):
            return cached[3]
        tokens = self.pool.expected_tokens(self._budget_depth(budget))
        known = self.costs.known()
        buckets = {b for b, v in known if v == SPECULATIVE}
        pays = not buckets  # no step timed yet (before `warmup()`): nothing says it does not pay
        for bucket in buckets:
            plain = self._drafting_plain_seconds(bucket, known)
            if plain is None or tokens * plain > self.costs(bucket, SPECULATIVE):
                pays = True
                break
        self._pays = (budget, self.pool.version, self.costs.version, pays)
        return pays

    def admit_with_drafter(self, budget: int, batch=None) -> bool:
        """At a request's admission: True = with its drafter (its `budget`), False = without
        (budget 0), see the module docstring (**Admission**). `budget` 0 is always False.
        `batch`: (the bucket the request joins, the other requests holding slots there, how many
        waiting requests come in beside it now), or a function returning that triple (called
        only when an exploration is due); without it an exploring admission does not ask whether
        its evidence can come in."""
        if budget == 0:
            return False
        if self.drafting_pays_somewhere(budget):
            self._undrafted_run, self._admit_interval = 0, FIRST_INTERVAL
            choice = True
        elif self._undrafted_run >= self._admit_interval and (
                batch is None or self._evidence_can_come(budget, *(batch() if callable(batch) else batch))):
            # explore: new evidence for the pool
            self._undrafted_run, self._admit_interval = 0, min(2 * self._admit_interval, MAX_INTERVAL)
            choice = True
        else:
            self._undrafted_run += 1
            choice = False
        self.admissions[choice] += 1
        return choice

    def _evidence_can_come(self, budget: int, bucket: int, others: list, coming: int = 0) -> bool:
        """Whether a speculative step of `bucket` could beat the plain step a drafting batch
        runs there, beside `others` and `coming` requests admitted with it (without their
        drafter: exploration is due only while drafting pays nowhere), were every draft of a
        request of `budget` accepted. If not, the rule never speculates while it runs and its
        drafts are never observed. Costs not known yet: nothing says no."""
        known = self.costs.known()
        plain = self._drafting_plain_seconds(bucket, known)
        if (bucket, SPECULATIVE) not in known or plain is None:
            return True
        tokens = sum(self.expected_tokens(r) for r in others) + coming + 1.0 + self._budget_depth(budget)
        return tokens * plain > (len(others) + coming + 1) * self.costs(bucket, SPECULATIVE)

    def _drafting_plain_seconds(self, bucket: int, known) -> float | None:
        """The cheapest plain step a batch with a drafting request runs in `bucket` (PLAIN or
        DEFERRED, of those in `known`), or None before either is timed. Not BARE: priced against
        the target's step alone, the pool's dips in a good head's acceptance turned requests away
        for good (0.94x the better fixed choice at batch 4 in the SmolLM2 replay)."""
        plain = [self.costs(bucket, v) for v in (PLAIN, DEFERRED) if (bucket, v) in known]
        return min(plain) if plain else None

    def _plain_could_win(self, bucket: int, plain: str, tokens: dict, seconds: dict) -> bool:
        """Whether the plain step would beat the speculative one at its lowest possible cost:
        its warm-up time (idle slots, no context: a live step of the same graph is never
        cheaper). If even then it loses, a probe can only confirm the choice and costs a step's
        worth of tokens (on the H200 at batch 4, 3 such probes in ~100 steps cost ~3% of the
        decode), so none is run. The acceptance side needs no probe here: speculative steps
        keep updating it, and the choice flips as soon as the estimates say so."""
        cheapest = min(seconds[False], self.costs.warm.get((bucket, plain), seconds[False]))
        return tokens[False] / cheapest > tokens[True] / seconds[True]

    def observe(self, request, accept_length: int) -> None:
        """After a speculative step: fold `request`'s accepted length into its and the pool's estimates."""
        if request.budget == 0:
            return
        self._record(request, accept_length)
        self._summed = None  # the sums folded in last no longer hold
        self._folded = self._step

    def _record(self, request, accept_length: int) -> None:
        """`request`'s accepted length into its and the pool's estimates (budget 0: nothing drafted)."""
        if request.budget == 0:
            return
        limit = self.depth_limit(request)
        self.estimate(request).observe(accept_length, limit)
        self.pool.observe(accept_length, limit)

    def observe_later(self, requests: list, accept_lengths: list[int], step: int | None = None,
                      idle: list = ()) -> None:
        """After a step: keep its requests' accepted lengths for `fold()`, which the engine
        calls right after launching the next step, so this per-request host work (with the
        sums the next choice reads: ~400 us a step at batch 64 on a 2-core CPU,
        `examples/bench_rule_host.py`; it made an adaptive speculative step of SmolLM2 on the
        H200 0.57 ms slower than a fixed chain's) runs while the device computes instead of
        between two steps. The choice made in between reads estimates one step old. A plain
        step passes no requests. `step`: the choice count at that step's choice (default the
        latest: with overlapped steps the rule has chosen the next one already). `idle`: the
        requests of a plain step (their estimates age, `DepthAcceptance.age`)."""
        self._fold_acceptance()  # never more than one step pending
        self._pending = (self._step if step is None else step, list(zip(requests, accept_lengths, strict=True)),
                         list(idle))

    def fold(self, upcoming: list | None = None) -> None:
        """Fold the pending step's acceptance (and its time, if `measured(later=True)`) into the
        estimates and precompute the expected tokens of `upcoming` (default: the pending step's
        requests; the engine passes the requests of the step it has just launched, the next
        choice's likely batch), so that the next choice reads cached sums."""
        self._fold_time()
        self._fold_acceptance(upcoming)

    def _fold_time(self) -> None:
        """`fold`'s time part: the pending step's time (`measured(later=True)`) into the costs."""
        if self._pending_time is not None:
            timed, self._pending_time = self._pending_time, None
            self._apply_time(*timed)

    def _fold_acceptance(self, upcoming: list | None = None) -> None:
        """`fold`'s acceptance part: the pending step's accepted lengths and the sums."""
        if self._pending is None:
            return
        step, observed, idle = self._pending
        self._pending = None
        for request, accept_length in observed:
            self._record(request, accept_length)
        for request in idle:
            if request.budget != 0 and request.acceptance is not None:
                request.acceptance.age()
        # default: the step's requests (one of the two lists is empty)
        requests = list(upcoming) if upcoming is not None else [request for request, _ in observed] + idle
        tokens = [self.expected_tokens(r) for r in requests]
        self._summed = (requests, sum(tokens), dict(zip(map(id, requests), tokens)))
        self._folded = step

    def measured(self, bucket: int, variant: str, tokens: int, seconds: float, decision: "Decision | None" = None,
                 *, sample: bool = True, later: bool = False) -> None:
        """After the step: the variant that ran, its emitted tokens and host seconds (the cost
        model's live sample); `decision`: the step's own (default `last`; with overlapped
        steps the rule has already chosen the next one). It becomes `done`, with its outcome.
        `sample=False`: the seconds are not a clean measure of the variant (an overlapped step
        with a prefill in its window, whose share of the device's time cannot be told apart):
        the decision records them, the cost model and the exploration budget do not.
        `later=True` (the engine): the cost model takes the sample at the next `fold`, beside
        the device, instead of between two steps."""
        decision = self.last if decision is None else decision
        if decision is not None:
            decision.measured_tokens, decision.measured_seconds = tokens, seconds
        self.done = decision
        self._fold_time()  # never more than one step pending
        timed = (bucket, variant, tokens, seconds, decision, sample)
        if later:
            self._pending_time = timed
        else:
            self._apply_time(*timed)

    def _apply_time(self, bucket: int, variant: str, tokens: int, seconds: float, decision: "Decision | None",
                    sample: bool) -> None:
        """A step's time into the cost model and the bucket's exploration budget."""
        self._timed = self._step if decision is None else decision.step
        if not sample:
            return
        self.costs.update(bucket, variant, seconds)
        if decision is not None and decision.speculative and not decision.probe and decision.tokens[False] > 0:
            # the time speculating saved against the plain step's predicted rate: a bucket
            # where speculation pays may probe again soon after it stops paying
            plain_rate = decision.tokens[False] / decision.seconds[False]
            self._budget[bucket] = self._budget.get(bucket, 0.0) + max(0.0, tokens / plain_rate - seconds)


class DecisionLog:
    """Step observer that keeps every adaptive decision, so a wrong one can be read off.

        log = DecisionLog(); decoder.add_observer(log); decoder.generate(...); print(log.summary())
    """

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def on_step(self, engine, accept_length: list[int]) -> None:
        rule = engine.adaptive_rule
        if rule is not None and rule.done is not None:  # the decision of the step just handed off
            self.decisions.append(rule.done)

    def summary(self) -> list[dict]:
        """Per (bucket, variant): steps, probes, predicted and measured tok/s (totals over its steps)."""
        rows: dict[tuple[int, str], dict] = {}
        for d in self.decisions:
            variant = SPECULATIVE if d.speculative else d.plain
            row = rows.setdefault((d.bucket, variant), dict(
                bucket=d.bucket, variant=variant, steps=0, probes=0,
                predicted_tokens=0.0, predicted_seconds=0.0, tokens=0, seconds=0.0))
            row["steps"] += 1
            row["probes"] += d.probe
            row["predicted_tokens"] += d.tokens[d.speculative]
            row["predicted_seconds"] += d.seconds[d.speculative]
            row["tokens"] += d.measured_tokens or 0
            row["seconds"] += d.measured_seconds or 0.0
        for row in rows.values():
            row["predicted_tok_s"] = row["predicted_tokens"] / row["predicted_seconds"]
            row["measured_tok_s"] = row["tokens"] / row["seconds"] if row["seconds"] else float("nan")
        return [rows[k] for k in sorted(rows)]
