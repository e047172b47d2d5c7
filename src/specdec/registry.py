"""Plugin manager and build-time resolution of the hooks into strategies.

`get_plugin_manager()` registers the built-in plugins and the third-party ones found under
the entry-point group `specdec`. `resolve(config, target, pm)` asks each hook once and
returns a `Strategies` record; the engine then runs those objects with no pluggy call in
the step. Unknown strategy names fail here with the list of names that exist. This is the
only module that reads a strategy's capabilities off the object (`drafter_caps`,
`verifier_caps`, `policy_caps`: required, typed, checked once); the records they fill live
beside the protocols in `specdec.strategies` and are re-exported here.

`declared_strategy_table()` / `declared_strategy_names()` list the same names without importing
the built-in plugin modules (torch): the built-ins' names come from
`specdec.plugins.BUILTIN_STRATEGY_NAMES`, the entry-point plugins are loaded and asked. The
CLI's `specdec plugins`, `--help` and name suggestions use them. This module imports no torch.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

import pluggy

from . import hookspecs
from .config import ConfigError, SpecConfig, resolve_capture_layers
from .plugins import BUILTIN_PLUGINS, BUILTIN_STRATEGY_NAMES
from .strategies import (
    READS,
    Drafter,
    DrafterCaps,
    KVRelocator,
    PolicyCaps,
    TargetInfo,
    TreeBuilder,
    TreePolicy,
    Verifier,
    VerifierCaps,
)

__all__ = [
    "get_plugin_manager",
    "resolve",
    "resolve_tree_policy",
    "Strategies",
    "DrafterCaps",
    "VerifierCaps",
    "PolicyCaps",
    "drafter_caps",
    "verifier_caps",
    "policy_caps",
    "strategy_names",
    "strategy_table",
    "declared_strategy_names",
    "declared_strategy_table",
    "UnknownStrategyError",
]

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
    if _load_entrypoints(load_entrypoints):
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm


def strategy_names(pm: pluggy.PluginManager) -> dict[str, list[str]]:
    """Union of the names every plugin declares, by kind (`drafter`, `verifier`, `tree`)."""
    names: dict[str, list[str]] = {}
    for answer in pm.hook.specdec_strategy_names():
        for kind, kind_names in (answer or {}).items():
            for name in kind_names:
                if name not in names.setdefault(kind, []):
                    names[kind].append(name)
    return names


def strategy_table(pm: pluggy.PluginManager) -> list[tuple[str, str, str]]:
    """(plugin, kind, name) for every name a registered plugin declares, in registration order."""
    rows = []
    for plugin_name, plugin in pm.list_name_plugin():
        declare = getattr(plugin, "specdec_strategy_names", None)
        for kind, names in sorted(((declare() if declare else None) or {}).items()):
            rows += [(plugin_name, kind, name) for name in names]
    return rows


def _load_entrypoints(load_entrypoints: bool | None) -> bool:
    if load_entrypoints is None:
        return os.environ.get("SPECDEC_LOAD_ENTRYPOINTS", "1") != "0"
    return load_entrypoints


def declared_strategy_table(*, load_entrypoints: bool | None = None) -> list[tuple[str, str, str]]:
    """`strategy_table(get_plugin_manager(...))` without importing the built-in plugin modules:
    their rows come from `BUILTIN_STRATEGY_NAMES`; the `specdec` entry-point plugins are loaded
    (importing whatever they import) and asked through their `specdec_strategy_names`."""
    rows = [
        (plugin_name, kind, name)
        for plugin_name in BUILTIN_PLUGINS
        for kind, names in sorted(BUILTIN_STRATEGY_NAMES[plugin_name].items())
        for name in names
    ]
    if _load_entrypoints(load_entrypoints):
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        for plugin_name in BUILTIN_PLUGINS:  # as get_plugin_manager: an entry point cannot take a built-in's name
            pm.set_blocked(plugin_name)
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        rows += strategy_table(pm)
    return rows


def declared_strategy_names(*, load_entrypoints: bool | None = None) -> dict[str, list[str]]:
    """`strategy_names(get_plugin_manager(...))` (same names, same order) without importing the
    built-in plugin modules; see `declared_strategy_table`."""
    by_plugin: dict[str, dict[str, list[str]]] = {}
    for plugin_name, kind, name in declared_strategy_table(load_entrypoints=load_entrypoints):
        by_plugin.setdefault(plugin_name, {}).setdefault(kind, []).append(name)
    names: dict[str, list[str]] = {}
    for answer in reversed(by_plugin.values()):  # pluggy calls the last registered plugin first
        for kind, kind_names in answer.items():
            for name in kind_names:
                if name not in names.setdefault(kind, []):
                    names[kind].append(name)
    return names


def _check_name(kind: str, name: str, names: dict[str, list[str]]) -> None:
    available = names.get(kind, [])
    if name not in available:
        raise UnknownStrategyError(f"{kind}={name!r} is not provided by any plugin; available: {sorted(available)}")


def _required(obj, what: str, name: str, kind, doc: str, hint: str = ""):
    """`obj.name`, which must exist and be of `kind` (a type or a tuple of allowed values)."""
    if not hasattr(obj, name):
        raise ConfigError(
            f"{what} {type(obj).__name__} lacks the required capability {name!r} ({doc}); declare it as an "
            f"attribute (see specdec.strategies){hint}"
        )
    value = getattr(obj, name)
    ok = value in kind if isinstance(kind, tuple) else isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        allowed = list(kind) if isinstance(kind, tuple) else kind.__name__
        raise ConfigError(f"{what} {type(obj).__name__}.{name}={value!r} is not allowed; allowed: {allowed}")
    return value


def _optional_method(obj, name: str):
    method = getattr(obj, name, None)
    return method if callable(method) else None


def drafter_caps(drafter) -> DrafterCaps:
    """The typed capabilities of `drafter` (`specdec.strategies.Drafter`); ConfigError names a missing one."""
    legacy = " (needs_hidden_states / needs_last_hidden became reads)" if hasattr(drafter, "needs_hidden_states") else ""
    reads = _required(drafter, "drafter", "reads", READS, "what it reads of the target", legacy)
    on_host = _required(drafter, "drafter", "runs_on_host", bool, "drafts between steps on the host")
    samples = _required(drafter, "drafter", "samples_drafts", bool, "its trees carry draft_probs")
    slots = _required(drafter, "drafter", "num_tree_slots", int, "the tree capacity N it proposes")
    if slots < 1:
        raise ConfigError(f"drafter {type(drafter).__name__}.num_tree_slots={slots} is out of range; allowed: >= 1")
    if on_host and _optional_method(drafter, "propose_host") is None:
        raise ConfigError(f"drafter {type(drafter).__name__} runs on the host but has no propose_host(...)")
    lookahead = getattr(drafter, "kv_lookahead", 0)
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise ConfigError(f"drafter {type(drafter).__name__}.kv_lookahead={lookahead!r} must be an int >= 0")
    model = getattr(drafter, "model", None)
    import torch  # here, not at the top: listing names (the CLI's --help) must not import torch

    return DrafterCaps(
        reads=reads,
        runs_on_host=on_host,
        samples_drafts=samples,
        kv_lookahead=lookahead,
        modules=(model,) if isinstance(model, torch.nn.Module) else (),
        attach=_optional_method(drafter, "attach"),
        use_compiled=_optional_method(drafter, "use_compiled"),
    )


def verifier_caps(verifier) -> VerifierCaps:
    """The typed capabilities of `verifier` (`specdec.strategies.Verifier`)."""
    return VerifierCaps(
        lossless=_required(verifier, "verifier", "lossless", bool, "its output provably follows the target"),
        needs_draft_probs=_required(verifier, "verifier", "needs_draft_probs", bool, "it reads DraftTree.draft_probs"),
        greedy_only=_required(verifier, "verifier", "greedy_only", bool, "it decodes every row greedily"),
    )


def policy_caps(policy) -> PolicyCaps:
    """The typed capabilities and static shape of `policy` (`specdec.strategies.TreePolicy`)."""
    what = "tree policy"
    samples = _required(policy, what, "samples", bool, "its candidates are i.i.d. draws")
    depth = _required(policy, what, "depth", int, "calls to expand")
    widths = tuple(_required(policy, what, "widths", tuple, "frontier nodes per call"))
    children = tuple(_required(policy, what, "children", tuple, "candidates per frontier node per call"))
    num_nodes = _required(policy, what, "num_nodes", int, "draft slots of every tree")
    for name in ("grow", "use_compiled"):
        if _optional_method(policy, name) is None:
            raise ConfigError(f"{what} {type(policy).__name__} lacks the required method {name}(...)")
    if depth < 1 or len(widths) != depth or len(children) != depth or widths[0] != 1 or num_nodes < 1:
        raise ConfigError(
            f"{what} {type(policy).__name__} has an inconsistent shape: depth={depth}, widths={widths} "
            f"(one per call, the first 1), children={children}, num_nodes={num_nodes} (>= 1)"
        )
    return PolicyCaps(samples=samples, depth=depth, widths=widths, children=children, num_nodes=num_nodes)


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
    tree_policy: TreePolicy | None = None  # the policy the drafter grows its trees with
    policy_caps: PolicyCaps | None = None

    def __post_init__(self) -> None:
        if self.drafter_caps is None:
            object.__setattr__(self, "drafter_caps", drafter_caps(self.drafter))
        if self.verifier_caps is None:
            object.__setattr__(self, "verifier_caps", verifier_caps(self.verifier))
        if self.tree_policy is not None and self.policy_caps is None:
            object.__setattr__(self, "policy_caps", policy_caps(self.tree_policy))


def resolve_tree_policy(
    config: SpecConfig, verifier: VerifierCaps | None = None, pm: pluggy.PluginManager | None = None
) -> TreePolicy:
    """The tree policy `config.tree` names, for a verifier with capabilities `verifier`
    (default: one that needs no draft probabilities). Checks the name and the policy's shape."""
    pm = pm or get_plugin_manager()
    _check_name("tree", config.tree, strategy_names(pm))
    verifier = verifier or VerifierCaps(lossless=True, needs_draft_probs=False, greedy_only=False)
    policy = pm.hook.specdec_tree_policy(config=config, verifier=verifier)
    if policy is None:
        raise ConfigError(f"no plugin provides the tree policy for tree={config.tree!r}")
    caps = policy_caps(policy)
    if verifier.needs_draft_probs and not caps.samples:
        raise ConfigError(
            f"the verifier needs draft probabilities, but tree={config.tree!r} keeps candidates by their value "
            "(its policy has samples=False); use a policy that draws i.i.d. children ('sampled', 'static', "
            "'linear', 'dynamic') or verifier='target-only'"
        )
    if caps.num_nodes + 1 > config.shape.num_tree_slots:
        raise ConfigError(
            f"tree={config.tree!r} grows {caps.num_nodes} draft nodes, more than max_total_draft_tokens="
            f"{config.shape.max_total_draft_tokens}"
        )
    return policy


