"""`MTPDrafter`: MTP-Eagle drafting (one MTP module applied recursively) over its own draft KV.

Implements the `Drafter` protocol with ``needs_last_hidden = True``: it reads only the
target's last hidden state (after the final norm), so the capture set is empty and no
capture buffer exists. Owns the per-slot draft state: the MTP block's K/V of every committed
position (one-layer `PagedKVCache`), and for each slot the feedback state and the logits of
the newest committed row (`ctx_state`, `root_logits`: the root's child distribution).

Positions (as for EAGLE-3). Draft row p pairs the target's last hidden state at position p
with the token at p + 1, uses RoPE position p, and its K/V lives at draft position p; its
logits predict the token at p + 2. After each step the draft KV holds exactly the committed
positions [0, committed_len), like the target's.

Each `propose`:
1. ingest: per slot, last step's accepted path (accept_length + 1 rows, padded to D + 1
   with masked rows) at positions committed_len - a - 1 .. committed_len - 1; their K/V
   overwrite whatever was there (drafts never enter the paged cache). The last valid row
   becomes `ctx_state` / `root_logits`.
2. draft: D - 1 fixed-shape recursive forwards of F rows per slot (F = K for a dynamic tree,
   else 1) at positions committed_len + depth - 1, each reading its parent row's feedback
   state; their K/V stay in a per-propose tensor seen along the ancestor mask. Which nodes
   the tree keeps is `dynamic_tree` (EAGLE-2 top-K expansion, or whole sampled groups when
   drafts are sampled for `verifier="speculative"`).
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

from .draft_attention import gather_prefix, masked_attention
from .dynamic_tree import eagle2_tree, group_sizes, sampled_tree
from .mtp_model import MTPModel, causal_attend

__all__ = ["MTPDrafter"]


class MTPDrafter:
    """MTP-Eagle drafting, linear chain or EAGLE-2 dynamic tree.

    Args:
        model: the MTP head (`MTPModel`), on the device and dtype to run in.
        config: the engine's `SpecConfig` (B, N, D, K, tree shape, max_seq_len, block size).
        embed: the target's embedding, ``tokens [B, T] int64 -> [B, T, d]``.
        head: the target's output head ``[.., d] -> [.., V]``; None when the module has its
            own ``lm_head``.
        samples_drafts: sample drafts from the head's distribution (softmax of its logits)
            and return `draft_probs` (for verifier="speculative"); else argmax / top-K.
        seed: of the draft-sampling generator.

    Attributes (the `Drafter` protocol): needs_hidden_states = False, needs_last_hidden =
    True, samples_drafts, num_tree_slots = N.
    """

    needs_hidden_states = False
    needs_last_hidden = True

    def __init__(
        self,
        model: MTPModel,
        config: SpecConfig,
        *,
        embed: Callable[[torch.Tensor], torch.Tensor],
        head: Callable[[torch.Tensor], torch.Tensor] | None = None,
        samples_drafts: bool = False,
        seed: int = 0,
    ) -> None:
        mcfg = model.config
        if model.lm_head is None and head is None:
            raise ConfigError("the MTP head has no lm_head of its own; pass the target's output head (head=...)")
        self.model = model.eval()
        self.embed = embed
        self.head = head
        self.samples_drafts = bool(samples_drafts)
        self.num_tree_slots = config.num_tree_slots  # N
        self.depth = config.max_draft_len  # D
        self.dynamic = config.tree == "dynamic"
        self.topk = config.topk if self.dynamic else 1  # K
        self.budget = config.max_total_draft_tokens  # N - 1
        self.max_seq_len = config.max_seq_len
        if self.topk > mcfg.vocab_size:
            raise ConfigError(f"topk={self.topk} exceeds the vocabulary ({mcfg.vocab_size})")
        self.group_sizes = group_sizes(self.budget, self.depth, self.topk) if self.samples_drafts else None
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        B = config.max_batch_size
        self.cache = PagedKVCache(
            1,
            mcfg.num_key_value_heads,
            mcfg.head_dim,
            max_batch_size=B,
            max_seq_len=config.max_seq_len,
            block_size=config.kv_block_size,
            num_blocks=B * config.blocks_per_seq,
            device=self.device,
            dtype=self.dtype,
        )
        self.scale = mcfg.head_dim**-0.5
        self.ctx_state = torch.zeros(B, mcfg.hidden_size, device=self.device, dtype=self.dtype)  # [B, d]
        logit_dtype = torch.promote_types(self.dtype, torch.float32)
        self.root_logits = torch.zeros(B, mcfg.vocab_size, device=self.device, dtype=logit_dtype)  # [B, V]
        self.live = torch.zeros(B, dtype=torch.bool, device=self.device)  # [B] slot has draft state
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    # ------------------------------------------------------------------ host side
    def _check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.cache.max_batch_size:
            raise ValueError(f"slot={slot!r} is out of range; allowed: [0, {self.cache.max_batch_size})")

    @torch.no_grad()
    def prefill(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Ingest a prompt: draft rows p = (target last hidden state at p, token at p + 1).

        Args:
            next_tokens: [L] int64, the prompt shifted by one plus the first generated token.
            hidden: [L, d] the target's last hidden states at positions 0..L-1.
        """
        self._check_slot(slot)
        d = self.model.config.hidden_size
        if hidden is None:
            raise ValueError("the MTP drafter needs the target's last hidden state (hidden=None given)")
        L = next_tokens.shape[0]
        if hidden.dim() != 2 or tuple(hidden.shape) != (L, d):
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}; expected [{L}, {d}] for {L} tokens")
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
        state, logits = self.model(embeds, hidden.to(self.device, self.dtype)[None], positions, attend, head=self.head)
        self.ctx_state[slot] = state[0, -1]
        self.root_logits[slot] = logits[0, -1]
        self.live[slot] = True

    def reset_slot(self, slot: int) -> None:
        """Forget `slot`: its blocks return to the pool and it drafts root-only trees until the next prefill."""
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

        state, logits = self.model(self.embed(tokens), hidden, positions, attend, head=self.head)
        last = a.clamp(min=0)[:, None, None]  # [B, 1, 1]
        ingested = valid[:, :1]  # [B, 1]
        new_state = torch.gather(state, 1, last.expand(-1, -1, state.shape[-1]))[:, 0]  # [B, d]
        new_logits = torch.gather(logits, 1, last.expand(-1, -1, logits.shape[-1]))[:, 0]  # [B, V]
        self.ctx_state = torch.where(ingested, new_state, self.ctx_state)
        self.root_logits = torch.where(ingested, new_logits, self.root_logits)
        return prefix["k"], prefix["v"], committed

    @torch.no_grad()
    def propose(self, inputs: DraftInput) -> DraftTree:
        """Ingest last step's accepted paths, then draft every slot's tree ([B, N], fixed shape)."""
        d = self.model.config.hidden_size
        if inputs.hidden is not None and inputs.hidden.shape[-1] != d:
            raise ValueError(
                f"DraftInput.hidden has width {inputs.hidden.shape[-1]}; the MTP head reads the target's last hidden "
                f"state of width {d} (is the capture set empty and needs_last_hidden honoured?)"
            )
        live = self.live & inputs.active.to(self.device)  # [B]
        prefix_k, prefix_v, committed = self._ingest(inputs, live)
        S = prefix_k.shape[1]
        prefix_visible = torch.arange(S, device=self.device)[None] < committed[:, None]  # [B, S]
        B = live.shape[0]
        state = dict(
            hidden=self.ctx_state[:, None],  # [B, F_prev, d] feedback of the previous call's rows
            anc=torch.zeros(B, 1, 0, dtype=torch.bool, device=self.device),  # [B, F_prev, M] ancestor keys
            k=prefix_k.new_zeros(B, 0, *prefix_k.shape[2:]),  # [B, M, Hkv, hd] node keys so far
            v=prefix_v.new_zeros(B, 0, *prefix_v.shape[2:]),
            depth=0,
        )

        def step(tokens: torch.Tensor, parent_slot: torch.Tensor) -> torch.Tensor:
            """tokens [B, F], parent_slot [B, F] -> draft log-distribution [B, F, V]."""
            Fr = tokens.shape[1]
            hidden = torch.gather(state["hidden"], 1, parent_slot[..., None].expand(-1, -1, d))
            anc = torch.gather(state["anc"], 1, parent_slot[..., None].expand(-1, -1, state["anc"].shape[-1]))
            anc = torch.cat([anc, torch.eye(Fr, dtype=torch.bool, device=self.device).expand(B, Fr, Fr)], dim=2)
            positions = (committed + state["depth"])[:, None].expand(B, Fr)  # [B, F]

            def attend(q, k, v):
                state["k"] = torch.cat([state["k"], k.to(prefix_k.dtype)], dim=1)
                state["v"] = torch.cat([state["v"], v.to(prefix_v.dtype)], dim=1)
                visible = prefix_visible[:, None].expand(B, Fr, S)
                return masked_attention(q, [(prefix_k, prefix_v, visible), (state["k"], state["v"], anc)], scale=self.scale)

            out, logits = self.model(self.embed(tokens), hidden, positions, attend, head=self.head)
            state.update(hidden=out, anc=anc, depth=state["depth"] + 1)
            return torch.log_softmax(logits, dim=-1)

        root_logq = torch.log_softmax(self.root_logits, dim=-1)  # [B, V]
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
        tokens = torch.cat([root_tokens[:, None], torch.where(keep, grown.tokens, 0)], 1)  # [B, N]
        parents = torch.cat(
            [torch.full((B, 1), -1, dtype=torch.int64, device=self.device), torch.where(keep, grown.parents, -1)], 1
        )  # [B, N]
        num_nodes = torch.where(live, N, 1)  # [B]
        draft_probs = None
        if grown.dists is not None:
            index = torch.cat([torch.zeros(B, 1, dtype=torch.int64, device=self.device), grown.dist_index], 1)  # [B, N]
            rows = torch.gather(grown.dists, 1, index.clamp(min=0)[..., None].expand(-1, -1, grown.dists.shape[-1]))
            draft_probs = torch.where((index >= 0)[..., None] & keep[..., None], rows, 0.0).float()  # [B, N, V]
        return DraftTree(tokens=tokens, parents=parents, num_nodes=num_nodes, draft_probs=draft_probs)
