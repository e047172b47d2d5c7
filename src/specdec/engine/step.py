"""One speculative step as a device function over explicit, fixed-capacity state.

Owns `DeviceStep`, the step itself, over a `StepState` (`specdec.step_state`: every per-slot
tensor a step reads or writes, the drafter's included; allocated once, updated in place):

    draft (device drafters) -> build tree -> target tree-verify forward with capture ->
    verification -> KV relocation -> state advance -> pack the hand-off

A step runs on a batch bucket b (the first b slots; `StepState.rows(b)` gives views), so a
CUDA graph captured per bucket has static inputs and outputs: the state's storage. Nothing in
`DeviceStep.__call__` syncs with the host: no `.item()`, no `.tolist()`, no host-to-device
copy, no branching on tensor values, no `torch.Generator` (draws are counter-based,
`specdec.ops.random`). Host drafters (n-gram) write their tree into `draft_*` before the step.
"""

from __future__ import annotations

import inspect

import torch

from ..compile_scope import compile_private
from ..ops.random import STREAM_VERIFY, counter_uniforms
from ..registry import Strategies
from ..step_state import StepState

__all__ = ["StepState", "DeviceStep"]  # StepState lives in step_state; re-exported


def advance_state(active, accept_length, accept_tokens, root_tokens, committed_len, hidden_path, handoff,
                  new_accept_nodes, new_accept_tokens, new_accept_length, captured) -> None:
    """Advance every active slot's state past its verified path, in place (one compiled piece
    when the step is compiled: ~20 launches otherwise). Inactive slots keep theirs.

    Args (state, [B] / [B, N] views, updated in place): active, accept_length, accept_tokens,
        root_tokens, committed_len, hidden_path ([B, N, w] or None), handoff [B, N + 1];
        the verification's new_accept_nodes / new_accept_tokens [B, N], new_accept_length [B];
        captured: [B, N, w] the target's states at the tree's nodes, or None.
    """
    bonus = new_accept_tokens.gather(1, new_accept_length[:, None])[:, 0]  # [B]
    accept_length.copy_(torch.where(active, new_accept_length, accept_length))
    accept_tokens.copy_(torch.where(active[:, None], new_accept_tokens, accept_tokens))
    root_tokens.copy_(torch.where(active, bonus, root_tokens))
    committed_len.add_(torch.where(active, new_accept_length + 1, 0))
    if hidden_path is not None and captured is not None:
        idx = new_accept_nodes.clamp(min=0)  # [B, N]; rows past accept_length are undefined
        path = captured.gather(1, idx[:, :, None].expand(-1, -1, captured.shape[-1]))
        hidden_path.copy_(path.to(hidden_path.dtype))
    handoff[:, 0].copy_(new_accept_length)
    handoff[:, 1:].copy_(new_accept_tokens)


def tree_sizes(num_nodes, draft_budget, active):
    """The verified tree's size per request, cut to its draft budget (a prefix of a
    topological order is a tree), and the rows the target runs (0 for idle slots); one
    compiled piece when the step is compiled. [B] int64 x2, [B] bool -> ([B], [B]) int64."""
    num_nodes = torch.minimum(num_nodes, draft_budget + 1)
    return num_nodes, torch.where(active, num_nodes, 0)


def append_to_path(active, accept_length, accept_tokens, root_tokens, committed_len, hidden_path, handoff,
                   token, captured) -> None:
    """A deferred plain step's advance, in place (one compiled piece when the step is compiled).
    The drafter has not ingested the path, so the new token (and the target's state at the root)
    become its next row, as if the last step had accepted one more draft. The path then covers
    every position since the drafter last ran, and the next step that runs the drafter ingests
    them in one forward. The engine runs this only while every active path stays within the
    drafter's depth (rows <= D + 1). The hand-off reports one token (accept length 0), like any
    plain step.

    Args (state views, updated in place): active, accept_length, accept_tokens [B, N],
        root_tokens, committed_len, hidden_path ([B, N, w] or None), handoff [B, N + 1];
        token: [B] the step's token; captured: [B, 1, w] the target's state at the root, or None.
    """
    row = (accept_length + 1).clamp(0, accept_tokens.shape[1] - 1)  # [B] the new row of each path
    rows = row[:, None]  # [B, 1]
    # the writes as selects over the rows (one kernel each; a compiled scatter into a state tensor was a
    # gather, a scatter and a copy back)
    col = torch.arange(accept_tokens.shape[1], device=token.device)[None, :]  # [1, N]
    new_row = active[:, None] & (col == rows)  # [B, N] the row each active path gains
    accept_tokens.copy_(torch.where(new_row, token[:, None], accept_tokens))
    if hidden_path is not None and captured is not None:  # the state at the root becomes the new row
        hidden_path.copy_(torch.where(new_row[..., None], captured[:, :1].to(hidden_path.dtype), hidden_path))
    accept_length.copy_(torch.where(active, row, accept_length))
    root_tokens.copy_(torch.where(active, token, root_tokens))
    committed_len.add_(active.long())
    out_col = torch.arange(handoff.shape[1], device=token.device)[None, :]  # [1, N + 1]
    handoff.copy_(torch.where(out_col == 1, token[:, None], torch.where(out_col == 0, 0, -1)))  # length 0, the token


