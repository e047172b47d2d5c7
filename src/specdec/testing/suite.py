"""Every property of the conformance kit: importing this module imports the check modules,
whose `kit.register` decorators fill the kit's registry; `properties_for` picks from it.

The kit's layers, bottom up (a module imports only modules below it): `profiles`; `kit` (the
machinery: `Context`, `Property`, `register`, `run_property`), `strategies` (hypothesis
strategies) and `oracles` (brute-force references); `check_trees`, `check_verifiers`,
`check_policies`, `check_drafters` (the properties); `suite`; `cli` (which imports `kit` and
`suite` only when it runs the kit: they need hypothesis and torch, its flags do not).
"""

from __future__ import annotations

from . import check_drafters, check_policies, check_trees, check_verifiers  # noqa: F401  (they register)
from .kit import _REGISTRY, Property, Subject

__all__ = ["properties_for"]


def properties_for(subject: Subject) -> list[Property]:
    """The registered properties of the subject's kind that apply to it (registration order)."""
    return [p for p in _REGISTRY if p.kind == subject.kind and p.applies(subject)]
