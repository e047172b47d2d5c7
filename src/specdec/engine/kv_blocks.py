"""KV blocks ahead of need: every running request's next steps are backed before a step is
launched (`config.schedule.kv_lookahead_steps` steps ahead, one asynchronous copy of the block tables,
never inside the device step). A pool that runs short is not a failure: the youngest running
request is preempted (its KV dropped, recomputed when it is admitted again), and every request
still ends with exactly its solo output.

A mixin of `SpecEngine`: it reads the engine's `runner`, `scheduler`, `lookahead`, `_backed`
and the step in flight, and calls its `_release`.
"""

from __future__ import annotations

from ..runtime.kv_cache import KVCacheError
from .request import RUNNING, RequestState

__all__ = ["KVBlocks"]


class KVBlocks:
    """Reservation ahead of need and preemption (mixin)."""

    def _reserve_ahead(self) -> None:
        """Back every running request's next steps; on a short pool, preempt the youngest.
        Most steps need no new block: `_backed[slot]` (the positions known to be backed, a
        lower bound, since a slot keeps its blocks until its request leaves) skips the
        allocator for them (batch 64, nothing to grow: 14 us a step against 34 asking it for
        every request, 2-core CPU)."""
        ahead = self.lookahead * (1 + self.config.schedule.kv_lookahead_steps)
        reach = self.lookahead * (2 if self._inflight is not None else 1)  # a step in flight advances up to N
        backed = self._backed
        short = [r for r in self.running() if backed[r.slot] < min(r.committed + reach, r.max_positions)]
        for r in sorted(short, key=lambda r: r.admitted):  # the oldest are served first
            if r.status != RUNNING:
                continue  # preempted for an older request in this loop
            need = min(r.committed + reach, r.max_positions)
            if self.runner.capacity(r.slot) < need:
                self._grow(r, need, ahead)
            self._backed[r.slot] = self.runner.capacity(r.slot)
        self.runner.flush()

    def _grow(self, r: RequestState, need: int, ahead: int) -> None:
        """Back `need` positions of `r` (`ahead` if the pool allows), preempting the youngest
        other requests while the pool is short."""
        for target in (min(r.committed + ahead, r.max_positions), need):
            try:
                self.runner.reserve(r.slot, target, flush=False)
                return
            except KVCacheError:
                continue
        while self.runner.capacity(r.slot) < need:
            victim = self.scheduler.victim(r)
            if victim is None:  # cannot happen: submit() refuses requests larger than the pool
                raise KVCacheError(f"request {r.id} cannot grow to {need} positions with the pool empty")
            self._preempt(victim)
            try:
                self.runner.reserve(r.slot, need, flush=False)
            except KVCacheError:
                pass

    def _preempt(self, request: RequestState) -> None:
        """Drop `request`'s KV and slot; it waits at the front of the queue and resumes later."""
        self._release(request)
        self.scheduler.requeue(request)

    def _back_prompt(self, request: RequestState, slot: int) -> bool:
        """Back `request`'s prompt and its first steps in `slot` (admission); False, with nothing
        held, when the pool cannot back even the prompt and one step now."""
        L = len(request.prefill_tokens)
        ahead = self.lookahead * (1 + self.config.schedule.kv_lookahead_steps)
        try:
            self.runner.reserve(slot, min(L + ahead, request.max_positions))
        except KVCacheError:
            try:  # at least what the prompt and its first step need
                self.runner.reserve(slot, min(L + self.lookahead, request.max_positions))
            except KVCacheError:
                self.runner.free(slot)
                return False
        return True