class DeviceStep:
    """The device part of one speculative step over a `StepState` (see the module docstring).

    Args:
        strategies: the resolved strategies (`registry.resolve`).
        runner: the `TargetRunner` (its `verify` forward and its `cache`, which relocation mutates).
        state: the full-capacity `StepState` the step will run on (bucket views of it): its sizes
            and device shape the step's constants (the plain step's root-only tree and path).
        compiled: draw the verifier's uniforms through `torch.compile` (one fused kernel
            instead of ~60 integer ops).
    """

    def __init__(self, strategies: Strategies, runner, state: StepState, *, compiled: bool = False,
                 plain: bool = False, defer: bool = False, bare: bool = False) -> None:
        self.strategies = strategies
        self.runner = runner
        self.plain = plain  # the adaptive engine's plain step: ingest only, the target verifies the root
        self.defer = defer  # plain, and the drafter does not run: the token joins the path it ingests later
        # plain with nothing for a drafter: no drafter, no captured states, no path (a batch whose
        # every request drafts nothing: a target-only step's work)
        self.bare = bare
        if (defer or bare) and not plain:
            raise ValueError("defer=True and bare=True are kinds of plain step; pass plain=True too")
        if defer and bare:
            raise ValueError("a plain step is deferred (its token joins the drafter's path) or bare (no path), not both")
        # a runner without verify(capture=...) (the `TargetRunner` protocol does not ask for it) still computes
        # the drafter states a bare step drops
        self._verify_kw = dict(capture=False) if bare and _takes_capture(runner) else {}
        self.host_drafter = strategies.drafter_caps.runs_on_host
        self.needs_draws = not strategies.verifier_caps.greedy_only  # a greedy walk draws nothing
        self.uniforms = compile_private(counter_uniforms, dynamic=True, fullgraph=True) if compiled else counter_uniforms
        self.advance = compile_private(advance_state, dynamic=True, fullgraph=True) if compiled else advance_state
        self.append = compile_private(append_to_path, dynamic=True, fullgraph=True) if compiled else append_to_path
        self.sizes = compile_private(tree_sizes, dynamic=True, fullgraph=True) if compiled else tree_sizes
        # the plain step's root-only tree (parents -1, one node), made once and sliced per bucket
        B, N = state.batch_size, state.num_nodes
        i64 = dict(dtype=torch.int64, device=state.root_tokens.device)
        self._root_parents = torch.full((B, 1), -1, **i64)  # [max_B, 1]
        self._one_node = torch.ones(B, **i64)  # [max_B]
        # an ingesting plain step's verified path: node 0 alone (then -1), accept length 0
        self._root_path = torch.full((B, N), -1, **i64)  # [max_B, N]
        self._root_path[:, 0] = 0
        self._zero = torch.zeros(B, **i64)  # [max_B]
        # A root-only tree's metadata is the same every step (and in every bucket: a bucket's
        # rows are a prefix, and node b's flat row is b): built once here, not by a launch per
        # step. It serves the plain step, and every step when the drafter proposes nothing (N = 1:
        # target-only).
        strategies.build_tree(self._root_parents, self._one_node, out=state.tree1)

    @staticmethod
    def _mark(timer, phase: str) -> None:
        if timer is not None:
            timer.mark(phase)

    def __call__(self, state: StepState, kv_len: int, timer=None) -> None:
        """Run one step on `state` (a bucket's views), writing every result into it in place.

        kv_len: static bound on the logical positions attention reads (python int).
        timer: a `step_timing.PhaseTimer` to mark the phase boundaries on (eager steps only).
        """
        if timer is not None:
            timer.start()
        if self.plain:
            return self._plain(state, kv_len, timer)
        s = self.strategies
        active = state.active
        if self.host_drafter:
            tokens, parents, num_nodes, draft_probs = (
                state.draft_tokens, state.draft_parents, state.draft_num_nodes, None
            )
        else:
            draft = s.drafter.propose(state, max_kv_len=kv_len)  # the bucket's state, the drafter's slots included
            tokens, parents, num_nodes, draft_probs = draft.tokens, draft.parents, draft.num_nodes, draft.draft_probs
        num_nodes, live_nodes = self.sizes(num_nodes, state.draft_budget, active)  # [B] budgets applied; idle: 0 rows
        # N = 1 (static): the root alone, whose tree was built once (`__init__`)
        tree = state.tree1 if state.num_nodes == 1 else s.build_tree(parents, num_nodes, out=state.tree)
        self._mark(timer, "draft")
        logits, captured = self.runner.verify(tokens, tree, state.committed_len, live_nodes, kv_len)  # [B, N, V]
        self._mark(timer, "verify")
        B, N = tokens.shape
        uniforms = None
        if self.needs_draws:
            uniforms = self.uniforms(state.sampling.seed, state.committed_len, 2 * N, STREAM_VERIFY).view(B, N, 2)
        acc = s.verifier(tokens, tree, logits, state.sampling, draft_probs=draft_probs, uniforms=uniforms)
        accept_length = torch.where(active, acc.accept_length, 0)  # [B]
        s.relocate_kv(self.runner.cache, state.committed_len, acc.accept_nodes, accept_length)
        self._advance(state, acc.accept_nodes, acc.accept_tokens, accept_length, captured)

    def _plain(self, state: StepState, kv_len: int, timer=None) -> None:
        """One token per request: the drafter ingests the path it has not seen (its KV stays
        current) but drafts nothing, or, deferred (`defer`), does not run at all; the target
        runs the root alone ([B, 1]), and the engine's verifier picks the token on that root-only
        tree (every lossless verifier then draws from the request's sampling distribution; a
        greedy one takes the argmax, so a plain step costs what a target-only step costs: the
        sort over the vocabulary that sampling needs made a batch-64 plain step of the 8B shape
        15% slower than target-only's). A verifier that needs draft_probs gets none here, so its
        draw rule runs directly."""
        from ..ops.sampling import probs_for, sample_from_probs

        s, active = self.strategies, state.active
        B = state.root_tokens.shape[0]
        if not self.host_drafter and not self.defer and not self.bare:  # host drafters ingest on the host
            s.drafter.propose(state, max_kv_len=kv_len, draft=False)
        tokens = state.root_tokens[:, None]  # [B, 1]
        tree = state.tree1  # the root-only tree, built once (`__init__`)
        self._mark(timer, "draft")
        logits, captured = self.runner.verify(tokens, tree, state.committed_len, torch.where(active, 1, 0), kv_len,
                                              **self._verify_kw)
        if self.bare:
            captured = None  # nothing reads the path's states
        self._mark(timer, "verify")
        u = None  # [B, 1, 2] node 0's lanes of the step's draws
        if self.needs_draws:
            u = self.uniforms(state.sampling.seed, state.committed_len, 2, STREAM_VERIFY).view(B, 1, 2)
        if s.verifier_caps.needs_draft_probs:  # no drafts, so no draft_probs: the draw rule itself
            token = sample_from_probs(probs_for(logits, state.sampling)[:, 0], u[:, 0, 1])  # [B]
        else:  # the verifier's own kernel on the root-only tree (greedy: an argmax, no sort over V)
            token = s.verifier(tokens, tree, logits, state.sampling, uniforms=u).accept_tokens[:, 0]  # [B]
        if self.defer:
            return self.append(state.active, state.accept_length, state.accept_tokens, state.root_tokens,
                               state.committed_len, state.hidden_path, state.handoff, token, captured)
        accept_nodes = self._root_path[:B]  # [B, N]: 0, then -1
        accept_tokens = torch.cat([token[:, None], accept_nodes[:, 1:]], 1)  # [B, N]: the token, then -1
        if captured is not None:  # widen [B, 1, w] to the [B, N, w] the advance gathers from
            captured = captured.expand(-1, state.num_nodes, -1)
        self._advance(state, accept_nodes, accept_tokens, self._zero[:B], captured)

    def _advance(self, state: StepState, accept_nodes, accept_tokens, accept_length, captured) -> None:
        """The state after a verification (in place), and the hand-off row the host reads."""
        self.advance(state.active, state.accept_length, state.accept_tokens, state.root_tokens, state.committed_len,
                     state.hidden_path, state.handoff, accept_nodes, accept_tokens, accept_length, captured)


def _takes_capture(runner) -> bool:
    """Whether `runner.verify` takes `capture=` (the built-in `TargetRunner` does)."""
    try:
        return "capture" in inspect.signature(runner.verify).parameters
    except (TypeError, ValueError):
        return False

