"""`StepState`: every per-slot tensor a speculative step reads or writes, in one record.

B = max_batch_size request slots x N tree slots, allocated once, updated in place (`copy_`,
never rebound), so a CUDA graph captured per batch bucket has the state's storage as its
static inputs and outputs. The drafter's own per-slot tensors (a draft head's context state
and root logits, which slots it holds) are part of it (`drafter`): the step, the drafter's
`propose` included, reads nothing per slot from anywhere else. A step runs on a bucket b,
the first b slots: `rows(b)` gives views.

This module owns the record and its allocation only; the step is `specdec.engine.step.DeviceStep`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .types import SamplingTensors, TreeMeta

__all__ = ["StepState", "drafter_slot_state"]


@dataclass
class StepState:
    """Per-slot decoding state (row b = request slot b; inactive rows are padding).

    root_tokens:   [B] int64 newest token of each slot (tree node 0; its KV is not cached)
    committed_len: [B] int64 tokens with target KV. The last step's accepted path started at
                   committed_len - accept_length - 1.
    accept_length: [B] int64 drafts accepted by the last step (-1 right after prefill: nothing
                   new for a drafter to ingest)
    accept_tokens: [B, N] int64 tokens the last step emitted (accepted drafts, bonus, -1)
    active:        [B] bool slots holding a live request
    hidden_path:   [B, N, w] the target states along the last accepted path (row j = the state
                   at position committed_len - accept_length - 1 + j; rows past accept_length
                   undefined), what the drafter reads (captured layers or the last hidden
                   state), or None when it reads nothing
    sampling:      per-slot sampling tensors, `seed` included (drafters that sample temper with
                   them and key their counter-based draws by the seed)
    draft_tokens / draft_parents: [B, N] int64, draft_num_nodes: [B] int64, a host drafter's tree
    draft_budget:  [B] int64 draft tokens each request verifies per step (`num_draft_tokens`);
                   the tree is cut to its first 1 + budget nodes (a prefix of a topological
                   order is a tree), 0 = the root only, i.e. plain decoding for that request
    tree:          [B, N] tree metadata buffers (`build_tree(out=...)`); tree1: [B, 1] the root-only
                   tree, built once by `DeviceStep` (plain steps, and every step when N = 1)
    handoff:       [B, N + 1] int64, what the host reads after a step: accept_length, then
                   the emitted tokens
    drafter:       the drafter's per-slot tensors by name, each [B, ...] (`Drafter.slot_state()`;
                   empty for drafters that keep none). The drafter's prefill writes them; its
                   `propose` reads and advances them through this record.
    """

    root_tokens: torch.Tensor
    committed_len: torch.Tensor
    accept_length: torch.Tensor
    accept_tokens: torch.Tensor
    active: torch.Tensor
    hidden_path: torch.Tensor | None
    sampling: SamplingTensors
    draft_tokens: torch.Tensor
    draft_parents: torch.Tensor
    draft_num_nodes: torch.Tensor
    draft_budget: torch.Tensor
    tree: TreeMeta
    tree1: TreeMeta
    handoff: torch.Tensor
    drafter: dict[str, torch.Tensor] = field(default_factory=dict)

    @staticmethod
    def allocate(batch: int, nodes: int, hidden_width: int, *, device, hidden_dtype,
                 drafter: dict[str, torch.Tensor] | None = None) -> "StepState":
        """A zeroed state of `batch` slots and `nodes` tree slots; `drafter`: the drafter's
        per-slot tensors (`Drafter.slot_state()`), kept as they are (not copied)."""
        i64 = dict(dtype=torch.int64, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        return StepState(
            root_tokens=torch.zeros(batch, **i64),
            committed_len=torch.zeros(batch, **i64),
            accept_length=torch.full((batch,), -1, **i64),
            accept_tokens=torch.full((batch, nodes), -1, **i64),
            active=torch.zeros(batch, dtype=torch.bool, device=device),
            hidden_path=torch.zeros(batch, nodes, hidden_width, dtype=hidden_dtype, device=device) if hidden_width else None,
            sampling=SamplingTensors(
                temperature=torch.zeros(batch, **f32),
                top_k=torch.zeros(batch, **i64),
                top_p=torch.ones(batch, **f32),
                min_p=torch.zeros(batch, **f32),
                seed=torch.zeros(batch, **i64),
            ),
            draft_tokens=torch.zeros(batch, nodes, **i64),
            draft_parents=torch.full((batch, nodes), -1, **i64),
            draft_num_nodes=torch.ones(batch, **i64),
            draft_budget=torch.full((batch,), nodes - 1, **i64),
            tree=TreeMeta.empty(batch, nodes, device),
            tree1=TreeMeta.empty(batch, 1, device),
            handoff=torch.zeros(batch, nodes + 1, **i64),
            drafter=_checked_drafter_state(drafter, batch),
        )

    @staticmethod
    def for_drafting(root_tokens: torch.Tensor, committed_len: torch.Tensor, accept_length: torch.Tensor,
                     accept_tokens: torch.Tensor, active: torch.Tensor, hidden_path: torch.Tensor | None = None,
                     sampling: SamplingTensors | None = None, drafter=None) -> "StepState":
        """A state holding what a drafter's `propose` reads, for using a drafter on its own
        (tests, benchmarks, training checks): these tensors as they are (B from root_tokens
        [B], N from accept_tokens [B, N]), the rest allocated on root_tokens' device;
        `drafter`: the drafter whose per-slot tensors it carries (its `slot_state()`)."""
        B, N = accept_tokens.shape
        dev = root_tokens.device
        state = StepState.allocate(B, N, 0, device=dev, hidden_dtype=torch.float32,
                                   drafter=drafter_slot_state(drafter))
        state.root_tokens, state.committed_len, state.accept_length = root_tokens, committed_len, accept_length
        state.accept_tokens, state.active, state.hidden_path = accept_tokens, active, hidden_path
        if sampling is not None:
            state.sampling = sampling
        return state

    def rows(self, b: int) -> "StepState":
        """Views of the first `b` slots (a batch bucket); writes land in this state."""
        return StepState(
            root_tokens=self.root_tokens[:b],
            committed_len=self.committed_len[:b],
            accept_length=self.accept_length[:b],
            accept_tokens=self.accept_tokens[:b],
            active=self.active[:b],
            hidden_path=None if self.hidden_path is None else self.hidden_path[:b],
            sampling=self.sampling.rows(b),
            draft_tokens=self.draft_tokens[:b],
            draft_parents=self.draft_parents[:b],
            draft_num_nodes=self.draft_num_nodes[:b],
            draft_budget=self.draft_budget[:b],
            tree=self.tree.rows(b),
            tree1=self.tree1.rows(b),
            handoff=self.handoff[:b],
            drafter={name: x[:b] for name, x in self.drafter.items()},
        )

    @property
    def batch_size(self) -> int:
        return self.root_tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.accept_tokens.shape[1]


def drafter_slot_state(drafter) -> dict[str, torch.Tensor]:
    """`drafter.slot_state()` (a drafter without one keeps no per-slot tensors: {})."""
    if drafter is None or not hasattr(drafter, "slot_state"):
        return {}
    return drafter.slot_state()


def _checked_drafter_state(drafter: dict[str, torch.Tensor] | None, batch: int) -> dict[str, torch.Tensor]:
    """The drafter's per-slot tensors, each with at least `batch` rows (a bucket slices them)."""
    tensors = dict(drafter or {})
    for name, x in tensors.items():
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[0] < batch:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"the drafter's slot tensor {name!r} is {shape}; it needs a first dimension of "
                             f">= {batch} (one row per request slot)")
    return tensors
