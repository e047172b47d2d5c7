"""Adaptive speculation: per step, speculate only when the measured costs say it pays.

Why: at a small batch the target forward is bound by memory, and verifying a tree of N rows
costs little more than decoding one row, so speculation multiplies throughput; at a large
batch the forward becomes bound by arithmetic, N rows per request cost N times more, and
speculation loses throughput unless acceptance is high (the most reported complaint about
speculative decoding under concurrency). So the engine keeps two steps per batch bucket:
the full speculative step and a plain step (the drafter only ingests the accepted tokens,
so its KV stays current, and the target verifies the root alone), times both at
`warmup()`, and before each step compares

    speculative: sum over running requests of E[tokens per step] / T_full(bucket)
    plain:       number of running requests                      / T_plain(bucket)

where E[tokens per step] is each request's running mean (an exponential average of the
tokens its speculative steps emitted, started optimistic and refreshed by a speculative
probe every `PROBE_EVERY` plain steps) and T the step times, measured at warm-up on idle
slots and then refined by every step's measured time. The cheaper one per generated token
runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["CostModel", "AdaptivePolicy", "PROBE_EVERY"]

PROBE_EVERY = 8  # a speculative step after this many plain ones refreshes the acceptance estimates
EMA_WEIGHT = 0.3  # weight of the newest speculative step in a request's running mean
MARGIN = 1.02  # speculate only when it is at least 2% cheaper per token


@dataclass
class CostModel:
    """Measured seconds of a step per (bucket, speculative?)."""

    seconds: dict[tuple[int, bool], float] = field(default_factory=dict)

    def record(self, bucket: int, speculative: bool, samples: list[float]) -> None:
        self.seconds[(bucket, speculative)] = statistics.median(samples)

    def update(self, bucket: int, speculative: bool, seconds: float, weight: float = 0.1) -> None:
        """Fold a measured step (host time, hand-off included) into the estimate: warm-up times
        idle slots, live steps also pay attention over real contexts."""
        key = (bucket, speculative)
        old = self.seconds.get(key)
        self.seconds[key] = seconds if old is None else (1 - weight) * old + weight * seconds

    def __call__(self, bucket: int, speculative: bool) -> float:
        return self.seconds[(bucket, speculative)]

    def table(self) -> list[tuple[int, float, float]]:
        """(bucket, speculative seconds, plain seconds) rows, for reports."""
        buckets = sorted({b for b, _ in self.seconds})
        return [(b, self.seconds.get((b, True), float("nan")), self.seconds.get((b, False), float("nan"))) for b in buckets]


class AdaptivePolicy:
    """Chooses speculative or plain for each step (host side, no device work)."""

    def __init__(self, costs: CostModel, max_tokens_per_step: int) -> None:
        self.costs = costs
        self.prior = float(max_tokens_per_step)  # optimistic start: the whole draft accepted
        self.plain_run = 0
        self.decisions = {True: 0, False: 0}

    def estimate(self, request) -> float:
        if request.budget == 0:
            return 1.0
        return self.prior if request.tokens_per_step is None else request.tokens_per_step

    def choose(self, bucket: int, running: list) -> bool:
        """True: run the speculative step for these requests; False: the plain one."""
        if self.plain_run >= PROBE_EVERY:
            speculative = True
        else:
            gain = sum(self.estimate(r) for r in running) / self.costs(bucket, True)
            plain = len(running) / self.costs(bucket, False)
            speculative = gain >= MARGIN * plain
        self.plain_run = 0 if speculative else self.plain_run + 1
        self.decisions[speculative] += 1
        return speculative

    @staticmethod
    def observe(request, emitted: int) -> None:
        """After a speculative step: fold the tokens it emitted into the request's mean."""
        old = request.tokens_per_step
        request.tokens_per_step = float(emitted) if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * emitted
