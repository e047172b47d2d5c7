"""Every way a plugin can change specdec. Read this file first.

One speculative step runs these stages, each supplied by a hook:

    capture -> draft (a drafter expands frontiers, a tree policy keeps nodes)
            -> build tree -> verify -> relocate KV

Hooks are resolved *once*, by `specdec.registry.resolve(config, ...)`, before anything is
compiled: each returns the strategy for the config (a tensor function or a small object of
them), or None when the config is not its own; the first non-None answer wins
(`firstresult`). The engine then calls those strategies directly: no pluggy call happens
inside the step, so the step stays compile-ready.

`specdec_strategy_names` is how a plugin declares the names it answers to, so a config that
names an unknown strategy fails with the list of names that exist.

Write a plugin: a module or object with functions named like the hooks below, decorated
with `specdec.hookimpl`, registered with `pm.register(...)` or exposed through the
entry-point group `specdec` (see `examples/third_party_plugin/`). `specdec.strategy_hook(NAME)`
decorates a named strategy's hook (draft, capture layers, tree policy, verify) so it answers
for its own name only, and `specdec.declared_names(...)` builds `specdec_strategy_names` from
such hooks (`specdec.plugin_helpers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

from .strategies import Drafter, KVRelocator, TargetInfo, TreeBuilder, TreePolicy, Verifier, VerifierCaps

if TYPE_CHECKING:
    from .config import SpecConfig

PROJECT = "specdec"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def specdec_strategy_names() -> dict[str, list[str]]:
    """Names this plugin answers to, by kind: ``{"drafter": [...], "verifier": [...], "tree": [...]}``.

    Called at resolve time; the union over plugins is what a config may name
    (`config.drafter`, `config.verifier`, `config.tree`).
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
def specdec_tree_policy(config: SpecConfig, verifier: VerifierCaps) -> TreePolicy | None:
    """The tree policy named by ``config.tree``, or None: which nodes a draft tree keeps.

    Called once, after the verifier is resolved: ``verifier`` holds its capabilities, and
    when ``verifier.needs_draft_probs`` the policy must have ``samples = True`` (its
    candidates are i.i.d. draws, kept whole) or the resolver refuses the pair. The policy
    (`specdec.strategies.TreePolicy`) declares a static shape (depth D, frontier widths
    F_t, candidates per node K_t, tree slots S) and ``grow(expand, batch, device) ->
    GrownTree`` calls the drafter's ``expand(Frontier) -> Candidates`` (tokens and
    log-probabilities [B, F_t, K_t]) D times with fixed shapes, so it is captured with the
    step. Options travel in ``config.plugin_options[<the policy's name>]``. Built-ins:
    `specdec.plugins.tree_policies`; subclass `specdec.policies.FrontierPolicy` to write one.
    """


@hookspec(firstresult=True)
def specdec_draft(config: SpecConfig, target: TargetInfo, policy: TreePolicy, verifier: VerifierCaps) -> Drafter | None:
    """The drafter named by ``config.drafter``, growing its trees with ``policy``, or None.

    The returned object proposes, each step, a `DraftTree` with
    ``tokens [B, N] int64``, ``parents [B, N] int64`` (topological, root -1) and
    ``num_nodes [B] int64`` from the captured hidden states and the accepted tokens, where
    N = ``policy.num_nodes + 1`` <= ``config.shape.num_tree_slots``. A drafter that expands
    frontiers samples its candidates exactly when ``policy.samples`` and returns
    ``draft_probs`` exactly when ``verifier.needs_draft_probs``. Its required capabilities
    (`reads`, `runs_on_host`, `samples_drafts`, `num_tree_slots`; `specdec.strategies.Drafter`)
    tell the engine what to prepare; the engine never asks for its name. An implementation
    may take only the arguments it uses (``config, target``).
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
    sampling: SamplingTensors, *, uniforms=[B, N, 2] | None, draft_probs=[B, N, V] | None)
    -> Acceptance`` with ``accept_length [B]``, ``accept_nodes [B, N]`` (root first) and
    ``accept_tokens [B, N]`` (accepted drafts then the bonus token). Required capabilities:
    ``lossless`` (its output provably follows the target; the engine reports it),
    ``needs_draft_probs`` (only then ``draft_probs`` is passed, and the tree policy and the
    drafter sample) and ``greedy_only`` (then ``uniforms`` is None).
    """


@hookspec(firstresult=True)
def specdec_relocate_kv(config: SpecConfig) -> KVRelocator | None:
    """A function ``(cache, committed_len [B], accept_nodes [B, N], accept_length [B]) -> None``.

    Node i of the verified tree was written at logical position ``committed_len[b] + i``;
    afterwards node ``accept_nodes[b, j]`` sits at ``committed_len[b] + j`` in every layer of
    the paged ``cache`` (mutated in place, gather before scatter). The caller then advances
    ``committed_len += accept_length + 1``.
    """
