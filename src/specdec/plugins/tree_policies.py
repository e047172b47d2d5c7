"""tree="linear" | "dynamic" | "static" | "sampled": the built-in tree policies
(`specdec.policies.shapes`), behind `specdec_tree_policy`.

Written as a third party would: it declares its names and answers for its own names only.
Sampling follows the verifier's needs, whatever its name: a verifier with
`needs_draft_probs` gets a policy whose candidates are i.i.d. draws (a sampled chain for
`linear`, whole groups for `dynamic` and `sampled`, i.i.d. children in the fixed shape for
`static`). Options: ``plugin_options["static"] = {"choices": [[0], [1], [0, 0], ...]}``
or ``{"file": "tree.json"}`` (a JSON list of paths, or ``{"choices": [...]}``; default: the
EAGLE-1 tree cut to the budget); the others take none.
"""

from __future__ import annotations

from specdec.config import SpecConfig
from specdec.plugin_helpers import declared_names, strategy_hook
from specdec.policies.shapes import BUILTIN, builtin


@strategy_hook(*BUILTIN)
def specdec_tree_policy(config: SpecConfig, verifier):
    return builtin(config, samples=verifier.needs_draft_probs)


specdec_strategy_names = declared_names(specdec_tree_policy)
