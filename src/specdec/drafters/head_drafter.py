"""`HeadDrafter`: the draft loop of drafters that run one learned draft layer over their own
paged draft KV (EAGLE-3's head, an MTP module). The subclasses only say how their model is
called, what hidden state it reads and how its vocabulary maps to the target's.

Owns the per-slot draft state: the draft KV of every committed position (one-layer
`PagedKVCache`), and for each slot the draft layer's output at the newest committed position
(`ctx_hidden`: what the next draft row reads) with the draft logits there (`root_logits`:
the root's child distribution).

Positions. Draft row p pairs the target's state at position p (captured layers for EAGLE-3,
the last hidden state for MTP) with the token at p + 1 and uses RoPE position p; its K/V
lives at draft position p, and its logits predict the token at p + 2. So after a step the
draft KV holds exactly the committed positions [0, committed_len), the same as the target's.

Each `propose`:
1. ingest: per slot, the accepted path of the last step (accept_length + 1 rows, padded to
   D + 1 with masked rows) at positions committed_len - a - 1 .. committed_len - 1; their
   K/V overwrite whatever the draft wrote there before (drafts are never stored in the
   paged cache, so nothing else needs correcting). The last valid row becomes
   `ctx_hidden` / `root_logits`.
2. draft: D - 1 fixed-shape forwards of F rows per slot (F = K for the EAGLE-2 tree, else 1)
   at positions committed_len + depth - 1, each reading its parent row's output; their K/V
   stays in a per-propose tensor seen along the ancestor mask (`draft_attention`). Which
   nodes the tree keeps is `dynamic_tree` (EAGLE-2 top-K expansion, or whole sampled groups
   when drafts are sampled for `verifier="speculative"`, tempered by each slot's temperature).
No `.item()` and no branching on tensor values in `propose`; `prefill` and `reset_slot` are
host-side, between steps.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.config import ConfigError, SpecConfig
from specdec.runtime.kv_cache import PagedKVCache
from specdec.strategies import DraftInput
from specdec.types import DraftTree

from .draft_attention import causal_attend, gather_prefix, masked_attention
from .dynamic_tree import eagle2_tree, group_sizes, sampled_tree

__all__ = ["HeadDrafter"]

class HeadDrafter:
    """The shared draft loop; a subclass sets the class attributes below and implements `_forward`.

    Args:
        model: the draft module, on the device and dtype to run in.
        config: the engine's `SpecConfig` (B, N, D, K, tree shape, max_seq_len, block size).
        embed: the target's embedding (or the head's own), ``tokens [B, T] int64 -> [B, T, d]``.
        hidden_size: d, the draft layer's width. num_kv_heads, head_dim: its attention shape.
        draft_vocab_size: Vd, the size of the head's output vocabulary.
        vocab_size: V, the target's vocabulary.
        target_ids: [Vd] int64, the target id of each draft id (a draft vocabulary smaller
            than the target's: drafts map through it and `draft_probs` are scattered into
            V); None when the head predicts over the target's vocabulary itself (Vd == V).
        hidden_width: the width of the target states the first row reads (`DraftInput.hidden`).
        samples_drafts: sample drafts from the (tempered) draft distribution and return
            `draft_probs` (for verifier="speculative"); else drafts are argmax / top-K.
        seed: of the draft-sampling generator.
    """

    needs_hidden_states: bool  # reads captured target layers
    needs_last_hidden: bool  # reads the target's last hidden state
    kind = "draft head"  # for messages
    hidden_name = "the target's hidden states"  # what `DraftInput.hidden` holds, for messages

    def __init__(
        self,
        model: torch.nn.Module,
        config: SpecConfig,
        *,
        embed: Callable[[torch.Tensor], torch.Tensor],
        hidden_size: int,
        num_kv_heads: int,
        head_dim: int,
        draft_vocab_size: int,
        vocab_size: int,
        target_ids: torch.Tensor | None = None,
        hidden_width: int,
        samples_drafts: bool = False,
        seed: int = 0,
    ) -> None:
        self.model = model.eval()
        self.embed = embed
        self.hidden_width = hidden_width
        self.samples_drafts = bool(samples_drafts)
        self.num_tree_slots = config.num_tree_slots  # N
        self.depth = config.max_draft_len  # D
        self.dynamic = config.tree == "dynamic"
        self.topk = config.topk if self.dynamic else 1  # K
        self.budget = config.max_total_draft_tokens  # N - 1
        self.max_seq_len = config.max_seq_len
        if target_ids is None and draft_vocab_size != vocab_size:
            raise ConfigError(
                f"the {self.kind} predicts {draft_vocab_size} ids but the target has {vocab_size}: pass target_ids"
            )
        if target_ids is not None and tuple(target_ids.shape) != (draft_vocab_size,):
            raise ConfigError(f"target_ids has shape {tuple(target_ids.shape)}; expected [{draft_vocab_size}]")
        self.vocab_size = vocab_size  # V
        if self.topk > draft_vocab_size:
            raise ConfigError(f"topk={self.topk} exceeds the {self.kind}'s vocabulary ({draft_vocab_size})")
        # sampled trees draw whole groups (see dynamic_tree.sampled_tree)
        self.group_sizes = group_sizes(self.budget, self.depth, self.topk) if self.samples_drafts else None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        B = config.max_batch_size
        self.cache = PagedKVCache(
            1,
            num_kv_heads,
            head_dim,
            max_batch_size=B,
            max_seq_len=config.max_seq_len,
            block_size=config.kv_block_size,
            num_blocks=B * config.blocks_per_seq,
            device=self.device,
            dtype=self.dtype,
        )
        self.scale = head_dim**-0.5
        self.ctx_hidden = torch.zeros(B, hidden_size, device=self.device, dtype=self.dtype)  # [B, d]
        logit_dtype = torch.promote_types(self.dtype, torch.float32)
        self.root_logits = torch.zeros(B, draft_vocab_size, device=self.device, dtype=logit_dtype)  # [B, Vd]
        self.live = torch.zeros(B, dtype=torch.bool, device=self.device)  # [B] slot has draft state
        self.target_ids = None if target_ids is None else target_ids.to(self.device, torch.int64)  # [Vd]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    # ------------------------------------------------------------------ subclass hook
    def _forward(self, embeds, hidden, positions, attend, *, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft-layer call: embeds [B, T, d], hidden [B, T, width] (target states when
        `first`, else draft outputs [B, T, d]) -> (output [B, T, d], logits [B, T, Vd] float32+)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ vocabularies
    def _to_target(self, draft_tokens: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (identity for a full-vocabulary head)."""
        return draft_tokens if self.target_ids is None else self.target_ids[draft_tokens]

    def _full_probs(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, N, Vd] draft probabilities -> [B, N, V] float32 over the target vocabulary."""
        if self.target_ids is None:
            return rows.float()
        B, N, _ = rows.shape
        probs = torch.zeros(B, N, self.vocab_size, device=rows.device)  # [B, N, V] float32
        probs.scatter_(2, self.target_ids.expand(B, N, -1), rows.float())
        return probs

    # ------------------------------------------------------------------ host side
    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.cache.max_batch_size:
            raise ValueError(f"slot={slot!r} is out of range; allowed: [0, {self.cache.max_batch_size})")

    @torch.no_grad()
    def prefill(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Ingest a prompt: draft rows p = (target state at p, token at p + 1), p = 0..L-1.

        Args:
            next_tokens: [L] int64, the prompt shifted by one plus the first generated token.
            hidden: [L, width] the target states the head reads, at positions 0..L-1.
        """
        self._check_slot(slot)
        if hidden is None:
            raise ValueError(f"the {self.kind} drafter needs {self.hidden_name} (hidden=None given)")
        L = next_tokens.shape[0]
        if hidden.dim() != 2 or tuple(hidden.shape) != (L, self.hidden_width):
            raise ValueError(
                f"hidden has shape {tuple(hidden.shape)}; expected [{L}, {self.hidden_width}] "
                f"({self.hidden_name} of {L} tokens)"
            )
        if not 1 <= L <= self.max_seq_len:
            raise ValueError(f"prompt of {L} tokens is out of range; allowed: [1, max_seq_len={self.max_seq_len}]")
        self.cache.free(slot)
        self.cache.reserve(slot, self.max_seq_len)
        slots = torch.tensor([slot], device=self.device)
        positions = torch.arange(L, device=self.device)[None]  # [1, L]
        index = self.cache.write_index(slots, positions, torch.ones_like(positions, dtype=torch.bool))
        causal = causal_attend(self.scale)

        def attend(q, k, v):  # causal over the prompt's own rows
            self.cache.write(0, k, v, index)
            return causal(q, k, v)

        embeds = self.embed(next_tokens.to(self.device)[None])  # [1, L, d]
        out, logits = self._forward(embeds, hidden.to(self.device, self.dtype)[None], positions, attend, first=True)
        self.ctx_hidden[slot] = out[0, -1]
        self.root_logits[slot] = logits[0, -1]
        self.live[slot] = True

    def reset_slot(self, slot: int) -> None:
        """Forget `slot`: its blocks go back to the pool and it drafts root-only trees until the next prefill."""
        self._check_slot(slot)
        self.cache.free(slot)
        self.live[slot] = False

    # ------------------------------------------------------------------ device side
    def _ingest(self, inputs: DraftInput, live: torch.Tensor):
        """Run the accepted paths; returns the gathered draft-KV prefix and committed lengths."""
        B = live.shape[0]
        R = self.depth + 1  # longest accepted path: D drafts + the bonus
        S = self.max_seq_len
        slots = torch.arange(B, device=self.device)
        committed = inputs.committed_len.to(self.device)  # [B]
        if inputs.hidden is None:  # nothing verified yet: every slot is fresh from prefill
            return (*gather_prefix(self.cache, slots, S), committed)
        a = inputs.accept_length.to(self.device)  # [B], -1 = nothing new
        j = torch.arange(R, device=self.device)[None]  # [1, R]
        valid = live[:, None] & (j <= a[:, None])  # [B, R]
        positions = torch.where(valid, (committed - a - 1)[:, None] + j, 0)  # [B, R]
        tokens = torch.where(valid, inputs.accept_tokens[:, :R].to(self.device), 0)
        hidden = inputs.hidden[:, :R].to(self.device, self.dtype)
        hidden = torch.where(valid[..., None], hidden, 0)  # rows past a are undefined (maybe NaN)
        index = self.cache.write_index(slots, positions, valid)
        prefix = {}

        def attend(q, k, v):
            self.cache.write(0, k, v, index)
            pk, pv = gather_prefix(self.cache, slots, S)
            key_pos = torch.arange(S, device=self.device)[None, None]  # [1, 1, S]
            visible = (key_pos <= positions[:, :, None]) & valid[:, :, None]  # [B, R, S]
            prefix.update(k=pk, v=pv)
            return masked_attention(q, [(pk, pv, visible)], scale=self.scale)

        out, logits = self._forward(self.embed(tokens), hidden, positions, attend, first=True)
        last = a.clamp(min=0)[:, None, None]  # [B, 1, 1]
        ingested = valid[:, :1]  # [B, 1]
        new_ctx = torch.gather(out, 1, last.expand(-1, -1, out.shape[-1]))[:, 0]  # [B, d]
        new_logits = torch.gather(logits, 1, last.expand(-1, -1, logits.shape[-1]))[:, 0]  # [B, Vd]
        self.ctx_hidden = torch.where(ingested, new_ctx, self.ctx_hidden)
        self.root_logits = torch.where(ingested, new_logits, self.root_logits)
        return prefix["k"], prefix["v"], committed

    def _log_dist(self, logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
        """Draft log-distribution [..., Vd]; tempered per slot when drafts are sampled."""
        if self.samples_drafts and temperature is not None:
            t = torch.where(temperature > 0, temperature, 1.0).to(logits.device)
            logits = logits / t.view(-1, *([1] * (logits.dim() - 1)))
        return torch.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def propose(self, inputs: DraftInput) -> DraftTree:
        """Ingest last step's accepted paths, then draft every slot's tree ([B, N], fixed shape)."""
        if inputs.hidden is not None and inputs.hidden.shape[-1] != self.hidden_width:
            raise ValueError(
                f"DraftInput.hidden has width {inputs.hidden.shape[-1]}; the {self.kind} reads {self.hidden_name} "
                f"of width {self.hidden_width}"
            )
        live = self.live & inputs.active.to(self.device)  # [B]
        prefix_k, prefix_v, committed = self._ingest(inputs, live)
        S = prefix_k.shape[1]
        prefix_visible = torch.arange(S, device=self.device)[None] < committed[:, None]  # [B, S]
        sampling = getattr(inputs, "sampling", None)
        temperature = None if sampling is None else sampling.temperature
        B = live.shape[0]
        state = dict(
            hidden=self.ctx_hidden[:, None],  # [B, F_prev, d] outputs of the previous call's rows
            anc=torch.zeros(B, 1, 0, dtype=torch.bool, device=self.device),  # [B, F_prev, M] ancestor keys
            k=prefix_k.new_zeros(B, 0, *prefix_k.shape[2:]),  # [B, M, Hkv, hd] node keys so far
            v=prefix_v.new_zeros(B, 0, *prefix_v.shape[2:]),
            depth=0,
        )

        def step(tokens: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
            """draft tokens [B, F], parent_slot [B, F] -> draft log-distribution [B, F, Vd]."""
            Fr = tokens.shape[1]
            hidden = torch.gather(state["hidden"], 1, parent_slot[..., None].expand(-1, -1, state["hidden"].shape[-1]))
            anc = torch.gather(state["anc"], 1, parent_slot[..., None].expand(-1, -1, state["anc"].shape[-1]))
            anc = torch.cat([anc, torch.eye(Fr, dtype=torch.bool, device=self.device).expand(B, Fr, Fr)], dim=2)
            positions = (committed + state["depth"])[:, None].expand(B, Fr)  # [B, F]

            def attend(q, k, v):
                state["k"] = torch.cat([state["k"], k.to(prefix_k.dtype)], dim=1)
                state["v"] = torch.cat([state["v"], v.to(prefix_v.dtype)], dim=1)
                visible = prefix_visible[:, None].expand(B, Fr, S)
                return masked_attention(q, [(prefix_k, prefix_v, visible), (state["k"], state["v"], anc)], scale=self.scale)

            embeds = self.embed(self._to_target(tokens))
            out, logits = self._forward(embeds, hidden, positions, attend, first=False)
            state.update(hidden=out, anc=anc, depth=state["depth"] + 1)
            return self._log_dist(logits, temperature)

        root_logq = self._log_dist(self.root_logits, temperature)  # [B, Vd]
        if self.samples_drafts:
            gen = self.generator
            grown = sampled_tree(
                root_logq, step, sizes=self.group_sizes,
                sample=lambda p, c: torch.multinomial(p, c, replacement=True, generator=gen),
            )
        else:
            grown = eagle2_tree(root_logq, step, topk=self.topk, depth=self.depth, budget=self.budget)
        return self._draft_tree(inputs.root_tokens.to(self.device), grown, live)

    def _draft_tree(self, root_tokens: torch.Tensor, grown, live: torch.Tensor) -> DraftTree:
        B, S = grown.tokens.shape
        N = S + 1
        keep = live[:, None]  # [B, 1]; other slots get a root-only tree
        tokens = torch.cat([root_tokens[:, None], torch.where(keep, self._to_target(grown.tokens), 0)], 1)  # [B, N]
        parents = torch.cat(
            [torch.full((B, 1), -1, dtype=torch.int64, device=self.device), torch.where(keep, grown.parents, -1)], 1
        )  # [B, N]
        num_nodes = torch.where(live, N, 1)  # [B]
        draft_probs = None
        if grown.dists is not None:
            index = torch.cat([torch.zeros(B, 1, dtype=torch.int64, device=self.device), grown.dist_index], 1)  # [B, N]
            rows = torch.gather(grown.dists, 1, index.clamp(min=0)[..., None].expand(-1, -1, grown.dists.shape[-1]))
            rows = torch.where((index >= 0)[..., None] & keep[..., None], rows, 0.0)  # [B, N, Vd]
            draft_probs = self._full_probs(rows)  # [B, N, V] float32
        return DraftTree(tokens=tokens, parents=parents, num_nodes=num_nodes, draft_probs=draft_probs)
