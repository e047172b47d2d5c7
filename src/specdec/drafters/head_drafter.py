"""`HeadDrafter`: the draft loop of drafters that run one learned draft layer over a paged
draft KV (EAGLE-3's head, an MTP module). The subclasses only say how their model is called,
what hidden state it reads and how its vocabulary maps to the target's.

Owns the per-slot draft state: the draft KV of every committed position (one layer in a
`PagedKVCache` that, inside an engine, sits on the target cache's allocator: one reservation
backs both), and for each slot the draft layer's output at the newest committed position
(`ctx_hidden`: what the next draft row reads) with the draft logits there (`root_logits`:
the root's child distribution). All of it is updated in place, so a captured step has static
inputs and outputs.

Positions. Draft row p pairs the target's state at position p (captured layers for EAGLE-3,
the last hidden state for MTP) with the token at p + 1 and uses RoPE position p; its K/V
lives at draft position p, and its logits predict the token at p + 2. So after a step the
draft KV holds exactly the committed positions [0, committed_len), the same as the target's.

Each `propose`:
1. ingest: per slot, the accepted path of the last step (accept_length + 1 rows, padded to
   D + 1 with masked rows) at positions committed_len - a - 1 .. committed_len - 1, a causal
   paged-attention forward; their K/V overwrite whatever the draft wrote there before. The
   last valid row becomes `ctx_hidden` / `root_logits`.
2. draft: the tree policy (`specdec.strategies.TreePolicy`) calls `expand` D times; call 0
   answers from `root_logits`, call t >= 1 is one fixed-shape forward of F_t rows per slot
   (the policy's frontier width) at RoPE position committed_len + t - 1, each row reading
   its parent row's output. Draft row f of forward t is stored at logical position
   committed_len + (F_1 + ... + F_{t-1}) + f (positions the next ingest overwrites), and
   attends over the committed prefix plus its ancestors' rows through a packed ancestor
   mask (`AttentionBatch.key_len`). Each call answers the policy's K_t candidates per node:
   the top-K of the draft distribution, or K i.i.d. draws when the policy samples (tempered
   by each slot's temperature, counter-based uniforms keyed by the request's seed, position
   and call). Which nodes the tree keeps is the policy's business alone.
No `.item()`, no host-to-device copies and no branching on tensor values in `propose`;
`prefill` and `reset_slot` are host-side, between steps. `propose` runs on the first B slots,
B = the inputs' batch bucket.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specdec.checks import check_slot
from specdec.compile_scope import compile_private
from specdec.drafters.draft_layers import take_rows
from specdec.config import ConfigError, SpecConfig
from specdec.ops.columns import cat_columns
from specdec.ops.random import STREAM_DRAFT, counter_uniforms
from specdec.ops.sampling import sample_from_probs
from specdec.runtime.attention import AttentionBatch, attention
from specdec.runtime.batch import new_rows, prefill_batch
from specdec.runtime.bucket_graphs import BucketGraphs, PaddedChunks, bucket_grid
from specdec.runtime.host_copy import to_device
from specdec.runtime.kv_cache import PagedKVCache
from specdec.step_state import StepState
from specdec.types import DraftTree

from specdec.ops.top_logprobs import clean_logq, top_logprobs
from specdec.policies.shapes import builtin
from specdec.types import Candidates, Frontier

__all__ = ["HeadDrafter"]


def _best_children(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, log-probabilities) [B, F, k] of the k best children, from raw draft logits
    [B, F, Vd] (`ops.top_logprobs`: chunked top-k and log-sum-exp, no full log-softmax)."""
    return top_logprobs(logits, k)


