"""Tree policies: which nodes a draft tree keeps, as fixed-shape tensor functions.

A drafter answers `expand(Frontier) -> Candidates` (top-K or sampled children of each
frontier node, `specdec.policies.candidates`); a `TreePolicy` (`specdec.strategies`) picks
the next frontier, records parents and returns a `GrownTree`. Built-ins, each behind the
`specdec_tree_policy` hook (`specdec.plugins.tree_policies`): `linear`, `dynamic` (EAGLE-2),
`sampled` (whole i.i.d. groups) and `static` (EAGLE-1 / Medusa choices).

- `candidates`: `top_candidates`, `sampled_candidates`, `stable_topk`, `clean_logq`.
- `frontier`: `FrontierPolicy`, the shared expand loop and node bookkeeping.
- `shapes`: the built-in policies and their `SpecConfig` rules.
- `static_tree`: choices validation, the EAGLE-1 default tree, JSON files of paths.
"""

from .candidates import clean_logq, sampled_candidates, stable_topk, top_candidates
from .frontier import FrontierPolicy, assemble
from .shapes import DynamicPolicy, LinearPolicy, SampledPolicy, StaticPolicy, group_sizes, history_size
from .static_tree import EAGLE1_DEFAULT, StaticTree, check_choices, read_choices, static_tree

__all__ = [
    "EAGLE1_DEFAULT",
    "DynamicPolicy",
    "FrontierPolicy",
    "LinearPolicy",
    "SampledPolicy",
    "StaticPolicy",
    "StaticTree",
    "assemble",
    "check_choices",
    "clean_logq",
    "group_sizes",
    "history_size",
    "read_choices",
    "sampled_candidates",
    "stable_topk",
    "static_tree",
    "top_candidates",
]
