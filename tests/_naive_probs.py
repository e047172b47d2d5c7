"""Test helper: `naive_probs`, the sampling filters (temperature -> top-k -> top-p -> min-p) on one
row, float64, written the obvious way.

Not a test module (leading underscore). Used by kernels/test_sampling_probs.py (where it was
defined until the tests moved into folders), engine/test_filters_end_to_end.py and
plugins/test_verifier_filters_distribution.py.
"""

from __future__ import annotations

import math


def naive_probs(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> list[float]:
    """The documented filters, one row, float64, written the obvious way."""
    V = len(logits)
    if temperature == 0:
        best = max(range(V), key=lambda i: (logits[i], -i))
        return [1.0 if i == best else 0.0 for i in range(V)]
    top = max(logits)
    p = [math.exp((x - top) / temperature) for x in logits]

    def renorm(q):
        s = sum(q)
        return [x / s for x in q]

    p = renorm(p)
    if 0 < top_k < V:
        kth = sorted(p, reverse=True)[top_k - 1]
        p = renorm([x if x >= kth else 0.0 for x in p])
    if top_p < 1:
        kept, before = [], 0.0
        for x in sorted(p, reverse=True):
            if x > 0 and before < top_p:
                kept.append(x)
                before += x
        p = renorm([x if x >= kept[-1] else 0.0 for x in p])
    if min_p > 0:
        thr = min_p * max(p)
        p = renorm([x if x >= thr else 0.0 for x in p])
    return p
