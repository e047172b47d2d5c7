"""The tensor records that strategies hand each other, with their contracts.

Glossary: B batch (request slots), N tree slots (root + draft nodes), D draft depth,
K top-K, V vocab, d hidden size. Node 0 is the root: the request's newest token, whose KV
is not cached yet. Nodes are in topological order (`parents[b, i] < i`, `parents[b, 0] = -1`);
nodes `i >= num_nodes[b]` are padding. All index tensors are int64 (torch indexes with it);
only the bit-packed mask is int32.

This module owns no logic beyond shape checks; the ops live in `specdec.ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftTree", "TreeMeta", "Acceptance", "SamplingTensors", "Frontier", "Candidates", "GrownTree"]


@dataclass
class DraftTree:
    """A drafter's proposal: a tree of N slots per request.

    tokens:      [B, N] int64, token of each node (node 0 = root token)
    parents:     [B, N] int64, parent index, -1 for the root and for padding
    num_nodes:   [B] int64, valid nodes per request (1..N; 1 = root only, nothing drafted)
    draft_probs: [B, N, V] float32 or None, the draft distribution at node i from which
                 i's children were *sampled* (only for `verifier="speculative"`); rows of
                 leaves and padding are unused.
    """

    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [B, N] int64
    num_nodes: torch.Tensor  # [B] int64
    draft_probs: torch.Tensor | None = None  # [B, N, V] float32

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_slots(self) -> int:
        return self.tokens.shape[1]


@dataclass
class TreeMeta:
    """What attention and verification need from a tree, derived from `parents`.

    packed_mask:    [B, N, ceil(N/32)] int32; bit j%32 of word j//32 in row i is 1 iff node j
                    is node i or an ancestor of i. Padding rows carry their self bit only.
    positions:      [B, N] int64, depth of node i (root 0; padding 0). Absolute position is
                    committed_len[b] + positions[b, i].
    next_token:     [B, N] int64, first child (lowest index) of node i, or -1.
    next_sibling:   [B, N] int64, next child of i's parent after i, or -1.
    retrieve_index: [B, N] int64, flat row b*N + i of node i in a [B*N, ...] batch, -1 for padding.
    """

    packed_mask: torch.Tensor  # [B, N, ceil(N/32)] int32
    positions: torch.Tensor  # [B, N] int64
    next_token: torch.Tensor  # [B, N] int64
    next_sibling: torch.Tensor  # [B, N] int64
    retrieve_index: torch.Tensor  # [B, N] int64

    @staticmethod
    def empty(batch_size: int, num_slots: int, device: torch.device | str = "cpu") -> "TreeMeta":
        """Preallocated buffers for `build_tree(..., out=meta)`; contents undefined until built."""
        words = (num_slots + 31) // 32
        kw = dict(device=device, dtype=torch.int64)
        return TreeMeta(
            packed_mask=torch.zeros(batch_size, num_slots, words, device=device, dtype=torch.int32),
            positions=torch.zeros(batch_size, num_slots, **kw),
            next_token=torch.full((batch_size, num_slots), -1, **kw),
            next_sibling=torch.full((batch_size, num_slots), -1, **kw),
            retrieve_index=torch.full((batch_size, num_slots), -1, **kw),
        )

    def rows(self, n: int) -> "TreeMeta":
        """Views of the first `n` rows (a batch bucket)."""
        return TreeMeta(self.packed_mask[:n], self.positions[:n], self.next_token[:n], self.next_sibling[:n],
                        self.retrieve_index[:n])


@dataclass
class Acceptance:
    """A verifier's verdict for one step.

    accept_length: [B] int64, accepted draft nodes a (0..depth); a + 1 tokens are emitted.
    accept_nodes:  [B, N] int64, path [0, c1, ..., ca] root first, then -1.
    accept_tokens: [B, N] int64, tokens of c1..ca then the bonus token sampled from the
                   target at ca, then -1.
    """

    accept_length: torch.Tensor  # [B] int64
    accept_nodes: torch.Tensor  # [B, N] int64
    accept_tokens: torch.Tensor  # [B, N] int64


@dataclass
class SamplingTensors:
    """Per-request sampling parameters as tensors, one row per request slot.

    temperature: [B] float32 (0 = greedy), top_k: [B] int64 (0 = off),
    top_p: [B] float32 (1 = off), min_p: [B] float32 (0 = off),
    seed: [B] int64 >= 0, the key of the request's counter-based draws
    (`specdec.ops.random`; None outside the engine).
    """

    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    seed: torch.Tensor | None = None  # [B] int64

    @staticmethod
    def from_params(params, device: torch.device | str = "cpu") -> "SamplingTensors":
        """Stack a sequence of `SamplingParams` (one per row); a None seed becomes 0."""
        return SamplingTensors(
            temperature=torch.tensor([float(p.temperature) for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([int(p.top_k) for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([float(p.top_p) for p in params], dtype=torch.float32, device=device),
            min_p=torch.tensor([float(p.min_p) for p in params], dtype=torch.float32, device=device),
            seed=torch.tensor([int(p.seed or 0) for p in params], dtype=torch.int64, device=device),
        )

    def rows(self, n: int) -> "SamplingTensors":
        """Views of the first `n` rows (a batch bucket)."""
        return SamplingTensors(
            self.temperature[:n], self.top_k[:n], self.top_p[:n], self.min_p[:n],
            None if self.seed is None else self.seed[:n],
        )


# ------------------------------------------------------------------ tree policies and drafters
@dataclass
class Frontier:
    """The nodes a tree policy asks its drafter to expand at one call (fixed shape per call).

    depth:       python int t, the call's index (0 = the root; nodes expanded at call t sit
                 at depth t, their children at depth t + 1).
    tokens:      [B, F_t] int64 tokens of the frontier nodes (in the drafter's own ids), or
                 None at call 0 (the frontier is the root, F_0 = 1).
    parent_slot: [B, F_t] int64, row of the previous call's frontier that each node's parent
                 is (all 0 at calls 0 and 1: the root).
    k:           python int K_t, candidates wanted per frontier node.
    """

    depth: int
    tokens: torch.Tensor | None  # [B, F] int64
    parent_slot: torch.Tensor  # [B, F] int64
    k: int


@dataclass
class Candidates:
    """A drafter's answer to `Frontier`: K candidate children of each of the F frontier nodes.

    tokens: [B, F, K] int64 child tokens, distinct per node (top-K) unless the policy samples
            (then K i.i.d. draws with replacement from the node's draft distribution).
    logq:   [B, F, K] float32 log-probabilities of the children under the draft, <= 0;
            -inf marks "no candidate" (a host drafter with fewer continuations).
    probs:  [B, F, Vd] float32 or None, each node's draft distribution the K were drawn from
            (sampled drafts for verifiers that need draft probabilities).
    """

    tokens: torch.Tensor  # [B, F, K] int64
    logq: torch.Tensor  # [B, F, K] float32
    probs: torch.Tensor | None = None  # [B, F, Vd] float32


@dataclass
class GrownTree:
    """What a tree policy returns: draft nodes 1..S of each request's tree (the root, node 0,
    is not included), S = the policy's static `num_nodes`.

    tokens:     [B, S] int64 draft tokens (the drafter's ids), topological order; 0 for padding
    parents:    [B, S] int64 tree index of each node's parent (0 = root, i + 1 = tokens[:, i]);
                -1 for padding
    num_nodes:  [B] int64 valid draft nodes n (nodes 1..n; the rest is padding)
    dist_index: [B, S] int64 row of `dists` the node's children were drawn from, -1 = none
                (sampled trees with probabilities only, else None)
    dists:      [B, E, Vd] float32 draft distributions of the expanded nodes (row 0 = the
                root's), or None
    """

    tokens: torch.Tensor  # [B, S] int64
    parents: torch.Tensor  # [B, S] int64
    num_nodes: torch.Tensor  # [B] int64
    dist_index: torch.Tensor | None = None  # [B, S] int64
    dists: torch.Tensor | None = None  # [B, E, Vd] float32
