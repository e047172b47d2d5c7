"""Hidden-state capture: one preallocated buffer of chosen layer outputs, real rows only.

Owns `CaptureBuffer` (layer set, sizing rule, row layout) and nothing about drafters.
Layer ids are layer OUTPUT indices (the seed's / TensorRT-LLM's convention): capturing
layer l stores what layer l returns (for our decoder, which adds the residual inside the
layer, that is already `hidden + residual`). HF's `output_hidden_states[l + 1]` is the
same value (except the last entry, which HF takes after the final norm).

Row layout of one forward with q_len [B]: row_offset = exclusive cumsum of q_len; token t
of row b (t < q_len[b]) goes to buffer row row_offset[b] + t; columns [i*d, (i+1)*d) hold
the i-th captured layer (ascending). Padding tokens are written to one hidden sink row past
`max_tokens`, so the write has a fixed shape and real rows are never touched by padding.
"""

from __future__ import annotations

import torch

from ..config import SpecConfig, resolve_capture_layers

__all__ = ["CaptureBuffer", "LayerTap", "capture_max_tokens", "capture_rows"]


def capture_max_tokens(config: SpecConfig, max_num_tokens: int | None = None, num_tree_slots: int | None = None) -> int:
    """Rows of the buffer (DESIGN.md): min(max_num_tokens, B * max_seq_len) + N * B.

    `max_num_tokens` (tokens per forward, e.g. a chunked-prefill budget) defaults to no cap;
    `num_tree_slots` (N, the drafter's) defaults to the config's bound.
    """
    b = config.cache.max_batch_size
    base = b * config.cache.max_seq_len
    if max_num_tokens is not None:
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens={max_num_tokens} must be >= 1 (or None for no cap)")
        base = min(max_num_tokens, base)
    return base + (config.shape.num_tree_slots if num_tree_slots is None else num_tree_slots) * b


def capture_rows(config: SpecConfig, num_tree_slots: int) -> int:
    """Rows of a target runner's buffer: the most tokens one forward captures (a prefill
    chunk, or every slot's tree of N = `num_tree_slots`), plus N * B; the one place this size
    is derived (`specdec.pipeline.Sizes.capture_rows` reads it)."""
    b = config.cache.max_batch_size
    return capture_max_tokens(config, max(config.schedule.prefill_chunk_size, b * num_tree_slots), num_tree_slots)


class CaptureBuffer:
    """Preallocated `[max_tokens, d * len(layers)]` store of captured layer outputs.

    Attributes:
        layers: layer OUTPUT indices, ascending.
        hidden_size: d.
        max_tokens: rows that can be written by one forward.
        buffer: [max_tokens, d * len(layers)] view of the storage (the sink row is hidden).
    """

    def __init__(self, layers, hidden_size: int, max_tokens: int, *, device=None, dtype=torch.float32):
        layers = tuple(int(x) for x in layers)
        if not layers:
            raise ValueError("CaptureBuffer needs at least one layer; with an empty capture set pass capture=None")
        if list(layers) != sorted(set(layers)):
            raise ValueError(f"layers={layers} must be ascending and distinct")
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        self.layers = layers
        self.hidden_size = hidden_size
        self.max_tokens = max_tokens
        self.column = {layer: i for i, layer in enumerate(layers)}  # layer -> column block
        # One extra row: the sink that padding tokens are written to.
        self._storage = torch.zeros(max_tokens + 1, hidden_size * len(layers), device=device, dtype=dtype)
        self.buffer = self._storage[:max_tokens]  # [max_tokens, d * n_capture]

    @classmethod
    def for_config(
        cls,
        config: SpecConfig,
        num_layers: int,
        hidden_size: int,
        *,
        device=None,
        dtype=torch.float32,
        max_num_tokens: int | None = None,
    ) -> "CaptureBuffer | None":
        """The buffer for `config.layers_to_capture` (None = EAGLE-3 default); None if the set is empty."""
        layers = resolve_capture_layers(num_layers, config.layers_to_capture)
        if not layers:
            return None
        return cls(layers, hidden_size, capture_max_tokens(config, max_num_tokens), device=device, dtype=dtype)

    def row_index(self, q_len: torch.Tensor, num_cols: int) -> torch.Tensor:
        """Buffer row of each (row, token) of one forward; padding goes to the sink row.

        Args:
            q_len: [B] int64, valid tokens per row.
            num_cols: T, the forward's token width (static).
        Returns:
            [B, T] int64 in [0, max_tokens] (max_tokens = sink).
        """
        if q_len.shape[0] * num_cols > self.max_tokens:
            raise ValueError(
                f"a forward of B*T={q_len.shape[0]}*{num_cols} tokens may exceed the capture buffer's "
                f"max_tokens={self.max_tokens}; size the buffer for this batch"
            )
        offset = torch.cumsum(q_len, 0) - q_len  # [B] exclusive cumsum
        t = torch.arange(num_cols, device=q_len.device)  # [T]
        rows = offset[:, None] + t[None, :]  # [B, T]
        return torch.where(t[None, :] < q_len[:, None], rows, torch.full_like(rows, self.max_tokens))

    def write(self, layer: int, hidden: torch.Tensor, row_index: torch.Tensor) -> None:
        """Store one layer's output (in place). hidden: [B, T, d]; row_index: [B, T] from `row_index`."""
        i = self.column[layer]
        d = self.hidden_size
        cols = self._storage[:, i * d : (i + 1) * d]  # [max_tokens + 1, d] view
        cols.index_copy_(0, row_index.reshape(-1), hidden.reshape(-1, d).to(cols.dtype))

    def gather(self, row_index: torch.Tensor) -> torch.Tensor:
        """Captured rows laid out like the forward: [B, T, d * n_capture] (padding reads the sink row)."""
        return self._storage[row_index]

    def rows(self, num_tokens: int) -> torch.Tensor:
        """The first `num_tokens` rows: [num_tokens, d * n_capture] (host-side helper)."""
        return self.buffer[:num_tokens]

    def layer_rows(self, layer: int, num_tokens: int) -> torch.Tensor:
        """One captured layer's rows: [num_tokens, d]."""
        i = self.column[layer]
        return self.buffer[:num_tokens, i * self.hidden_size : (i + 1) * self.hidden_size]


class LayerTap:
    """The captured layers of one forward, kept as they are: what a tree verify hands the
    drafter is [B, N, d * n_capture] laid out like the forward, which is the layers' outputs
    side by side, so the step's verify concatenates them in one launch instead of writing each
    into the `CaptureBuffer` and gathering the rows back (an exclusive cumsum and a row index
    computed twice, a copy per layer and a gather: ~18 launches per step, ~5% of a SmolLM2
    step on the H200). The model calls it as it calls a buffer (`row_index`, `column`, `write`).
    Padding rows hold the padding tokens' outputs (finite, unused: rows past a slot's nodes are
    undefined for drafters)."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.column = {layer: i for i, layer in enumerate(layers)}
        self._outputs: list[torch.Tensor | None] = [None] * len(layers)

    def row_index(self, q_len: torch.Tensor, num_cols: int) -> None:
        return None  # the outputs keep the forward's layout

    def write(self, layer: int, hidden: torch.Tensor, row_index: None) -> None:
        self._outputs[self.column[layer]] = hidden  # [B, T, d]

    def stacked(self) -> torch.Tensor:
        """[B, T, d * n_capture]: the captured layers' outputs, ascending, side by side."""
        missing = [layer for layer, i in self.column.items() if self._outputs[i] is None]
        if missing:
            raise RuntimeError(f"the forward wrote no output for captured layers {missing}")
        return torch.cat(self._outputs, dim=-1)
