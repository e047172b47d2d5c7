"""Plugin manager and build-time resolution of the five hooks into strategies.

`get_plugin_manager()` registers the built-in plugins and the third-party ones found under
the entry-point group `specdec`. `resolve(config, target, pm)` asks each hook once and
returns a `Strategies` record; the engine then runs those objects with no pluggy call in
the step. Unknown strategy names fail here with the list of names that exist.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import pluggy

from . import hookspecs
from .config import ConfigError, SpecConfig, resolve_capture_layers
from .plugins import BUILTIN_PLUGINS
from .strategies import Drafter, KVRelocator, TargetInfo, TreeBuilder, Verifier

__all__ = ["get_plugin_manager", "resolve", "Strategies", "DrafterCaps", "VerifierCaps", "strategy_names", "UnknownStrategyError"]

ENTRY_POINT_GROUP = "specdec"


class UnknownStrategyError(ConfigError):
    """A config names a strategy that no registered plugin provides."""


def get_plugin_manager(*, load_entrypoints: bool | None = None) -> pluggy.PluginManager:
    """A fresh PluginManager with the built-ins and the `specdec` entry-point plugins.

    `load_entrypoints=False` (or env `SPECDEC_LOAD_ENTRYPOINTS=0`) sees built-ins only.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for module_name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)
    if load_entrypoints is None:
        load_entrypoints = os.environ.get("SPECDEC_LOAD_ENTRYPOINTS", "1") != "0"
    if load_entrypoints:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm


def strategy_names(pm: pluggy.PluginManager) -> dict[str, list[str]]:
    """Union of the names every plugin declares, by kind (`drafter`, `verifier`)."""
    names: dict[str, list[str]] = {}
    for answer in pm.hook.specdec_strategy_names():
        for kind, kind_names in (answer or {}).items():
            for name in kind_names:
                if name not in names.setdefault(kind, []):
                    names[kind].append(name)
    return names


def _check_name(kind: str, name: str, names: dict[str, list[str]]) -> None:
    available = names.get(kind, [])
    if name not in available:
        raise UnknownStrategyError(f"{kind}={name!r} is not provided by any plugin; available: {sorted(available)}")


@dataclass(frozen=True)
class DrafterCaps:
    """A drafter's capabilities, read once at resolve time (the engine never probes the object).

    reads:        "captured" (target layer outputs), "last_hidden" (the target's final-normed
                  state) or "nothing".
    runs_on_host: drafts between steps from the token hand-off (`propose_host`), outside
                  the captured step.
    samples_drafts: the drafts are sampled and come with `draft_probs`.
    kv_lookahead: positions past committed_len the drafter writes in its own KV.
    modules:      the drafter's torch modules (compiled with the target's when compile is on).
    attach:       `attach(cache)` puts the drafter's KV on the target cache's allocator, or None.
    use_compiled: `use_compiled(on)` switches the drafter's own tensor glue to compiled pieces, or None.
    """

    reads: str
    runs_on_host: bool
    samples_drafts: bool
    kv_lookahead: int
    modules: tuple = ()
    attach: object = None
    use_compiled: object = None


@dataclass(frozen=True)
class VerifierCaps:
    """A verifier's capabilities, read once at resolve time."""

    lossless: bool
    needs_draft_probs: bool
    greedy_only: bool


def _drafter_caps(drafter) -> DrafterCaps:
    last_hidden = bool(getattr(drafter, "needs_last_hidden", False))
    captured = bool(getattr(drafter, "needs_hidden_states", False))
    if last_hidden and captured:
        raise ConfigError("a drafter reads either captured layers or the last hidden state, not both")
    model = getattr(drafter, "model", None)
    return DrafterCaps(
        reads="captured" if captured else "last_hidden" if last_hidden else "nothing",
        runs_on_host=bool(getattr(drafter, "runs_on_host", False)),
        samples_drafts=bool(getattr(drafter, "samples_drafts", False)),
        kv_lookahead=int(getattr(drafter, "kv_lookahead", 0)),
        modules=(model,) if hasattr(model, "modules") else (),
        attach=getattr(drafter, "attach", None),
        use_compiled=getattr(drafter, "use_compiled", None),
    )


def _verifier_caps(verifier) -> VerifierCaps:
    return VerifierCaps(
        lossless=bool(getattr(verifier, "lossless", False)),
        needs_draft_probs=bool(getattr(verifier, "needs_draft_probs", False)),
        greedy_only=bool(getattr(verifier, "greedy_only", False)),
    )


@dataclass(frozen=True)
class Strategies:
    """What the engine runs: one resolved strategy per hook, and their capabilities."""

    capture_layers: tuple[int, ...]  # target layer outputs to capture; () = no capture buffer
    drafter: Drafter
    build_tree: TreeBuilder
    verifier: Verifier
    relocate_kv: KVRelocator
    drafter_caps: DrafterCaps | None = None  # filled by `resolve`
    verifier_caps: VerifierCaps | None = None

    def __post_init__(self) -> None:
        if self.drafter_caps is None:
            object.__setattr__(self, "drafter_caps", _drafter_caps(self.drafter))
        if self.verifier_caps is None:
            object.__setattr__(self, "verifier_caps", _verifier_caps(self.verifier))


def resolve(config: SpecConfig, target: TargetInfo, pm: pluggy.PluginManager | None = None) -> Strategies:
    """Ask each hook once, in pipeline order, for the strategy that `config` names."""
    pm = pm or get_plugin_manager()
    names = strategy_names(pm)
    _check_name("drafter", config.drafter, names)
    _check_name("verifier", config.verifier, names)

    hook = pm.hook
    capture = hook.specdec_capture_layers(config=config, target=target)
    if capture is None:
        raise ConfigError(f"no plugin answered specdec_capture_layers for drafter={config.drafter!r}")
    capture = resolve_capture_layers(target.num_layers, tuple(capture)) if capture else ()
    found = dict(
        drafter=hook.specdec_draft(config=config, target=target),
        build_tree=hook.specdec_build_tree(config=config),
        verifier=hook.specdec_verify(config=config),
        relocate_kv=hook.specdec_relocate_kv(config=config),
    )
    for what, strategy in found.items():
        if strategy is None:
            raise ConfigError(f"no plugin provides {what} for config {config.drafter=}, {config.tree=}, {config.verifier=}")
    strategies = Strategies(capture_layers=capture, **found)
    if strategies.verifier_caps.needs_draft_probs and not strategies.drafter_caps.samples_drafts:
        raise ConfigError(
            f"verifier={config.verifier!r} needs draft probabilities, but drafter={config.drafter!r} "
            "does not sample its drafts; use verifier='target-only' or 'greedy'"
        )
    return strategies
