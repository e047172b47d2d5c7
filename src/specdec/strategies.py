"""The strategy objects that hooks return, as typing Protocols, plus `TargetInfo`.

The engine talks to strategies only through these attributes and call signatures. Their
capabilities (`Drafter.reads`, `Verifier.needs_draft_probs`, `TreePolicy.samples`, ...) are
*required* attributes: `specdec.registry.resolve` reads and type-checks them once, into
`DrafterCaps` / `VerifierCaps` / `PolicyCaps` (defined here, beside the protocols, so the
hook specs can name them without importing the registry), and nothing else ever probes a
strategy.

torch appears in annotations only (postponed), so importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .step_state import StepState
    from .types import Acceptance, Candidates, DraftTree, Frontier, GrownTree, SamplingTensors, TreeMeta

__all__ = ["TargetInfo", "Drafter", "TreeBuilder", "Verifier", "KVRelocator", "TreePolicy", "Expand", "READS",
           "DrafterCaps", "VerifierCaps", "PolicyCaps"]

READS = ("captured", "last_hidden", "nothing")  # what a drafter may read of the target

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


@runtime_checkable
class Drafter(Protocol):
    """Proposes a draft tree each step.

    Required capabilities (class or instance attributes, checked by the resolver):

    reads:          "captured" (target layer outputs: the engine allocates a capture buffer
                    and passes `hidden`), "last_hidden" (the target's state after the final
                    norm, [.., d], as MTP heads read) or "nothing".
    runs_on_host:   False: `propose(state)` runs inside the captured step (fixed shapes, no
                    host sync). True: it cannot (n-gram: a host suffix index); it drafts
                    between steps with `propose_host(accept_length, accept_tokens,
                    root_tokens, active) -> (tokens [B, N], parents [B, N], num_nodes [B])`
                    (lists from the token hand-off in, CPU int64 tensors out) and the
                    captured step starts at tree building.
    samples_drafts: its trees carry `DraftTree.draft_probs` (children drawn i.i.d. from
                    those rows), as verifiers with `needs_draft_probs` require.
    num_tree_slots: N, the tree capacity it proposes (1 = root only), <= config.shape.num_tree_slots.

    Optional: `kv_lookahead` (int, default 0: logical positions past `committed_len` the
    drafter writes in its own KV during `propose`; the engine reserves max(N, kv_lookahead)
    ahead), `attach(cache)` (called once with the target's `PagedKVCache`: a drafter with its
    own KV puts it on that cache's allocator), `use_compiled(on)` (switch its tensor glue to
    compiled pieces), `model` (its torch module, compiled with the target's), `slot_state()`
    (its per-slot tensors by name, each [max_batch_size, ...]: the engine keeps them in
    `StepState.drafter`, so the step's one state record holds them, and `propose` reads them
    from the state it is given).
    """

    reads: Literal["captured", "last_hidden", "nothing"]
    runs_on_host: bool
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

        The engine does not call it for a request that drafts nothing (`num_draft_tokens=0`):
        that request's slot stays as `reset_slot` left it, and drafts a valid empty tree.
        """

    def propose(self, state: StepState, max_kv_len: int | None = None, draft: bool = True) -> DraftTree:
        """Draft the next tree for every active slot (fixed shape [B, N]).

        state:      the step's `StepState`, a bucket's views (B = the bucket, the first B
                    slots; B <= max_batch_size). A drafter reads root_tokens, committed_len,
                    accept_length / accept_tokens (the last step's verified path, whose KV
                    it ingests; -1 right after prefill: nothing new), hidden_path (the target
                    states along that path, or None), active, sampling (seeds key its draws)
                    and its own per-slot tensors in `state.drafter`; it writes only those.
        max_kv_len: a static bound on the logical positions any slot's attention reads
                    this step (committed_len + the drafter's `kv_lookahead`); None =
                    max_seq_len.
        draft:      False: ingest the accepted paths only and return root-only trees without
                    draft_probs, running no draft forward (the adaptive engine's plain step,
                    priced as target-only + ingest).
        """

    def reset_slot(self, slot: int) -> None:
        """Forget a finished request's state; the slot must then draft a valid empty tree."""


class TreeBuilder(Protocol):
    def __call__(self, parents: torch.Tensor, num_nodes: torch.Tensor, out: TreeMeta | None = None) -> TreeMeta: ...


@runtime_checkable
class Verifier(Protocol):
    """Turns target logits on a tree into an `Acceptance`.

    Required capabilities:

    lossless:          output provably equals target-only decoding (greedy) or follows the
                       target distribution (sampling). Lossy verifiers are reported as such.
    needs_draft_probs: requires `DraftTree.draft_probs` (standard speculative sampling); the
                       resolver then makes the tree policy and the drafter sample.
    greedy_only:       decodes every row greedily, so requests with temperature > 0 are
                       refused instead of silently made greedy; the step draws no uniforms.

    Called with what every verifier uses: the tree's tokens and metadata, the target's
    logits on it, the rows' sampling parameters and the step's draws ``uniforms [B, N, 2]``
    in [0, 1) (column 0: the coin of node i tested as a child; column 1: the bonus draw when
    the walk ends at i; None for greedy-only verifiers). Only verifiers with
    `needs_draft_probs` get ``draft_probs [B, N, V]``.
    """

    lossless: bool
    needs_draft_probs: bool
    greedy_only: bool

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, N] int64
        tree: TreeMeta,
        target_logits: torch.Tensor,  # [B, N, V]
        sampling: SamplingTensors | None,
        *,
        uniforms: torch.Tensor | None = None,  # [B, N, 2] float64 in [0, 1)
        draft_probs: torch.Tensor | None = None,  # [B, N, V], needs_draft_probs only
    ) -> Acceptance: ...


