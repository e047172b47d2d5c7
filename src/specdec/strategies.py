"""The strategy objects that hooks return, as typing Protocols, plus `TargetInfo`.

The engine talks to strategies only through these attributes and call signatures, and
asks them for capabilities (`needs_hidden_states`, `lossless`, ...), never for names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from .types import Acceptance, DraftTree, SamplingTensors, TreeMeta

__all__ = ["TargetInfo", "Drafter", "TreeBuilder", "Verifier", "KVRelocator", "DraftInput"]


@dataclass(frozen=True)
class TargetInfo:
    """What a strategy may know about the target at resolve time (no weights)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    model_type: str = "unknown"
    eos_token_ids: tuple[int, ...] = ()
    # The loaded target module (`specdec.models.DecoderLM`) for drafters that share its
    # embeddings or LM head; None when resolving without weights.
    model: object | None = field(default=None, compare=False, repr=False)


@dataclass
class DraftInput:
    """What the engine hands a drafter each step (after the previous step's verification).

    root_tokens:   [B] int64, each slot's newest token (tree node 0; its KV is not cached)
    committed_len: [B] int64, tokens with target KV after the last step; the root sits at
                   this position. The last step's accepted path started at
                   committed_len - accept_length - 1.
    accept_length: [B] int64, draft nodes a accepted in the last verification
    accept_tokens: [B, N] int64, tokens emitted last step: a accepted drafts, then the bonus
                   token (= the new root), then -1
    hidden:        [B, N, d * n_capture] or None, captured target states along the last
                   step's accepted path (row j = state at node accept_nodes[b, j], i.e. at
                   position committed_len - a - 1 + j); rows past a are undefined.
    Right after `prefill`, a slot has accept_length = -1 (nothing new to ingest).
    active:        [B] bool, slots holding a live request
    sampling:      per-slot sampling parameters (drafters that sample may temper with them;
                   `sampling.seed` keys their counter-based draws)
    max_kv_len:    python int, a static bound on the logical positions any slot's attention
                   reads this step (committed_len + the drafter's `kv_lookahead`); None = max_seq_len

    B is the step's batch bucket: the first B request slots (B <= max_batch_size). A drafter
    slices its own per-slot state to the first B rows.
    """

    root_tokens: torch.Tensor  # [B] int64
    committed_len: torch.Tensor  # [B] int64
    accept_length: torch.Tensor  # [B] int64
    accept_tokens: torch.Tensor  # [B, N] int64
    hidden: torch.Tensor | None  # [B, N, d * n_capture]
    active: torch.Tensor  # [B] bool
    sampling: SamplingTensors | None = None
    max_kv_len: int | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes a draft tree each step.

    needs_hidden_states: the engine must allocate a capture buffer and pass `hidden`.
    samples_drafts:      the drafts were sampled (so `DraftTree.draft_probs` is set), as
                         `verifier="speculative"` requires.
    num_tree_slots:      N, the tree capacity this drafter proposes (1 = root only).
    needs_last_hidden:   (optional, default False) the drafter reads the target's last hidden
                         state (after the final norm) instead of captured layers, as MTP heads
                         do; `DraftInput.hidden` / `prefill(hidden=)` then carry it, [.., d].
    runs_on_host:        (optional, default False) the drafter cannot live inside the captured
                         step (n-gram: a host suffix index): it drafts between steps from the
                         token hand-off with `propose_host(accepted)` and the step starts at
                         tree building.
    kv_lookahead:        (optional, default 0) logical positions past `committed_len` that the
                         drafter writes in its own KV during `propose` (a head's draft rows);
                         the engine reserves max(N, kv_lookahead) positions ahead.
    attach(cache):       (optional) called once with the target's `PagedKVCache` before any
                         request: a drafter with its own KV puts it on that cache's allocator
                         (`cache.layer_group(...)`), so one reservation backs both.
    """

    needs_hidden_states: bool
    samples_drafts: bool
    num_tree_slots: int

    def prefill(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None, start: int = 0) -> None:
        """After the target's prefill of a prompt chunk of `slot`: ingest it.

        next_tokens: [L] int64, the chunk's tokens shifted by one (the last chunk ends with the
                     first generated token), so row p pairs the target state at position
                     start + p with the token at position start + p + 1.
        hidden:      [L, d * n_capture] captured target states at positions start..start+L-1,
                     or None when the drafter reads no target state.
        start:       position of the chunk's first row (0 for the first chunk); chunks of one
                     prompt arrive in order, the last one after the first token is sampled.
        """

    def propose(self, inputs: DraftInput) -> DraftTree:
        """Draft the next tree for every active slot (fixed shape [B, N])."""

    def reset_slot(self, slot: int) -> None:
        """Forget a finished request's state; the slot must then draft a valid empty tree."""


class TreeBuilder(Protocol):
    def __call__(self, parents: torch.Tensor, num_nodes: torch.Tensor, out: TreeMeta | None = None) -> TreeMeta: ...


@runtime_checkable
class Verifier(Protocol):
    """Turns target logits on a tree into an `Acceptance`.

    lossless:          output provably equals target-only decoding (greedy) or follows the
                       target distribution (sampling). Lossy verifiers are reported as such.
    needs_draft_probs: requires `DraftTree.draft_probs` (standard speculative sampling).
    greedy_only:       (optional, default False) decodes every row greedily, so requests
                       with temperature > 0 are refused instead of silently made greedy.
    """

    lossless: bool
    needs_draft_probs: bool

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling: SamplingTensors,
        *,
        draft_probs: torch.Tensor | None = None,  # [B, N, V]
        generator: torch.Generator | None = None,
        uniforms: torch.Tensor | None = None,  # [B, N, 2] explicit draws in [0, 1)
    ) -> Acceptance: ...


class KVRelocator(Protocol):
    def __call__(
        self,
        cache,
        committed_len: torch.Tensor,  # [B] int64
        accept_nodes: torch.Tensor,  # [B, N] int64
        accept_length: torch.Tensor,  # [B] int64
    ) -> None: ...
