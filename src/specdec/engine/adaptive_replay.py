"""Replay the adaptive rule on recorded acceptance with planted step times: no model, no device.

Why: on the GPU a decision's worth is buried in a whole run (prefill, admission, noise), and
device time is scarce. Here the rule (`adaptive.AdaptiveRule`) decides every step of a
continuous-batching run whose step times are given (seconds per variant, e.g. measured on the
H200) and whose accepted lengths come from traces (each request's accepted length per
speculative step, recorded from a run that always speculated). The rule is called in the
engine's order (choose, fold the last step's acceptance after the launch, then the measured
time and the acceptance of this step), and the plain step due is `deferred` while every path
stays within the drafter's depth, else `plain` (the drafter ingests), as in the engine; `bare`
when no running request drafts (priced at `StepTimes.bare`, default the target-only step). A
request is admitted with or without its drafter as the engine admits it
(`AdaptiveRule.admit_with_drafter`); the draft prompt pass it saves is not priced here.

A trace is consumed one entry per speculative step of its request: a plain step emits one
token and leaves the trace where it is (the acceptance at a position one token later is not
recorded; for a never-accepting head, a trace of zeros, the replay is exact).

    run = replay(traces, StepTimes(spec=1.9e-3, plain=1.1e-3, deferred=1.05e-3), batch=1, new_tokens=128)
    run.tokens_per_second / replay(..., policy="never").tokens_per_second

Step times of one bucket price every step at that bucket's cost; step times per bucket
(`{1: StepTimes(...), 4: ..., 16: ..., 64: ...}`) run each step in the smallest bucket that
holds the running requests, as the engine's captured graphs do, so the tail of a run, when
fewer requests are left than the batch, costs what a smaller batch costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .adaptive import BARE, DEFERRED, PLAIN, SPECULATIVE, AdaptiveRule, DepthAcceptance, plain_step_due

__all__ = ["StepTimes", "ReplayRun", "replay", "replay_warm", "POLICIES"]

POLICIES = ("adaptive", "always", "never", "no-drafter")  # the rule; always / never speculate; a target-only engine


@dataclass(frozen=True)
class StepTimes:
    """Seconds of one step of each variant in the replayed bucket (one bucket: the batch)."""

    spec: float
    plain: float  # the plain step that runs the drafter's ingest
    deferred: float  # the plain step that skips the drafter
    target_only: float | None = None  # a target-only engine's step (no drafter at all), for the baseline
    # the bare plain step (no request of the batch drafts); None: the cheaper of target_only's and deferred's
    # (unmeasured: it runs what a target-only step runs, and less than a deferred one)
    bare: float | None = None

    def __post_init__(self) -> None:
        for name in ("spec", "plain", "deferred", "target_only", "bare"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"StepTimes.{name}={getattr(self, name)} must be > 0 seconds")

    def of(self, variant: str) -> float:
        if variant == BARE:
            return self.bare if self.bare is not None else min(self.deferred, self.target_only or self.deferred)
        return {SPECULATIVE: self.spec, PLAIN: self.plain, DEFERRED: self.deferred}[variant]


@dataclass
class _Request:
    trace: list[int]
    left: int  # tokens still to emit
    budget: int
    acceptance: DepthAcceptance | None = None  # the rule's estimate (set by the rule)
    at: int = 0  # the next trace entry
    path: int | None = 0  # rows of the path the drafter has not ingested, - 1 (None: unknown)


@dataclass
class ReplayRun:
    """What one replay did: tokens, seconds, and steps per variant (probes among them)."""

    tokens: int = 0
    seconds: float = 0.0
    steps: dict[str, int] = field(default_factory=lambda: {SPECULATIVE: 0, PLAIN: 0, DEFERRED: 0, BARE: 0})
    probes: int = 0
    rule: AdaptiveRule | None = None  # the adaptive rule after the run (pass it to a later replay: warm estimates)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def _buckets(times: StepTimes | Mapping[int, StepTimes], batch: int) -> dict[int, StepTimes]:
    """{bucket: step times}, ascending, up to the first bucket that holds `batch`."""
    if isinstance(times, StepTimes):
        return {batch: times}
    if not times or any(not (isinstance(b, int) and b >= 1) for b in times):
        raise ValueError(f"step times per bucket need int bucket sizes >= 1; got {list(times)}")
    if any(not isinstance(t, StepTimes) for t in times.values()):
        raise ValueError("step times per bucket must be StepTimes")
    if max(times) < batch:
        raise ValueError(f"batch={batch} exceeds the largest bucket with step times ({max(times)}); "
                         f"buckets: {sorted(times)}")
    top = min(b for b in times if b >= batch)
    return {b: times[b] for b in sorted(times) if b <= top}


def replay(traces: list[list[int]], times: StepTimes | Mapping[int, StepTimes], *, batch: int, new_tokens: int,
           depth: int = 5, policy: str = "adaptive", requests: int | None = None,
           rule: AdaptiveRule | None = None) -> ReplayRun:
    """Serve `requests` requests (default one per trace; trace i % len(traces) for request i),
    `new_tokens` each, `batch` at a time (a finished request's slot refills at once), one chain
    drafter of `depth`. `policy`: "adaptive" (the rule), "always" or "never" (speculate on every
    step, or on none: the plain steps), or "no-drafter" (a target-only engine: one token per
    request per step of `times.target_only` seconds). `times`: one bucket's step times for every
    step, or step times per bucket (each step in the smallest bucket >= the running requests;
    the buckets must reach `batch`).
    `rule`: an adaptive rule to go on with (e.g. `ReplayRun.rule` of a warm-up replay, as the
    engine's rule has seen its warm-up requests before a timed run); default a fresh one."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}; allowed: {POLICIES}")
    if batch < 1 or new_tokens < 1:
        raise ValueError(f"batch={batch} and new_tokens={new_tokens} must be >= 1")
    buckets = _buckets(times, batch)
    if policy == "no-drafter" and any(t.target_only is None for t in buckets.values()):
        raise ValueError("policy='no-drafter' needs StepTimes.target_only (in every bucket)")
    if not traces or any(not t for t in traces):
        raise ValueError("every trace needs at least one accepted length")
    if any(not 0 <= a <= depth for t in traces for a in t):
        raise ValueError(f"accepted lengths must lie in [0, depth={depth}]")
    total = len(traces) if requests is None else requests
    queue = [_Request(traces[i % len(traces)], new_tokens, depth) for i in range(total)]
    queue.reverse()
    if rule is None:
        rule = AdaptiveRule(depth, chain=True, full_budget=depth)
    elif rule.max_depth != depth:
        raise ValueError(f"the rule drafts to depth {rule.max_depth}, the replay to depth={depth}")
    for bucket, bucket_times in buckets.items():  # warm-up times: the planted ones
        for variant in (SPECULATIVE, PLAIN, DEFERRED, BARE):
            rule.costs.record(bucket, variant, [bucket_times.of(variant)])
    run, running = ReplayRun(rule=rule if policy == "adaptive" else None), []
    while queue or running:
        while queue and len(running) < batch:
            r = queue.pop()
            coming = min(len(queue), batch - len(running) - 1)  # admitted beside it now, as in the engine
            joins = next(b for b in buckets if b >= len(running) + 1 + coming)  # the bucket they fill
            if policy == "adaptive" and not rule.admit_with_drafter(r.budget, (joins, running, coming)):
                r.budget = 0  # admitted without its drafter, as the engine does (its prompt pass is not priced here)
            running.append(r)
        bucket = next(b for b in buckets if b >= len(running))  # the smallest graph that holds them
        plain = plain_step_due(running, [r.path for r in running], depth)  # the engine's rule
        if policy == "adaptive":
            speculative = rule.choose(bucket, running, plain)
            run.probes += rule.last.probe
            rule.fold(running)  # the engine folds the last step's acceptance and time right after the launch
        else:
            speculative = policy == "always"
        variant = SPECULATIVE if speculative else plain
        emitted, observed, lengths, idle = 0, [], [], []
        for r in running:
            if speculative and r.budget == 0:  # no drafts: the root's token alone, nothing observed
                a = 0
                r.path = 0
            elif speculative:
                a = r.trace[r.at % len(r.trace)]  # observed as accepted; the tokens past `left` are cut
                r.at += 1
                r.path = a
                observed.append(r)
                lengths.append(a)
            else:
                a = 0
                r.path = r.path + 1 if variant == DEFERRED else 0
                idle.append(r)
            out = min(a + 1, r.left)
            r.left -= out
            emitted += out
        step = buckets[bucket]
        seconds = step.target_only if policy == "no-drafter" else step.of(variant)
        run.tokens += emitted
        run.seconds += seconds
        run.steps[variant] += 1
        if policy == "adaptive":
            rule.measured(bucket, variant, emitted, seconds, later=True)  # folded after the next launch
            rule.observe_later(observed, lengths, idle=idle)
        running = [r for r in running if r.left > 0]
    return run


def replay_warm(traces: list[list[int]], times: StepTimes, *, warm_tokens: int = 8, **kw) -> ReplayRun:
    """The adaptive rule's timed pass after a short warm-up pass over the same requests
    (`warm_tokens` each, as `examples/bench_batch.py`'s decoders serve before they are timed);
    `kw` as for `replay` (not `policy` or `rule`)."""
    warm = replay(traces, times, policy="adaptive", **dict(kw, new_tokens=warm_tokens))
    return replay(traces, times, policy="adaptive", rule=warm.rule, **kw)
