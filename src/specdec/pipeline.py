"""`build(config, target) -> Pipeline`: the plugins resolved once and every size derived from
the config and the strategies fixed once, in one place.

A size used by several parts (the tree slots N, the KV positions a step writes ahead, the
capture buffer's rows, a request's full draft budget, the adaptive rule's depth) is computed
here, by `derive_sizes`, and read by the decoder, the target runner and the engine; none of
them derives it again. Why: N used to be read three ways (the policy's node count, the
drafter's `num_tree_slots`, the config's bound) and the capture buffer sized from the bound
while the runner verified the drafter's N.
"""

from __future__ import annotations

from dataclasses import dataclass

import pluggy

from .config import SpecConfig
from .errors import ConfigError
from .models.capture import capture_rows
from .registry import Strategies, resolve
from .strategies import TargetInfo

__all__ = ["Pipeline", "Sizes", "build", "derive_sizes"]


@dataclass(frozen=True)
class Sizes:
    """Every size derived from a config and its resolved strategies."""

    num_tree_slots: int  # N: tree node slots per request, root included (the drafter's; <= config.shape.num_tree_slots)
    lookahead: int  # KV positions past committed_len one step writes: the target's tree or the drafter's rows
    capture_rows: int  # rows of the target's capture buffer (`models.capture.capture_rows`)
    draft_budget: int  # a request's full per-step draft budget: N - 1 draft tokens
    adaptive_depth: int  # the adaptive rule's depth: min(max_draft_len, N - 1)
    batch_buckets: tuple[int, ...]  # batch sizes a step runs at (and graphs are captured for)


@dataclass(frozen=True)
class Pipeline:
    """A config, its strategies (`registry.resolve`) and their sizes."""

    config: SpecConfig
    strategies: Strategies
    sizes: Sizes


def derive_sizes(config: SpecConfig, strategies: Strategies) -> Sizes:
    """The sizes of `strategies` under `config`; a drafter whose N exceeds the config's tree
    slots is a `ConfigError`."""
    n = strategies.drafter.num_tree_slots
    if n > config.shape.num_tree_slots:
        raise ConfigError(f"drafter proposes {n} tree slots, more than config.shape.num_tree_slots={config.shape.num_tree_slots} "
                          "(max_total_draft_tokens + 1)")
    lookahead = max(n, strategies.drafter_caps.kv_lookahead)
    return Sizes(num_tree_slots=n, lookahead=lookahead, capture_rows=capture_rows(config, n), draft_budget=n - 1,
                 adaptive_depth=min(config.shape.max_draft_len, n - 1), batch_buckets=config.batch_buckets)


def build(config: SpecConfig, target: TargetInfo, pm: pluggy.PluginManager | None = None) -> Pipeline:
    """Resolve the strategies `config` names for `target` (each hook asked once) and fix their sizes."""
    strategies = resolve(config, target, pm)
    return Pipeline(config, strategies, derive_sizes(config, strategies))
