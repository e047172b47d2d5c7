"""Host time of the adaptive rule per step, between two steps and overlapped with the device.

Why: the engine sits idle on the device between a step's hand-off and the next launch, so
host work there adds to every step. The adaptive rule folds each request's accepted length
into its estimates and sums the expected tokens of every running request; done between the
steps, that cost grows with the batch (on the H200 it made an adaptive speculative step of
SmolLM2 at batch 64 0.57 ms dearer than a fixed chain's). The engine now folds a step's
acceptance in right after launching the next one (`AdaptiveRule.observe_later` / `fold`).
This times both orders on planted requests (a chain of depth 5, random accepted lengths),
no model and no device: pure host time, so it runs anywhere. `--churn K`: K requests finish
and K new ones take their places after every step, as in continuous batching at a large batch
(SmolLM2 at batch 64 on the H200: ~2-3 a step), so the choice cannot reuse the folded sum
as it stands and reads the folded per-request figures instead.

    python examples/bench_rule_host.py                      # batch 1 4 16 64, 400 steps each
    python examples/bench_rule_host.py --batch-sizes 64 --steps 2000 --churn 3
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

from _bench_common import log, markdown_table

from specdec.engine.adaptive import PLAIN, SPECULATIVE, AdaptiveRule

DEPTH = 5  # EAGLE-3 chain D=5, the shipped head's setup


@dataclass
class PlantedRequest:
    budget: int = DEPTH
    acceptance: object = None


def time_orders(batch: int, steps: int, seed: int = 0, churn: int = 0) -> dict:
    """Microseconds per step of the rule's host work: observing at once (between the steps)
    against the engine's order (only `choose` between the steps, `fold` beside the device)."""
    rng = random.Random(seed)
    lengths = [[rng.randint(0, DEPTH) for _ in range(batch)] for _ in range(64)]
    out = {}
    for order in ("at once", "engine"):
        rule = AdaptiveRule(DEPTH, chain=True, full_budget=DEPTH)
        rule.costs.record(batch, SPECULATIVE, [1.0])
        rule.costs.record(batch, PLAIN, [10.0])  # speculating always wins: every step observes
        requests = [PlantedRequest() for _ in range(batch)]
        between = beside = 0.0
        for step in range(steps):
            accepted = lengths[step % len(lengths)]
            t0 = time.perf_counter()
            rule.choose(batch, requests)
            t1 = time.perf_counter()
            if order == "engine":
                rule.fold(requests)  # the engine runs this right after the launch
                t2 = time.perf_counter()
                rule.measured(batch, SPECULATIVE, batch, 1.0)
                rule.observe_later(requests, accepted)
                t3 = time.perf_counter()
                between += (t1 - t0) + (t3 - t2)
                beside += t2 - t1
            else:
                rule.measured(batch, SPECULATIVE, batch, 1.0)
                for request, a in zip(requests, accepted):
                    rule.observe(request, a)
                between += time.perf_counter() - t0
            for _ in range(min(churn, batch)):  # finished requests leave, new ones take their slots
                requests[rng.randrange(batch)] = PlantedRequest()
        out[order] = (1e6 * between / steps, 1e6 * beside / steps)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--churn", type=int, default=0, help="requests replaced after every step (default 0)")
    args = p.parse_args()
    if args.steps < 1 or min(args.batch_sizes) < 1:
        p.error(f"--steps {args.steps} and --batch-sizes {args.batch_sizes} must be >= 1")
    if args.churn < 0:
        p.error(f"--churn {args.churn} must be >= 0")
    rows = []
    for batch in args.batch_sizes:
        t = time_orders(batch, args.steps, churn=args.churn)
        rows.append([batch, f"{t['at once'][0]:.0f}", f"{t['engine'][0]:.0f}", f"{t['engine'][1]:.0f}"])
    log(markdown_table(["batch", "at once: us between steps", "engine order: us between steps",
                        "engine order: us beside the device"], rows))


if __name__ == "__main__":
    main()
