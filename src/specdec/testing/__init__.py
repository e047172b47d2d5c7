"""The conformance kit: specdec's property suites, shipped for plugin authors.

`specdec check [NAME ...] --device cuda --profile gpu` (or `python -m specdec.testing`, or
`specdec.testing.check(...)`) runs, against any installed strategy, built-in or third party,
the property checks the built-ins pass, and prints a pass/fail table:

- tree builders: metadata against a parent walk, buffer reuse (`check_trees`);
- verifiers: acceptance paths, greedy rows against a brute-force walk, distribution tests
  for sampling verifiers with their thresholds in the code (`check_verifiers`);
- KV relocators: the whole storage against a per-token loop (`check_trees`);
- tree policies: valid trees within budget, the declared shape, parents' expansions,
  distinct greedy siblings, determinism, EAGLE-2 against brute force, static paths, and
  exact sampling with every verifier the policy allows (`check_policies`);
- drafters: the tree contract on every proposal, greedy output equal to target-only,
  determinism, on a tiny random target (`check_drafters`).

The project's own tests call the same kit (`tests/testing/test_conformance_kit.py`,
`tests/policies/test_tree_policies.py`) and its hypothesis strategies and oracles (`strategies`,
`oracles`).

Layers, bottom up: `profiles`, `kit` (the machinery), `strategies` / `oracles`, the `check_*`
modules (the properties, each registered with `kit.register`), `suite` (imports every check
module; `properties_for`), `cli`. No module imports one above it (`tests/test_import_graph.py`).

The kit needs hypothesis (``pip install hypothesis``); the names below import it on first
use, so `specdec --help` and `specdec.testing.cli`'s flags work without it.
"""

import importlib

__all__ = ["Context", "Property", "Result", "Subject", "check", "main", "properties_for", "run_property"]

_HOME = {"check": "cli", "main": "cli", "Context": "kit", "Property": "kit", "Result": "kit", "Subject": "kit",
         "properties_for": "suite", "run_property": "kit"}


def __getattr__(name: str):
    """Lazy exports (PEP 562): `kit` imports hypothesis, an optional dependency."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
