"""Every way a plugin can change specdec. Read this file first.

One speculative step runs five stages, each supplied by a hook:

    capture -> draft -> build tree -> verify -> relocate KV

Hooks are resolved *once*, by `specdec.registry.resolve(config, ...)`, before anything is
compiled: each returns the strategy for the config (a tensor function or a small object of
them), or None when the config is not its own; the first non-None answer wins
(`firstresult`). The engine then calls those strategies directly: no pluggy call happens
inside the step, so the step stays compile-ready.

`specdec_strategy_names` is how a plugin declares the names it answers to, so a config that
names an unknown strategy fails with the list of names that exist.

Write a plugin: a module or object with functions named like the hooks below, decorated
with `specdec.hookimpl`, registered with `pm.register(...)` or exposed through the
entry-point group `specdec` (see `examples/third_party_plugin/`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .config import SpecConfig
    from .strategies import Drafter, KVRelocator, TargetInfo, TreeBuilder, Verifier

PROJECT = "specdec"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def specdec_strategy_names() -> dict[str, list[str]]:
    """Names this plugin answers to, by kind: ``{"drafter": [...], "verifier": [...]}``.

    Called at resolve time; the union over plugins is what a config may name. Kinds are
    "drafter" and "verifier" (tree shapes are the fixed set of `SpecConfig.tree`).
    """


@hookspec(firstresult=True)
def specdec_capture_layers(config: SpecConfig, target: TargetInfo) -> tuple[int, ...] | None:
    """Target layers whose outputs the drafter of ``config.drafter`` reads.

    Returns layer *output* indices in ``[0, target.num_layers)`` (the seed's convention:
    index l is what decoder layer l returns, residual included), ``()`` for a drafter that
    reads no captured state (no capture buffer is then allocated), or None if
    ``config.drafter`` is not this plugin's. Called once, before the capture buffer
    ``[max_tokens, d * n_capture]`` is allocated. ``config.layers_to_capture`` overrides
    the answer only when the drafter accepts explicit layers.
    """


@hookspec(firstresult=True)
def specdec_draft(config: SpecConfig, target: TargetInfo) -> Drafter | None:
    """The drafter named by ``config.drafter``, shaped by ``config.tree``, or None.

    The returned object proposes, each step, a `DraftTree` with
    ``tokens [B, N] int64``, ``parents [B, N] int64`` (topological, root -1) and
    ``num_nodes [B] int64`` from the captured hidden states and the accepted tokens, where
    N = ``config.num_tree_slots``. Its capability flags (`needs_hidden_states`, ...) tell
    the engine what to prepare; the engine never asks for its name.
    """


@hookspec(firstresult=True)
def specdec_build_tree(config: SpecConfig) -> TreeBuilder | None:
    """A function ``(parents [B, N] int64, num_nodes [B] int64, out=TreeMeta|None) -> TreeMeta``.

    It derives ``packed_mask [B, N, ceil(N/32)] int32`` (ancestor-or-self bits),
    ``positions [B, N]`` (depth), ``next_token`` / ``next_sibling`` ``[B, N]`` (first child,
    next sibling, -1 for none) and ``retrieve_index``. Writing into ``out`` must leave no
    stale state from an earlier tree; padding rows hold their self bit only and -1 links.
    """


@hookspec(firstresult=True)
def specdec_verify(config: SpecConfig) -> Verifier | None:
    """The verifier named by ``config.verifier``, or None.

    Called as ``verifier(tokens [B, N], tree: TreeMeta, target_logits [B, N, V],
    sampling: SamplingTensors, draft_probs=[B, N, V] | None, generator=None, uniforms=None)
    -> Acceptance`` with ``accept_length [B]``, ``accept_nodes [B, N]`` (root first) and
    ``accept_tokens [B, N]`` (accepted drafts then the bonus token). ``verifier.lossless``
    says whether its output provably follows the target; the engine reports it.
    """


@hookspec(firstresult=True)
def specdec_relocate_kv(config: SpecConfig) -> KVRelocator | None:
    """A function ``(cache, committed_len [B], accept_nodes [B, N], accept_length [B]) -> None``.

    Node i of the verified tree was written at logical position ``committed_len[b] + i``;
    afterwards node ``accept_nodes[b, j]`` sits at ``committed_len[b] + j`` in every layer of
    the paged ``cache`` (mutated in place, gather before scatter). The caller then advances
    ``committed_len += accept_length + 1``.
    """