def _depth_inputs(prev_hidden, prev_anc, parent_slot, tokens, own_bits, committed, live, block_tables,
                  first: int, t: int, block_size: int, target_ids, embed_weight=None):
    """Everything draft forward t >= 1 reads besides the model, in one compiled piece (in the
    eager step this index arithmetic was ~40 launches per depth).

    Args:
        prev_hidden: [B, F_prev, d] outputs of the previous forward's rows; prev_anc: [B, F_prev, W]
            their ancestor bits; parent_slot, tokens: [B, F] int64 the frontier (draft ids);
        own_bits: [F, W] int32 the frontier rows' own bits; committed: [B] int64; live: [B] bool;
        block_tables: the draft cache's; first: the first stored row of forward t;
        embed_weight: [V, d] the embedding table when the drafter's embedding is a plain lookup
            (then looked up here, in the same piece), else None.
    Returns:
        hidden [B, F, d], anc [B, F, W] (ancestors and self), write_index [B, F], q_len [B],
        key_len [B], positions [B, F] (RoPE: committed + t - 1), and the rows' target tokens
        [B, F] int64, or their embeddings [B, F, d] when `embed_weight` is given.
    """
    B, F = tokens.shape
    hidden = torch.gather(prev_hidden, 1, parent_slot[..., None].expand(-1, -1, prev_hidden.shape[-1]))
    anc = torch.gather(prev_anc, 1, parent_slot[..., None].expand(-1, -1, prev_anc.shape[-1])) | own_bits
    q_len = torch.where(live, F, 0)  # [B], for new_rows; the one returned is written [B, F] below
    # the rows are stored at committed + first + f (positions the next ingest overwrites)
    _, write_index = new_rows(block_tables, block_size, torch.arange(B, device=tokens.device), committed + first, q_len, F)
    # The lengths and positions written out as [B, F] (each row's value F times), not as [B]: same
    # size as write_index and reading its inputs, Inductor makes the four one kernel; [B]-sized they
    # were two more kernels per depth of a tree (F > 1). The lengths are their first column, a
    # strided [B] view (the attention kernel reads lengths at any stride). new_rows keeps its own
    # [B] q_len above: fed the written [B, F] one, write_index read it back as a separate kernel (5).
    q_len = torch.where(live[:, None], F, 0).expand(B, F).contiguous()[:, 0]  # [B], stride F
    key_len = torch.where(live[:, None], first + F, 0).expand(B, F).contiguous()[:, 0]  # [B], stride F
    positions = (committed + t - 1)[:, None].expand(B, F).contiguous()
    target_tokens = _draft_to_target(tokens, target_ids)
    if embed_weight is not None:
        return hidden, anc, write_index, q_len, key_len, positions, torch.nn.functional.embedding(target_tokens, embed_weight)
    return hidden, anc, write_index, q_len, key_len, positions, target_tokens


def _ingest_inputs(committed, accept_length, accept_tokens, hidden, live, block_tables, rows: int, block_size: int,
                   embed_weight=None):
    """What the ingest forward reads, in one compiled piece: each live slot's accepted path
    (accept_length + 1 rows, padded to `rows`) at positions committed - a - 1 ...

    Args:
        committed, accept_length: [B] int64; accept_tokens: [B, N] int64; hidden: [B, N, w]
        (rows past the path may hold anything, NaN included); live: [B] bool.
    Returns:
        ingest [B] bool (slots with a new path), q_len [B], start [B], positions [B, rows],
        write_index [B, rows], tokens [B, rows] (0 past the path; embedded [B, rows, d] when
        `embed_weight`, the table of a plain lookup, is given), hidden [B, rows, w] (0 past it).
    """
    B = committed.shape[0]
    ingest = live & (accept_length >= 0)
    q_len = torch.where(ingest, accept_length + 1, 0)
    start = torch.where(ingest, committed - accept_length - 1, 0)
    slots = torch.arange(B, device=committed.device)
    positions, write_index = new_rows(block_tables, block_size, slots, start, q_len, rows)
    valid = positions < (start + q_len)[:, None]  # [B, rows] the path's rows
    tokens = torch.where(valid, accept_tokens[:, :rows], 0)
    states = torch.where(valid[..., None], hidden[:, :rows], 0)
    if embed_weight is not None:  # a plain table: the rows' embeddings, in this piece
        tokens = torch.nn.functional.embedding(tokens, embed_weight)
    return ingest, q_len, start, positions, write_index, tokens, states


def _last_index(q_len: torch.Tensor) -> torch.Tensor:
    """[B] int64: each batch row's last row, q_len - 1 (row 0 where q_len is 0)."""
    return (q_len - 1).clamp(min=0)


def _last_row(x: torch.Tensor, q_len: torch.Tensor) -> torch.Tensor:
    """Row q_len - 1 of each batch row: x [B, T, w] -> [B, w] (row 0 where q_len is 0)."""
    return take_rows(x, _last_index(q_len))[:, 0]