def resolve(config: SpecConfig, target: TargetInfo, pm: pluggy.PluginManager | None = None) -> Strategies:
    """Ask each hook once, in pipeline order, for the strategy that `config` names.

    Order: verifier (its capabilities decide whether drafts are sampled), tree policy,
    capture layers, drafter (given the policy and the verifier's capabilities), tree
    builder, KV relocator. Every capability is read and type-checked here, once.
    """
    pm = pm or get_plugin_manager()
    names = strategy_names(pm)
    _check_name("drafter", config.drafter, names)
    _check_name("verifier", config.verifier, names)
    _check_name("tree", config.tree, names)

    hook = pm.hook
    verifier = hook.specdec_verify(config=config)
    if verifier is None:
        raise ConfigError(f"no plugin provides the verifier for verifier={config.verifier!r}")
    vcaps = verifier_caps(verifier)
    policy = resolve_tree_policy(config, vcaps, pm)
    capture = hook.specdec_capture_layers(config=config, target=target)
    if capture is None:
        raise ConfigError(f"no plugin answered specdec_capture_layers for drafter={config.drafter!r}")
    capture = resolve_capture_layers(target.num_layers, tuple(capture)) if capture else ()
    found = dict(
        drafter=hook.specdec_draft(config=config, target=target, policy=policy, verifier=vcaps),
        build_tree=hook.specdec_build_tree(config=config),
        relocate_kv=hook.specdec_relocate_kv(config=config),
    )
    for what, strategy in found.items():
        if strategy is None:
            raise ConfigError(f"no plugin provides {what} for config {config.drafter=}, {config.tree=}, {config.verifier=}")
    strategies = Strategies(
        capture_layers=capture, verifier=verifier, verifier_caps=vcaps, tree_policy=policy, **found
    )
    if vcaps.needs_draft_probs and not strategies.drafter_caps.samples_drafts:
        raise ConfigError(
            f"verifier={config.verifier!r} needs draft probabilities, but drafter={config.drafter!r} "
            "does not sample its drafts; use verifier='target-only' or 'greedy'"
        )
    return strategies
