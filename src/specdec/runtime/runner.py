"""`ModelRunner`: the engine's `TargetRunner` for a loaded `DecoderLM`.

Owns the target's paged KV cache (whose allocator a draft head's KV shares) and capture
buffer, and turns the engine's requests (prefill one prompt chunk; verify every slot's tree)
into model forwards with the right attention metadata. It knows nothing about drafting or
acceptance.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig
from ..models.capture import CaptureBuffer, LayerTap, capture_rows
from ..types import TreeMeta
from .batch import prefill_batch, tree_batch
from .bucket_graphs import BucketGraphs, PaddedChunks, bucket_grid
from .host_copy import to_device

__all__ = ["ModelRunner"]


class ModelRunner:
    """Runs prefill and tree-verify forwards of one target over its own paged KV cache.

    Args:
        target: a `specdec.models.Target`.
        config: capacities (slots, max_seq_len, KV blocks, prefill chunk).
        capture_layers: target layer outputs to capture; () allocates no capture buffer.
        num_tree_slots: N, the tree width of every verify forward.
        keep_last_hidden: return the last hidden state (after the final norm) as the drafter's
            state when no layer is captured (MTP-style drafters).
    """

    def __init__(
        self,
        target,
        config: SpecConfig,
        capture_layers: tuple[int, ...],
        num_tree_slots: int,
        *,
        keep_last_hidden: bool = False,
    ):
        if capture_layers and keep_last_hidden:
            raise ValueError("a drafter reads either captured layers or the last hidden state, not both")
        self.keep_last_hidden = keep_last_hidden
        self.model = target.model
        self.info = target.info
        self.config = config
        self.num_tree_slots = num_tree_slots
        self.cache = self.model.make_cache(config)
        p = next(self.model.parameters())
        self.device, self.dtype = p.device, p.dtype
        # rows one forward may capture: a prefill chunk, or every slot's tree
        max_tokens = capture_rows(config, num_tree_slots)
        self.capture = (
            CaptureBuffer(capture_layers, self.info.hidden_size, max_tokens, device=p.device, dtype=p.dtype)
            if capture_layers
            else None
        )
        self.hidden_width = (
            self.capture.buffer.shape[1] if self.capture is not None else self.info.hidden_size if keep_last_hidden else 0
        )
        self.prefill_buckets: BucketGraphs | None = None  # `use_prefill_buckets`

    # ------------------------------------------------------------------ blocks (host side)
    def reserve(self, slot: int, num_tokens: int, *, flush: bool = True) -> None:
        self.cache.reserve(slot, num_tokens, flush=flush)

    def free(self, slot: int) -> None:
        self.cache.free(slot)

    def flush(self) -> None:
        """Copy changed block tables to the device (asynchronous; before the next forward)."""
        self.cache.flush()

    def capacity(self, slot: int) -> int:
        return self.cache.capacity(slot)

    @property
    def model_context(self) -> int | None:
        """The positions the model was built for (`max_position_embeddings`), or None."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def pool_positions(self) -> int:
        """Logical positions the whole KV pool can back (num_blocks * block_size)."""
        return self.cache.num_blocks * self.cache.block_size

    # ------------------------------------------------------------------ forwards
    @torch.inference_mode()
    def prefill(self, slot: int, tokens: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One prompt chunk of `slot`: tokens [T] int64 at positions start..start+T-1 (earlier
        chunks are in the cache).

        Returns (logits of the chunk's last token [V] float32, the drafter's target states
        [T, width] (captured layers or the last hidden state) or None).
        """
        logits, hidden = self.prefill_many([slot], [tokens], [start])
        return logits[0], None if hidden is None else hidden[0]

    @torch.inference_mode()
    def prefill_many(
        self, slots: list[int], chunks: list[torch.Tensor], starts: list[int]
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Prompt chunks of several slots in one forward: row i is `chunks[i]` [T_i] int64 at
        positions starts[i]..starts[i]+T_i-1 of `slots[i]`, padded to max T_i (padding writes
        no KV). One forward instead of one per request: a prefill's cost on a GPU is mostly
        launches, so requests admitted together share them.

        Returns (logits of each chunk's last token [n, V] float32, each chunk's drafter states
        [T_i, width], or None).
        """
        lengths = [c.shape[0] for c in chunks]
        key = None if self.prefill_buckets is None else self.prefill_buckets.key_for(lengths, starts)
        if key is not None:
            return self._bucket_prefill(key, slots, chunks)
        dev = chunks[0].device
        T = max(lengths)
        tokens = torch.nn.utils.rnn.pad_sequence(chunks, batch_first=True)  # [n, T], padded with 0
        slots_starts_q_len = to_device([slots, starts, lengths], dev)  # [3, n]: one copy
        q_len = slots_starts_q_len[2]  # [n]
        batch = prefill_batch(
            self.cache, slots_starts_q_len[0], slots_starts_q_len[1], q_len, T,
            max_kv_len=max(s + n for s, n in zip(starts, lengths)),
        )
        out = self.model(tokens, batch.positions, self.cache, batch, capture=self.capture, logits_index=(q_len - 1)[:, None])
        return out.logits[:, 0], self._chunk_states(lengths, out.last_hidden)

    # ------------------------------------------------------------------ prefill buckets
    def use_prefill_buckets(self, max_len: int, *, capture: bool, pool=None, max_rows: int = 1) -> int:
        """Run prefill forwards whose chunks all start at position 0 through padded (rows,
        length) buckets (`runtime.bucket_graphs`): up to `max_rows` chunks of up to `max_len`
        tokens, rows x length within `prefill_chunk_size`; one CUDA graph each when `capture`
        (`pool`: their `torch.cuda.graph_pool_handle()`). Returns graphs captured.

        Why: a prompt's eager prefill cost more host time than the decode of a short answer
        (SmolLM2, batch 1: 47.6 ms against 7.5 replayed); chunks that continue a long prompt,
        and groups without a bucket, stay eager.
        """
        cap = min(self.config.cache.max_seq_len, self.config.schedule.prefill_chunk_size)  # the capture buffer holds a chunk
        if not 1 <= max_len <= cap:
            raise ValueError(f"max_len={max_len} is out of range; allowed: [1, {cap}] (max_seq_len "
                             f"{self.config.cache.max_seq_len}, prefill_chunk_size {self.config.schedule.prefill_chunk_size})")
        if not 1 <= max_rows <= self.config.cache.max_batch_size:
            raise ValueError(f"max_rows={max_rows} is out of range; allowed: [1, max_batch_size={self.config.cache.max_batch_size}]")
        budget = self.config.schedule.prefill_chunk_size
        self._chunks = PaddedChunks(max_rows, budget, self.device)
        keys = bucket_grid(max_rows, max_len, budget)
        self.prefill_buckets = BucketGraphs(self._bucket_forward, keys)
        return self.prefill_buckets.capture(self.device, pool) if capture else 0

    def _bucket_forward(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prefill of bucket (R, T) from the static inputs: (last-token logits [R, V]
        float32, last hidden [R, T, d] or None). Padding tokens write no KV and capture to the
        sink row; padding rows repeat row 0."""
        R, T = key
        c = self._chunks
        q_len = c.q_len[:R]
        batch = prefill_batch(self.cache, c.slots[:R], c.starts[:R], q_len, T, max_kv_len=T)
        out = self.model(c.tokens(key), batch.positions, self.cache, batch, capture=self.capture,
                         logits_index=(q_len - 1)[:, None])
        return out.logits[:, 0], out.last_hidden if self.keep_last_hidden else None

    def _bucket_prefill(self, key, slots: list[int], chunks: list[torch.Tensor]):
        """`prefill_many` through bucket `key` (outputs copied out: the next run overwrites them)."""
        self._chunks.fill(key, slots, chunks)
        logits, last_hidden = self.prefill_buckets.run(key)
        return logits[: len(chunks)].clone(), self._chunk_states([c.shape[0] for c in chunks], last_hidden)

    def _chunk_states(self, lengths: list[int], last_hidden: torch.Tensor) -> list[torch.Tensor] | None:
        """Each chunk's drafter states [T_i, width], copied out of the forward's buffers
        (captured rows are packed row after row, `CaptureBuffer.row_index`; a bucket's padding
        rows come after the real ones), or None."""
        if self.capture is not None:
            return list(self.capture.rows(sum(lengths)).clone().split(lengths))
        if self.keep_last_hidden:
            return [last_hidden[i, :n].clone() for i, n in enumerate(lengths)]
        return None

    @torch.no_grad()  # not inference_mode: the whole step may be traced by torch.compile, which cannot
    # functionalize views inside an inference-mode region ("Cannot set version_counter for inference tensor")
    def verify(
        self,
        tokens: torch.Tensor,
        tree: TreeMeta,
        committed_len: torch.Tensor,
        num_nodes: torch.Tensor,
        kv_len: int | None = None,
        capture: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, N] -> (logits [B, N, V] float32, drafter states [B, N, width] or None).

        Row b is request slot b (B = the step's batch bucket). kv_len: static bound on
        committed_len + N over active slots (keys to scan); None = max_seq_len. capture=False:
        no drafter states (None; a step no drafter reads).
        """
        batch = tree_batch(self.cache, committed_len, tree, num_nodes, max_kv_len=kv_len)
        tap = None if self.capture is None or not capture else LayerTap(self.capture.layers)  # no buffer round trip
        out = self.model(tokens, batch.positions, self.cache, batch, capture=tap)
        hidden = None
        if tap is not None:
            hidden = tap.stacked()  # [B, N, d*nc]; padding rows unused
        elif self.keep_last_hidden and capture:
            hidden = out.last_hidden  # [B, N, d]
        return out.logits, hidden
