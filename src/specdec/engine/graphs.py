"""Warm-up and CUDA-graph capture per batch bucket, and the step timings the adaptive rule
starts from.

`warmup()` runs every batch bucket's step once (and short prefills), so compiled pieces are
compiled before the first request; with graphs on it captures one CUDA graph per (bucket,
step variant) and one per padded prefill bucket; with `adaptive`, it times each variant per
bucket. `_run_step` is the one way a step runs without a graph: its eager (or piecewise
compiled) pieces, or the whole step compiled as one graph per (bucket, variant).

A mixin of `SpecEngine`: it reads the engine's `config`, `runner`, `strategies`, `state`,
`steps`, `buckets` and graph tables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..compile_scope import compile_private
from ..runtime.bucket_graphs import capture_graph
from .prefill import _drafter_prefill, use_prefill_buckets
from .step import DeviceStep
from .step_timing import PhaseTimer

__all__ = ["Graphs", "WarmupReport"]


@dataclass
class WarmupReport:
    """What `SpecEngine.warmup` did: seconds spent, the batch buckets run, graphs captured."""

    seconds: float
    buckets: tuple[int, ...]
    graphs: int
    prefill_graphs: int = 0  # target and drafter prefill graphs, one per (requests, length) bucket


class Graphs:
    """Warm-up, capture and the graph-less step (mixin)."""

    def _variants(self) -> tuple[str, ...]:
        """The steps this engine runs: speculative, and when adaptive the plain ones."""
        return tuple(self.steps)

    def _step_fn(self, variant: str) -> DeviceStep:
        return self.steps[variant]

    def _run_step(self, b: int, variant: str, kv_len: int | None = None, timer: PhaseTimer | None = None) -> None:
        """Run `variant` on bucket `b` now (eager pieces, or the whole step compiled); kv_len:
        the static key bound, None = the live slots' reach (`_kv_len_bound`); timer: mark the
        phase boundaries (runs the step eagerly)."""
        step = self._step_fn(variant)
        if not self.compile_step or timer is not None:  # phase timing needs the boundaries
            step(self.state.rows(b), self._kv_len_bound(b) if kv_len is None else kv_len, timer)
            return
        fn = self._compiled_steps.get((b, variant))
        if fn is None:  # a private graph per (bucket, variant): no shared recompile budget
            fn = self._compiled_steps[(b, variant)] = compile_private(DeviceStep.__call__, fullgraph=True, dynamic=False)
        # a static key bound: one graph per bucket, whatever the contexts (the attention reads
        # each row's real key count on the device, so the bound costs little)
        # under no_grad, not inference mode: AOT autograd cannot functionalize in-place updates
        # traced under inference mode ("Cannot set version_counter for inference tensor")
        with torch.inference_mode(False), torch.no_grad():
            fn(step, self.state.rows(b), self.config.cache.max_seq_len)

    def warmup(self, *, progress: bool = False) -> WarmupReport:
        """Run every batch bucket's step once (and a 1- and a 2-token prefill), so compiled
        pieces are compiled now, then capture one CUDA graph per bucket (and per step variant
        when adaptive) when graphs are on; with `adaptive`, time each variant per bucket (the
        cost model).

        Needs an idle engine (no live request): the runs see only idle slots, which write
        nothing that a request reads.
        """
        if self.has_work():
            raise RuntimeError("warmup() needs an idle engine; call it before admitting requests")
        t0 = time.perf_counter()
        with torch.inference_mode():
            self._warm_prefill()
            if self.cuda_graphs:
                self._capture_prefills()
            buckets = sorted(self.buckets, reverse=True)  # largest first: smaller graphs reuse its pool
            jobs = [(b, v) for b in buckets for v in self._variants()]
            bar = _progress(jobs, progress, "warmup")
            pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
            for b, variant in bar:
                if self.cuda_graphs:
                    self._capture(b, variant, pool)
                else:
                    self._run_step(b, variant)
            if self.adaptive:
                for b, variant in jobs:
                    self.adaptive_rule.costs.record(b, variant, self._time_step(b, variant))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.warmed = True
        return WarmupReport(time.perf_counter() - t0, tuple(sorted(self.buckets)), len(self.graphs),
                            self.prefill_graph_count)

    def _time_step(self, b: int, variant: str, repeats: int = 5) -> list[float]:
        """Seconds of one step of bucket `b` (idle slots: the shapes, hence the cost, of a full bucket)."""
        samples = []
        for _ in range(repeats):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            if self.cuda_graphs:
                self.graphs[(b, variant)].replay()
            else:
                self._run_step(b, variant)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            samples.append(time.perf_counter() - t0)
        return samples

    def _warm_prefill(self) -> None:
        """Prefill 2 tokens, then 1, into slot 0, and a group of two chunks into slots 0 and 1,
        and forget them (compiles the prefill shapes)."""
        drafter = self.strategies.drafter
        for n in (2, 1):
            self.runner.reserve(0, n + self.lookahead)
            tokens = torch.zeros(n, dtype=torch.int64, device=self.device)
            _, hidden = self.runner.prefill(0, tokens, 0)
            _drafter_prefill(drafter, 0, tokens, hidden, 0)
            drafter.reset_slot(0)
            self.runner.free(0)
        if hasattr(self.runner, "prefill_many") and self.config.cache.max_batch_size >= 2:  # a grouped prefill too
            for slot in (0, 1):
                self.runner.reserve(slot, 2 + self.lookahead)
            chunks = [torch.zeros(n, dtype=torch.int64, device=self.device) for n in (2, 1)]
            _, hidden = self.runner.prefill_many([0, 1], chunks, [0, 0])
            if hidden is not None and hasattr(drafter, "prefill_many"):
                drafter.prefill_many([0, 1], chunks, hidden, [0, 0])
            for slot in (0, 1):
                drafter.reset_slot(slot)
                self.runner.free(slot)

    def _capture_prefills(self) -> None:
        """One CUDA graph per (requests, length) bucket for the target's and the drafter's
        prefill of chunks from position 0 (`use_prefill_buckets`; a part without it stays
        eager), in a pool of their own. At batch 1 the eager prefill cost more host time than the steps of
        a short answer."""
        self.prefill_graph_count += use_prefill_buckets(self.runner, self.strategies.drafter, self.config,
                                                        capture=True, pool=torch.cuda.graph_pool_handle())

    def _capture(self, b: int, variant: str, pool) -> None:
        kv_len = self.config.cache.max_seq_len
        self.graphs[(b, variant)], _ = capture_graph(lambda: self._run_step(b, variant, kv_len), self.device, pool)
        self.capture_count += 1


def _progress(items, show: bool, desc: str):
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="bucket")