def _draft_to_target(draft_tokens: torch.Tensor, target_ids: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocabulary ids -> target ids (identity for a full-vocabulary head)."""
    return draft_tokens if target_ids is None else target_ids[draft_tokens]


def _ingest_outputs(out, logits, q_len, ingest, ctx, root) -> None:
    """Each ingested slot's last row becomes its ctx_hidden [B, d] and root_logits [B, Vd], in
    place (the state's views); other slots keep theirs."""
    ctx.copy_(torch.where(ingest[:, None], _last_row(out, q_len).to(ctx.dtype), ctx))
    root.copy_(torch.where(ingest[:, None], _last_row(logits, q_len).to(root.dtype), root))


def _tree_of(root_tokens, grown_tokens, grown_parents, grown_num_nodes, live, target_ids):
    """The policy's grown tree [B, S] under each slot's root -> (tokens [B, N] target ids,
    parents [B, N], num_nodes [B]); slots without draft state (`live` False) get a root-only
    tree. One compiled piece (eagerly ~8 launches a step; 3 GPU kernels with `cat_columns`,
    5 with `torch.cat`)."""
    keep = live[:, None]  # [B, 1]
    tokens = cat_columns([root_tokens[:, None], torch.where(keep, _draft_to_target(grown_tokens, target_ids), 0)])
    root = torch.full((1, 1), -1, dtype=torch.int64, device=grown_parents.device)
    parents = cat_columns([root, torch.where(keep, grown_parents, -1)])
    return tokens, parents, torch.where(live, grown_num_nodes + 1, 1)


def _bit(k: int) -> int:
    return -(1 << 31) if k == 31 else 1 << k  # int32 sign bit for bit 31


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
        hidden_width: the width of the target states the first row reads (`StepState.hidden_path`).
        samples_drafts: return `draft_probs` with each tree (for verifiers that need draft
            probabilities); the policy must then sample.
        seed: mixed into the keys of the draft-sampling draws (with each request's own seed).
        policy: the tree policy (`specdec_tree_policy`); None = the built-in policy that
            `config.tree` names, sampling iff `samples_drafts`.
        num_layers: the draft layers, each with its own layer of the draft KV cache; `_forward`
            gets one `attend` per layer when there are several.
    """

    reads: str  # "captured" or "last_hidden" (the `Drafter` capability)
    runs_on_host = False  # drafts inside the captured step
    kind = "draft head"  # for messages
    hidden_name = "the target's hidden states"  # what `StepState.hidden_path` holds, for messages
    SLOT_TENSORS = ("ctx_hidden", "root_logits", "live")  # its per-slot tensors (`slot_state`)

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
        policy=None,
        num_layers: int = 1,
    ) -> None:
        self.model = model.eval()
        self.num_layers = num_layers  # draft layers, each with its own K/V (one `attend` per layer)
        self.embed = embed
        # a plain lookup table (an nn.Embedding: the head's own, or the target's `embed_lookup`) is
        # read inside each depth's compiled input piece, one launch fewer per draft depth; any
        # other embedding (a sharded one, say) runs as its own call
        plain = isinstance(embed, torch.nn.Embedding) and embed.max_norm is None
        self._lookup = embed if plain else None
        self.hidden_width = hidden_width
        self.samples_drafts = bool(samples_drafts)
        self.policy = policy if policy is not None else builtin(config, samples=self.samples_drafts)
        self.sample = self.policy.samples  # candidates are i.i.d. draws
        if self.samples_drafts and not self.sample:
            raise ConfigError(
                f"the {self.kind} returns draft probabilities only for sampled drafts; tree={config.tree!r} "
                "keeps candidates by value (policy.samples=False)"
            )
        self.num_tree_slots = self.policy.num_nodes + 1  # N
        self.depth = self.policy.depth  # D
        self.max_seq_len = config.cache.max_seq_len
        if target_ids is None and draft_vocab_size != vocab_size:
            raise ConfigError(
                f"the {self.kind} predicts {draft_vocab_size} ids but the target has {vocab_size}: pass target_ids"
            )
        if target_ids is not None and tuple(target_ids.shape) != (draft_vocab_size,):
            raise ConfigError(f"target_ids has shape {tuple(target_ids.shape)}; expected [{draft_vocab_size}]")
        self.vocab_size = vocab_size  # V
        widest = max(self.policy.children)
        if widest > draft_vocab_size and not self.sample:
            raise ConfigError(f"topk={widest} exceeds the {self.kind}'s vocabulary ({draft_vocab_size})")
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        if hasattr(self.policy, "prepare"):  # the built-in policies' constants, before any step runs
            self.policy.prepare(self.device)
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        widths = self.policy.widths  # F_t rows of forward t (t >= 1)
        self.row_offsets = tuple(sum(widths[1:t]) for t in range(self.depth))  # first row of forward t
        self.kv_lookahead = sum(widths[1:])  # draft rows stored past committed_len
        B = config.cache.max_batch_size
        self.batch_size = B
        # Standalone (no engine): a private cache; `attach` moves the KV onto the target's allocator.
        self.cache = PagedKVCache(
            num_layers,
            num_kv_heads,
            head_dim,
            max_batch_size=B,
            max_seq_len=config.cache.max_seq_len,
            block_size=config.cache.kv_block_size,
            num_blocks=B * config.cache.blocks_per_seq,
            device=self.device,
            dtype=self.dtype,
        )
        self._owns_cache = True
        self.best_children = _best_children  # `use_compiled` swaps in compiled pieces for these five
        self.depth_inputs = _depth_inputs
        self.ingest_inputs, self.ingest_outputs = _ingest_inputs, _ingest_outputs
        self.tree_of = _tree_of
        self.attn_impl = "auto"  # `runtime.attention` impl: Triton on CUDA, the reference on CPU
        self.rope_impl = "auto"  # `PagedKVCache.write_rotated` impl: fused on CUDA; tests force "triton"
        self.scale = head_dim**-0.5
        self.ctx_hidden = torch.zeros(B, hidden_size, device=self.device, dtype=self.dtype)  # [B, d]
        logit_dtype = torch.promote_types(self.dtype, torch.float32)
        self.root_logits = torch.zeros(B, draft_vocab_size, device=self.device, dtype=logit_dtype)  # [B, Vd]
        self.live = torch.zeros(B, dtype=torch.bool, device=self.device)  # [B] slot has draft state
        self.target_ids = None if target_ids is None else target_ids.to(self.device, torch.int64)  # [Vd]
        self.seed = seed  # mixed into the draw keys of sampled drafts
        # Ancestor-mask bit of each stored draft row (static): [R, W] int32, R = kv_lookahead.
        words = max(1, -(-self.kv_lookahead // 32))
        own = torch.zeros(max(1, self.kv_lookahead), words, dtype=torch.int32)
        for row in range(self.kv_lookahead):
            own[row, row // 32] = _bit(row % 32)
        self._own_bits = own.to(self.device)
        self._no_ancestors = torch.zeros(1, 1, words, dtype=torch.int32, device=self.device)  # the root's row
        self._slots = torch.arange(B, device=self.device)  # [B] slot ids; a step's bucket reads a prefix
        N, i64 = self.num_tree_slots, dict(dtype=torch.int64, device=self.device)
        self._root_only_consts = (torch.zeros(1, N - 1, **i64), torch.full((1, N), -1, **i64), torch.ones(1, **i64))
        self.prefill_buckets: BucketGraphs | None = None  # `use_prefill_buckets`

    def use_compiled(self, on: bool = True) -> None:
        """Compiled candidate selection, per-depth inputs and policy glue (one graph for every
        batch size and frontier width)."""
        self.best_children = compile_private(_best_children, dynamic=True, fullgraph=True) if on else _best_children
        self.depth_inputs = compile_private(_depth_inputs, dynamic=True, fullgraph=True) if on else _depth_inputs
        self.ingest_inputs = compile_private(_ingest_inputs, dynamic=True, fullgraph=True) if on else _ingest_inputs
        self.ingest_outputs = compile_private(_ingest_outputs, dynamic=True, fullgraph=True) if on else _ingest_outputs
        self.tree_of = compile_private(_tree_of, dynamic=True, fullgraph=True) if on else _tree_of
        self.policy.use_compiled(on)

    def slot_state(self) -> dict[str, torch.Tensor]:
        """The per-slot tensors a step reads and advances, for `StepState.drafter`: ctx_hidden
        [B, d] (the head's output at each slot's newest committed row), root_logits [B, Vd]
        (the root's child distribution) and live [B] bool (the slot holds draft state). The
        prefill writes them; `propose` reads them from the state it is given, not from here."""
        return {name: getattr(self, name) for name in self.SLOT_TENSORS}

    def attach(self, cache: PagedKVCache) -> None:
        """Put the draft KV on `cache`'s allocator (the target's): same blocks, same tables."""
        if cache.device != self.device or cache.max_batch_size != self.batch_size:
            return  # a head on another device keeps its private cache
        self.cache = cache.layer_group(self.num_layers, self.num_kv_heads, self.head_dim, dtype=self.dtype)
        self._owns_cache = False

    # ------------------------------------------------------------------ subclass hook
    def _forward(self, embeds, hidden, positions, attend, *, first: bool,
                 logits_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft-layer call: embeds [B, T, d], hidden [B, T, width] (target states when
        `first`, else draft outputs [B, T, d]) -> (output [B, T, d], logits [B, T, Vd] float32+);
        with logits_rows [B] int64 the logits of that row only, [B, 1, Vd]."""
        raise NotImplementedError

    # ------------------------------------------------------------------ vocabularies
    def _full_probs(self, rows: torch.Tensor) -> torch.Tensor:
        """[B, N, Vd] draft probabilities -> [B, N, V] float32 over the target vocabulary."""
        if self.target_ids is None:
            return rows.float()
        B, N, _ = rows.shape
        probs = torch.zeros(B, N, self.vocab_size, device=rows.device)  # [B, N, V] float32
        probs.scatter_(2, self.target_ids.expand(B, N, -1), rows.float())
        return probs

    # ------------------------------------------------------------------ attention
    def _attend(self, batch: AttentionBatch):
        """`attend(q, k, v)` for one draft forward: store the rows' K/V, then paged attention;
        its `with_rope` takes q and k before RoPE and stores through `write_rotated` (RoPE and
        the K/V write in one launch where the cache fuses them: `draft_layers`). A head of
        several layers gets one per layer, each over its own layer of the draft cache."""
        if self.num_layers == 1:
            return self._layer_attend(batch, 0)
        return tuple(self._layer_attend(batch, layer) for layer in range(self.num_layers))

    def _layer_attend(self, batch: AttentionBatch, layer: int):
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write(layer, k, v, batch.write_index)
            return attention(q, self.cache, layer, batch, scale=self.scale, impl=self.attn_impl)

        def with_rope(q, k, v, cos, sin, rotary) -> torch.Tensor:
            q = self.cache.write_rotated(layer, q, k, v, cos, sin, batch.write_index, rotary=rotary,
                                         impl=self.rope_impl)
            return attention(q, self.cache, layer, batch, scale=self.scale, impl=self.attn_impl)

        attend.with_rope = with_rope
        return attend

    # ------------------------------------------------------------------ host side
    def _check_slot(self, slot: int) -> None:
        check_slot(slot, self.batch_size)

    @torch.no_grad()
    def prefill(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None, start: int = 0) -> None:
        """Ingest a prompt chunk: draft rows p = (target state at p, token at p + 1), p = start..start+L-1.

        Args:
            next_tokens: [L] int64, the chunk's tokens shifted by one (see `Drafter.prefill`).
            hidden: [L, width] the target states the head reads, at positions start..start+L-1.
            start: position of the chunk's first row; earlier chunks of the prompt are in the KV.
        """
        self._check_chunk(slot, next_tokens, hidden, start)
        self._ingest_chunks([slot], [next_tokens], [hidden], [start])

    @torch.no_grad()
    def prefill_many(self, slots: list[int], next_tokens: list[torch.Tensor], hidden: list[torch.Tensor],
                     starts: list[int]) -> None:
        """`prefill` of several slots' chunks in one padded forward (the engine's grouped
        prefill): row i is `next_tokens[i]` [T_i] with `hidden[i]` [T_i, width] from
        position starts[i]."""
        for slot, tokens, h, start in zip(slots, next_tokens, hidden, starts):
            self._check_chunk(slot, tokens, h, start)
        self._ingest_chunks(slots, next_tokens, hidden, starts)

    def _check_chunk(self, slot: int, next_tokens: torch.Tensor, hidden: torch.Tensor | None, start: int) -> None:
        """A prefill chunk's arguments, checked; a private cache backs the slot at its first chunk."""
        self._check_slot(slot)
        if hidden is None:
            raise ValueError(f"the {self.kind} drafter needs {self.hidden_name} (hidden=None given)")
        L = next_tokens.shape[0]
        if hidden.dim() != 2 or tuple(hidden.shape) != (L, self.hidden_width):
            raise ValueError(
                f"hidden has shape {tuple(hidden.shape)}; expected [{L}, {self.hidden_width}] "
                f"({self.hidden_name} of {L} tokens)"
            )
        if L < 1 or not 0 <= start <= self.max_seq_len - L:
            raise ValueError(
                f"prompt rows [{start}, {start + L}) are out of range; allowed: within [0, max_seq_len={self.max_seq_len})"
            )
        if self._owns_cache and start == 0:
            self.cache.free(slot)
            self.cache.reserve(slot, self.max_seq_len)

    def _ingest_chunks(self, slots: list[int], next_tokens: list[torch.Tensor], hidden: list[torch.Tensor],
                       starts: list[int]) -> None:
        """Checked chunks through the head in one forward, padded to the longest; each slot's
        last row becomes its `ctx_hidden` / `root_logits`."""
        lengths = [t.shape[0] for t in next_tokens]
        key = None if self.prefill_buckets is None else self.prefill_buckets.key_for(lengths, starts)
        if key is not None:
            self._chunks.fill(key, slots, [t.to(self.device) for t in next_tokens],
                              [h.to(self.device, self.dtype) for h in hidden])
            self.prefill_buckets.run(key)
            return
        dev = self.device
        slots_starts_q_len = to_device([slots, starts, lengths], dev)  # [3, n]: one copy
        q_len = slots_starts_q_len[2]  # [n]
        batch = prefill_batch(self.cache, slots_starts_q_len[0], slots_starts_q_len[1], q_len,
                              max(lengths), max_kv_len=max(s + n for s, n in zip(starts, lengths)))
        tokens = torch.nn.utils.rnn.pad_sequence([t.to(dev) for t in next_tokens], batch_first=True)  # [n, T]
        states = torch.nn.utils.rnn.pad_sequence([h.to(dev, self.dtype) for h in hidden], batch_first=True)  # [n, T, w]
        out, logits = self._forward(self.embed(tokens), states, batch.positions, self._attend(batch), first=True,
                                    logits_rows=_last_index(q_len))
        self._keep_last_rows(slots_starts_q_len[0], out, logits, q_len)

    def _keep_last_rows(self, slots: torch.Tensor, out: torch.Tensor, logits: torch.Tensor, q_len: torch.Tensor) -> None:
        """A prefill forward's last row per chunk becomes its slot's `ctx_hidden` / `root_logits`
        (slots [n] int64; out [n, T, d]; logits [n, 1, Vd], the last rows' alone), and the slot is live."""
        self.ctx_hidden.index_copy_(0, slots, _last_row(out, q_len).to(self.ctx_hidden.dtype))
        self.root_logits.index_copy_(0, slots, logits[:, 0].to(self.root_logits.dtype))
        self.live.index_fill_(0, slots, True)

    def use_prefill_buckets(self, max_len: int, *, capture: bool, pool=None, max_rows: int = 1,
                            max_tokens: int | None = None) -> int:
        """Ingest prompt chunks that all start at position 0 through padded (rows, length)
        buckets (`runtime.bucket_graphs`): up to `max_rows` chunks of up to `max_len` rows,
        rows x length within `max_tokens` (default max_len); one CUDA graph each when
        `capture` (`pool`: a `torch.cuda.graph_pool_handle()`). Returns graphs captured.
        Capture after `attach`: the graphs read the cache they were captured with."""
        if not 1 <= max_len <= self.max_seq_len:
            raise ValueError(f"max_len={max_len} is out of range; allowed: [1, max_seq_len={self.max_seq_len}]")
        if not 1 <= max_rows <= self.batch_size:
            raise ValueError(f"max_rows={max_rows} is out of range; allowed: [1, max_batch_size={self.batch_size}]")
        budget = max_len if max_tokens is None else max_tokens
        self._chunks = PaddedChunks(max_rows, budget, self.device, width=self.hidden_width, dtype=self.dtype)
        keys = bucket_grid(max_rows, max_len, budget)
        self.prefill_buckets = BucketGraphs(self._bucket_forward, keys)
        captured = self.prefill_buckets.capture(self.device, pool) if capture else 0
        self.live.index_fill_(0, self._chunks.slots, False)  # the capture's runs left slot 0 "live"
        return captured

    def _bucket_forward(self, key: tuple[int, int]) -> None:
        """`_ingest_chunks` of bucket (R, T) from the static inputs (padding rows repeat row 0:
        they write row 0's K/V and state again, the same values)."""
        R, T = key
        c = self._chunks
        slots, q_len = c.slots[:R], c.q_len[:R]
        batch = prefill_batch(self.cache, slots, c.starts[:R], q_len, T, max_kv_len=T)
        out, logits = self._forward(self.embed(c.tokens(key)), c.states(key), batch.positions,
                                    self._attend(batch), first=True, logits_rows=_last_index(q_len))
        self._keep_last_rows(slots, out, logits, q_len)

    def reset_slot(self, slot: int) -> None:
        """Forget `slot`: it drafts root-only trees until the next prefill (a private cache frees its blocks)."""
        self._check_slot(slot)
        if self._owns_cache:
            self.cache.free(slot)
        self.live[slot].fill_(False)  # no stream sync (engine._set_sampling)

    # ------------------------------------------------------------------ device side
    def _ingest(self, state: StepState, live: torch.Tensor, kv_len: int) -> None:
        """Run the accepted paths through the head; update the slots' `ctx_hidden` / `root_logits` in place."""
        if state.hidden_path is None:  # standalone use right after prefill: nothing verified yet
            return
        B = live.shape[0]
        R = self.depth + 1  # longest accepted path: D drafts + the bonus
        dev = self.device
        lookup = self._lookup
        ingest, q_len, start, positions, write_index, rows, hidden = self.ingest_inputs(
            state.committed_len.to(dev), state.accept_length.to(dev), state.accept_tokens.to(dev),
            state.hidden_path[:, :R].to(dev, self.dtype), live, self.cache.block_tables, R, self.cache.block_size,
            None if lookup is None else lookup.weight,
        )  # accept_length -1 = nothing new since prefill; rows: tokens [B, R], or embedded [B, R, d]
        batch = AttentionBatch(slots=self._slots[:B], cache_len=start, q_len=q_len, write_index=write_index,
                               tree_mask=None, max_kv_len=kv_len, positions=positions)
        embeds = rows if lookup is not None else self.embed(rows)  # [B, R, d]
        out, logits = self._forward(embeds, hidden, positions, self._attend(batch), first=True)
        slots = state.drafter
        self.ingest_outputs(out, logits, q_len, ingest, slots["ctx_hidden"][:B], slots["root_logits"][:B])

    def _log_dist(self, logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
        """Draft log-distribution [..., Vd]; tempered per slot when drafts are sampled."""
        if self.sample and temperature is not None:
            t = torch.where(temperature > 0, temperature, 1.0).to(logits.device)
            logits = logits / t.view(-1, *([1] * (logits.dim() - 1)))
        return torch.log_softmax(logits, dim=-1)

    def _candidates(self, logits: torch.Tensor, k: int, t: int, key: torch.Tensor, committed: torch.Tensor,
                    temperature: torch.Tensor | None) -> Candidates:
        """Draft logits [B, F, Vd] -> the policy's k candidates per node (top-k, or k i.i.d.
        draws keyed by (seed, position, call t) from the tempered distribution), with the
        distributions when `draft_probs` are returned."""
        if not self.sample:
            tok, lp = self.best_children(logits, k)
            return Candidates(tokens=tok, logq=lp)
        logq = self._log_dist(logits, temperature)
        B, F, _ = logq.shape
        u = counter_uniforms(key, committed * 64 + t, F * k, STREAM_DRAFT).view(B, F, k)  # float64
        lq = clean_logq(logq.float())
        p = lq.exp()  # [B, F, Vd]
        tok = sample_from_probs(p[:, :, None, :].expand(B, F, k, p.shape[-1]), u)  # [B, F, k]
        return Candidates(tokens=tok, logq=torch.gather(lq, 2, tok), probs=p if self.samples_drafts else None)

    @torch.no_grad()
    def propose(self, state: StepState, max_kv_len: int | None = None, draft: bool = True) -> DraftTree:
        """Ingest last step's accepted paths, then draft every slot's tree ([B, N], fixed shape);
        `draft=False` (the adaptive engine's plain step): ingest only, root-only trees."""
        if state.hidden_path is not None and state.hidden_path.shape[-1] != self.hidden_width:
            raise ValueError(
                f"StepState.hidden_path has width {state.hidden_path.shape[-1]}; the {self.kind} reads "
                f"{self.hidden_name} of width {self.hidden_width}"
            )
        slots = state.drafter
        if not all(name in slots for name in self.SLOT_TENSORS):
            raise ValueError(
                f"the StepState carries no slot tensors of this {self.kind} (it has {sorted(slots)}): build it with "
                "StepState.allocate(..., drafter=drafter.slot_state()) or StepState.for_drafting(..., drafter=drafter)"
            )
        dev = self.device
        B = state.root_tokens.shape[0]
        kv_len = max_kv_len or self.max_seq_len
        live = slots["live"][:B] & state.active.to(dev)  # [B]
        self._ingest(state, live, kv_len)
        if not draft:  # an adaptive plain step: the KV is current, nothing is drafted
            return self._root_only(state.root_tokens.to(dev))
        committed = state.committed_len.to(dev)  # [B]
        sampling = state.sampling
        temperature = None if sampling is None else sampling.temperature
        key = None
        if self.sample:
            seed = sampling.seed if sampling is not None and sampling.seed is not None else torch.zeros_like(committed)
            key = seed.to(dev) ^ self.seed  # [B]
        root_logits = slots["root_logits"]
        ids = self._slots[:B]
        loop = dict(
            hidden=slots["ctx_hidden"][:B, None],  # [B, F_prev, d] outputs of the previous call's rows
            anc=self._no_ancestors.expand(B, 1, -1),  # [B, F_prev, W] (read only)
        )

        def expand(frontier: Frontier) -> Candidates:
            """The policy's call t: candidates [B, F_t, K_t] of the frontier nodes."""
            t = frontier.depth
            if t == 0:  # the root: its child distribution is already known
                return self._candidates(root_logits[:B, None], frontier.k, 0, key, committed, temperature)
            tokens = frontier.tokens  # [B, Fr] draft ids
            Fr = tokens.shape[1]
            first = self.row_offsets[t]
            lookup = self._lookup
            hidden, anc, write_index, q_len, key_len, positions, rows = self.depth_inputs(
                loop["hidden"], loop["anc"], frontier.parent_slot, tokens, self._own_bits[first : first + Fr],
                committed, live, self.cache.block_tables, first, t, self.cache.block_size, self.target_ids,
                None if lookup is None else lookup.weight,
            )  # anc [B, Fr, W]: ancestors + self; positions [B, Fr]: RoPE committed + t - 1
            embeds = rows if lookup is not None else self.embed(rows)  # [B, Fr, d]
            batch = AttentionBatch(slots=ids, cache_len=committed, q_len=q_len, write_index=write_index,
                                   tree_mask=anc, max_kv_len=kv_len, key_len=key_len)
            out, logits = self._forward(embeds, hidden, positions, self._attend(batch), first=False)
            loop.update(hidden=out, anc=anc)
            return self._candidates(logits, frontier.k, t, key, committed, temperature)

        grown = self.policy.grow(expand, B, dev)
        return self._draft_tree(state.root_tokens.to(dev), grown, live)

    def _root_only(self, root_tokens: torch.Tensor) -> DraftTree:
        """Root-only trees [B, N] without draft_probs (what an ingest-only `propose` returns;
        the plain step that asks for it reads nothing of it): no draft forward runs."""
        B = root_tokens.shape[0]
        no_drafts, no_parents, one = self._root_only_consts  # [1, N - 1], [1, N], [1]
        tokens = torch.cat([root_tokens[:, None], no_drafts.expand(B, -1)], 1)  # [B, N]
        return DraftTree(tokens=tokens, parents=no_parents.expand(B, -1), num_nodes=one.expand(B))

    def _draft_tree(self, root_tokens: torch.Tensor, grown, live: torch.Tensor) -> DraftTree:
        B = grown.tokens.shape[0]
        keep = live[:, None]  # [B, 1]; other slots get a root-only tree
        tokens, parents, num_nodes = self.tree_of(root_tokens, grown.tokens, grown.parents, grown.num_nodes, live,
                                                  self.target_ids)  # [B, N], [B, N], [B]
        draft_probs = None
        if self.samples_drafts:
            index = torch.cat([torch.zeros(B, 1, dtype=torch.int64, device=self.device), grown.dist_index], 1)  # [B, N]
            rows = torch.gather(grown.dists, 1, index.clamp(min=0)[..., None].expand(-1, -1, grown.dists.shape[-1]))
            rows = torch.where((index >= 0)[..., None] & keep[..., None], rows, 0.0)  # [B, N, Vd]
            draft_probs = self._full_probs(rows)  # [B, N, V] float32
        return DraftTree(tokens=tokens, parents=parents, num_nodes=num_nodes, draft_probs=draft_probs)