Expand = Callable[["Frontier"], "Candidates"]


@runtime_checkable
class TreePolicy(Protocol):
    """Which nodes a draft tree keeps, as fixed-shape tensor functions (captured with the step).

    A drafter only expands frontiers: ``expand(Frontier) -> Candidates`` (K candidate
    children of each frontier node, with their draft log-probabilities). The policy calls it
    `depth` times, call t with `widths[t]` frontier nodes and `children[t]` candidates each,
    picks the next frontier among the candidates, records parents, and returns a
    `GrownTree` of `num_nodes` slots. The shape (depth, widths, children, num_nodes) is
    static: drafters size their own buffers (draft KV rows) from it at construction.

    samples:   candidates must be i.i.d. draws with replacement from the draft distribution
               (the policy keeps whole draws, never one by its own value: what speculative
               sampling needs to stay exact); False: candidates are the top-K, distinct.
    depth:     D, calls to `expand`; nodes reach depth <= D.
    widths:    (F_0, ..., F_{D-1}) frontier nodes per call, F_0 = 1 (the root).
    children:  (K_0, ..., K_{D-1}) candidates asked of each frontier node per call.
    num_nodes: S, draft slots of every grown tree (N = S + 1 with the root).
    """

    samples: bool
    depth: int
    widths: tuple[int, ...]
    children: tuple[int, ...]
    num_nodes: int

    def grow(self, expand: Expand, batch: int, device: torch.device) -> GrownTree:
        """Grow `batch` trees by calling `expand` (see the class docstring); no host sync."""

    def use_compiled(self, on: bool = True) -> None:
        """Run the policy's own tensor glue (frontier selection) through torch.compile or not."""


class KVRelocator(Protocol):
    def __call__(
        self,
        cache,
        committed_len: torch.Tensor,  # [B] int64
        accept_nodes: torch.Tensor,  # [B, N] int64
        accept_length: torch.Tensor,  # [B] int64
    ) -> None: ...


# ------------------------------------------------------------------ capabilities, as resolved
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


@dataclass(frozen=True)
class PolicyCaps:
    """A tree policy's capabilities and static shape, read once at resolve time."""

    samples: bool
    depth: int
    widths: tuple[int, ...]
    children: tuple[int, ...]
    num_nodes: int

    @property
    def chain(self) -> bool:
        """One draft per depth (every width and candidate count is 1): the trees are chains."""
        return max(self.widths) == 1 and max(self.children) == 1
