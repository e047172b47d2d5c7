"""One forward per padded length bucket, run from static buffers and (on CUDA) captured in a graph.

Why: a prompt's prefill runs once per request, at a length no step shape shares, so it ran
eagerly, and on a small target at batch 1 its ~300 Python-dispatched pieces (compiled
pointwise pieces, Triton custom ops, linears) cost more than the whole decode of a short
answer (SmolLM2 on the H200: ~45 ms of host time per request against ~1.2 ms per step).
Padding the chunk to a fixed length bucket gives a handful of static shapes; each bucket's
forward reads its inputs from buffers that outlive it, so one CUDA graph per bucket replays
any chunk that fits, in one launch.

`BucketGraphs` owns the buckets and graphs, not the buffers: its owner (the target runner,
a draft head) fills its own static inputs, calls `run(bucket)` and copies out what it keeps
before the next run (outputs are the graph's static tensors). Without capture (CPU, or
graphs off) `run` calls the forward directly on the same padded buffers, so the padding
logic is the same code on every device and tested on the CPU.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["BucketGraphs", "length_buckets"]

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


class BucketGraphs:
    """`forward(bucket)` per bucket, replayed from a CUDA graph once `capture` has run.

    Args:
        forward: `forward(T) -> outputs` (a tensor or a tuple of tensors / None); reads the
            owner's static input buffers and must be shape-static for a given T (no host sync).
        buckets: ascending padded lengths (`length_buckets`).
    """

    def __init__(self, forward: Callable[[int], Any], buckets: tuple[int, ...]):
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets={buckets} must be ascending, distinct and >= 1")
        self.forward = forward
        self.buckets = tuple(buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, Any] = {}

    @property
    def max_len(self) -> int:
        return self.buckets[-1]

    def bucket(self, length: int) -> int:
        """The smallest bucket that holds `length` rows (1 <= length <= max_len)."""
        if not 1 <= length <= self.max_len:
            raise ValueError(f"length={length} is out of range; allowed: [1, {self.max_len}]")
        return next(b for b in self.buckets if b >= length)

    def capture(self, device: torch.device, pool=None) -> int:
        """Capture one CUDA graph per bucket, largest first (smaller ones reuse its memory from
        `pool`, a `torch.cuda.graph_pool_handle()`; a new pool if None). Returns the count."""
        pool = torch.cuda.graph_pool_handle() if pool is None else pool
        for T in sorted(self.buckets, reverse=True):
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile, autotune and allocate outside the capture
                    self.forward(T)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[T] = self.forward(T)
            self.graphs[T] = graph
        return len(self.graphs)

    def run(self, T: int) -> Any:
        """The forward of bucket T on the current contents of the owner's buffers: a graph
        replay when captured (outputs: the graph's static tensors, overwritten by the next
        run), else the forward itself."""
        if T not in self.buckets:
            raise ValueError(f"T={T} is not a bucket; allowed: {list(self.buckets)}")
        graph = self.graphs.get(T)
        if graph is None:
            return self.forward(T)
        graph.replay()
        return self.outputs[T]
