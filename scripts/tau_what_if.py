"""What a head would have to gain per draft depth to reach a target tau: a bound from an evaluation.

Why: a training lever (a sharper teacher, a longer unroll) moves a head's acceptance at some draft
depths; before spending device time on it, this says how much acceptance the target tau needs.
An evaluation JSON (`python -m specdec.train eval ... --json F`) records per setup and category
the acceptance at each draft depth given the depth was reached (`depth_acceptance`); tau is then
1 + p1 + p1 p2 + ... (the bonus token plus the drafts accepted). This prints, per setup and
category, the measured tau, that product, and the tau if depth 1 alone, or every depth, gained
`--lift` (each capped at 1), and the smallest uniform lift that reaches the tau asked. The product
runs a little above the measured tau (a step near an answer's end drafts past its last token), so
the lift is sought for the asked tau plus that gap.

    python scripts/tau_what_if.py notes/gpu/issue21/e7/eval_u7_categories.json --categories general-chat,code-short-header
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.train.ttt import estimated_accept_length


def tau_from_depths(p: list[float]) -> float:
    """1 + sum_k prod_{j<=k} p_j: expected tokens a step, with p_j the acceptance at depth j given depth j was
    reached (the training log's `estimated_accept_length` over every depth given, each checked to be in [0, 1])."""
    if bad := [x for x in p if not 0.0 <= x <= 1.0]:
        raise ValueError(f"acceptance {bad[0]} is out of range; allowed: [0, 1]")
    return estimated_accept_length(p, depth=len(p))


def lifted(p: list[float], lift: float, depths: int | None = None) -> list[float]:
    """p with `lift` added to its first `depths` entries (all when None), each capped at 1."""
    n = len(p) if depths is None else depths
    return [min(1.0, x + lift) if k < n else x for k, x in enumerate(p)]


def lift_needed(p: list[float], want: float, step: float = 0.005) -> float | None:
    """The smallest uniform lift (a multiple of `step`) whose tau reaches `want`; None if even p = 1 does not."""
    if tau_from_depths([1.0] * len(p)) < want:
        return None
    k = 0
    while tau_from_depths(lifted(p, k * step)) < want:
        k += 1
    return k * step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("eval_json", type=Path)
    ap.add_argument("--categories", default="general-chat,code-short-header", help="comma-separated; 'all' is the pooled row")
    ap.add_argument("--lift", type=float, default=0.13, help="acceptance added per depth in the what-if columns")
    ap.add_argument("--want-chain", type=float, default=3.0, help="the chain tau asked (issue 21: 3.0)")
    ap.add_argument("--want-tree", type=float, default=4.0, help="the tree tau asked (issue 21: 4.0)")
    args = ap.parse_args(argv)
    if not 0.0 <= args.lift <= 1.0:
        ap.error(f"--lift {args.lift} is out of range; allowed: [0, 1]")
    rows = json.loads(args.eval_json.read_text())
    print(f"| setup | category | tau measured | tau from depths | depth 1 +{args.lift:g} | every depth +{args.lift:g} "
          "| uniform lift to the tau asked |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        depths = row.get("depth_acceptance")
        if not depths:
            continue
        want = args.want_tree if row["setup"] == "tree" else args.want_chain
        for cat in args.categories.split(","):
            if cat not in depths:
                raise SystemExit(f"category {cat!r} is not in {args.eval_json}; it has: {', '.join(sorted(depths))}")
            p = depths[cat]["p"]
            measured = row["tau"] if cat == "all" else row["tau_by_category"][cat]
            need = lift_needed(p, want + max(0.0, tau_from_depths(p) - measured))
            print(f"| {row['name']} | {cat} | {measured:.2f} | {tau_from_depths(p):.2f} | {tau_from_depths(lifted(p, args.lift, 1)):.2f} "
                  f"| {tau_from_depths(lifted(p, args.lift)):.2f} | {'unreachable' if need is None else f'+{need:.3f} to {want:g}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
