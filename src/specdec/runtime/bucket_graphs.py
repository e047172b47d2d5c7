"""Prefill forwards per padded (requests, length) bucket, run from static buffers and (on CUDA)
captured in a graph each.

Why: a prompt's prefill runs once per request, at a length no step shape shares, so it ran
eagerly, and on a small target at batch 1 its ~300 Python-dispatched pieces (compiled
pointwise pieces, Triton custom ops, linears) cost more than the whole decode of a short
answer (SmolLM2 on the H200: 47.6 ms per request against ~1.1 ms per step). Padding a
group of chunks to a fixed (rows, length) bucket gives a handful of static shapes; each
bucket's forward reads its inputs from buffers that outlive it, so one CUDA graph per
bucket replays any group that fits, in one launch.

`BucketGraphs` owns the buckets and graphs; `PaddedChunks` the static inputs of a group of
chunks from position 0 (its padding rows repeat row 0, so they recompute row 0 and write
the same K/V and states: nothing needs masking). The owner (the target runner, a draft
head) fills them, calls `run(key)` and copies out what it keeps before the next run
(outputs are the graph's static tensors). Without capture (CPU, or graphs off) `run` calls
the forward directly on the same padded buffers, so the padding logic is the same code on
every device and tested on the CPU.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn.utils.rnn import pad_sequence

from .host_copy import to_device

__all__ = ["BucketGraphs", "PaddedChunks", "bucket_grid", "capture_graph", "length_buckets", "row_buckets"]

SMALLEST = 16  # the smallest bucket: shorter chunks pad to it (launch-bound there: free)
DOUBLING_UNTIL = 128  # powers of two up to here, then steps of this size (padding <= 128 rows)


def length_buckets(max_len: int) -> tuple[int, ...]:
    """Padded lengths 16, 32, 64, 128, then every multiple of 128, up to `max_len` (always last).

    Doubling while a forward is bound by launches (padding is free there), then fixed steps so
    a long chunk never pads by more than 128 rows of compute."""
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    buckets, n = [], SMALLEST
    while n < max_len:
        buckets.append(n)
        n = n * 2 if n < DOUBLING_UNTIL else n + DOUBLING_UNTIL
    buckets.append(max_len)
    return tuple(buckets)


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """Padded request counts 1, 2, 4, ... up to `max_rows` (always last)."""
    if max_rows < 1:
        raise ValueError(f"max_rows={max_rows} must be >= 1")
    rows = [1 << i for i in range(max_rows.bit_length()) if 1 << i < max_rows]
    return tuple(rows) + (max_rows,)


def bucket_grid(max_rows: int, max_len: int, max_tokens: int) -> tuple[tuple[int, int], ...]:
    """(rows, length) buckets with rows * length <= max_tokens (a grouped prefill's budget),
    ascending; length buckets from `length_buckets(max_len)`."""
    keys = [(r, T) for r in row_buckets(max_rows) for T in length_buckets(max_len) if r * T <= max_tokens]
    if not keys:
        raise ValueError(f"no bucket fits max_tokens={max_tokens} (the smallest is 1 x {length_buckets(max_len)[0]})")
    return tuple(keys)


def capture_graph(run: Callable[[], Any], device: torch.device, pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`run()` captured in a CUDA graph (memory from `pool`): run twice first on a side stream,
    so compilation, autotuning and allocations happen outside the capture. Returns the graph
    and the captured run's outputs (its static tensors)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph, outputs


class BucketGraphs:
    """`forward((rows, length))` per bucket, replayed from a CUDA graph once `capture` has run.

    Args:
        forward: `forward(key) -> outputs` (a tensor or a tuple of tensors / None); reads the
            owner's static input buffers and must be shape-static for a given key (no host sync).
        keys: the (rows, length) buckets (`bucket_grid`).
    """

    def __init__(self, forward: Callable[[tuple[int, int]], Any], keys: tuple[tuple[int, int], ...]):
        if not keys or len(set(keys)) != len(keys) or min(min(k) for k in keys) < 1:
            raise ValueError(f"keys={keys} must be distinct (rows, length) pairs >= 1")
        self.forward = forward
        self.keys = tuple(sorted(keys))
        self._key_set = frozenset(keys)
        self.rows = tuple(sorted({r for r, _ in keys}))
        self.lengths = tuple(sorted({T for _, T in keys}))
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], Any] = {}

    def bucket(self, rows: int, length: int) -> tuple[int, int] | None:
        """The bucket of `rows` chunks of at most `length` tokens: the smallest row and length
        buckets that hold them, or None when that pair is not a bucket (over the token budget,
        or beyond the largest rows / length: run eagerly)."""
        if rows < 1 or length < 1:
            raise ValueError(f"rows={rows} and length={length} must be >= 1")
        r = next((b for b in self.rows if b >= rows), None)
        T = next((b for b in self.lengths if b >= length), None)
        return (r, T) if (r, T) in self._key_set else None

    def key_for(self, lengths: list[int], starts: list[int]) -> tuple[int, int] | None:
        """The bucket of chunks of `lengths` tokens at positions `starts`, or None: chunks that
        continue a prompt (a start > 0) and groups without a bucket run eagerly."""
        return None if any(starts) else self.bucket(len(lengths), max(lengths))

    def capture(self, device: torch.device, pool=None) -> int:
        """Capture one CUDA graph per bucket, largest first (smaller ones reuse its memory from
        `pool`, a `torch.cuda.graph_pool_handle()`; a new pool if None). Returns the count."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        for key in sorted(self.keys, key=lambda k: (k[0] * k[1], k), reverse=True):
            self.graphs[key], self.outputs[key] = capture_graph(lambda key=key: self.forward(key), device, pool)
        return len(self.graphs)

    def run(self, key: tuple[int, int]) -> Any:
        """The forward of bucket `key` on the current contents of the owner's buffers: a graph
        replay when captured (outputs: the graph's static tensors, overwritten by the next
        run), else the forward itself."""
        if key not in self.keys:
            raise ValueError(f"key={key} is not a bucket; allowed: {list(self.keys)}")
        graph = self.graphs.get(key)
        if graph is None:
            return self.forward(key)
        graph.replay()
        return self.outputs[key]


class PaddedChunks:
    """Static inputs of a bucketed prefill: up to `max_rows` chunks, each from position 0 of
    its slot, rows x length within `max_tokens`, with `width` columns of per-token states (0:
    none). Tokens and states live in flat buffers of `max_tokens` rows that each bucket views
    as [R, T] (a [max_rows, max_len, width] buffer would be 64x larger at batch 64: 805 MB of
    EAGLE-3 states on the 8B shape)."""

    def __init__(self, max_rows: int, max_tokens: int, device, *, width: int = 0, dtype=None):
        self._tokens = torch.zeros(max_tokens, dtype=torch.int64, device=device)  # [max_tokens]
        self._states = torch.zeros(max_tokens, width, dtype=dtype, device=device) if width else None  # [max_tokens, w]
        self.slots = torch.zeros(max_rows, dtype=torch.int64, device=device)  # [R]
        self.q_len = torch.ones(max_rows, dtype=torch.int64, device=device)  # [R] real tokens
        self.starts = torch.zeros(max_rows, dtype=torch.int64, device=device)  # [R] always 0

    def tokens(self, key: tuple[int, int]) -> torch.Tensor:
        """[R, T] int64 view of bucket (R, T)."""
        R, T = key
        return self._tokens[: R * T].view(R, T)

    def states(self, key: tuple[int, int]) -> torch.Tensor:
        """[R, T, w] view of bucket (R, T)."""
        R, T = key
        return self._states[: R * T].view(R, T, -1)

    def fill(self, key: tuple[int, int], slots: list[int], chunks: list[torch.Tensor],
             states: list[torch.Tensor] | None = None) -> None:
        """Rows 0..n-1 of bucket `key` <- the n chunks (and their states), rows n..R-1 <- row 0
        again; columns past a chunk keep whatever they held (padding: any valid id)."""
        R = key[0]
        order = list(range(len(chunks))) + [0] * (R - len(chunks))
        tokens = pad_sequence([chunks[i] for i in order], batch_first=True)  # [R, T_max]
        self.tokens(key)[:, : tokens.shape[1]].copy_(tokens)
        slots_q_len = to_device([[slots[i] for i in order], [chunks[i].shape[0] for i in order]], self.slots.device)  # [2, R]
        self.slots[:R].copy_(slots_q_len[0])
        self.q_len[:R].copy_(slots_q_len[1])
        if states is not None:
            padded = pad_sequence([states[i] for i in order], batch_first=True)  # [R, T_max, w]
            self.states(key)[:, : padded.shape[1]].copy_(padded)
