"""A request that stops making progress fails with an error that names it; it never hangs.

Every engine iteration gives each running request at least one token (the bonus token of
its step) and advances the oldest prefilling requests by a chunk, so a request that holds a
slot and stays unchanged for a few iterations can only be an engine bug (a slot left out of
the step's bucket, a hand-off that skips a row, a prefill that never finishes). Without a
bound, `generate` would loop forever on it; with this one, that request ends with
`finish_reason="error"` and a message naming its id and slot, and everything else goes on.

Bounds, in engine iterations without any change to the request (status, tokens, prefilled
positions, slot): a running request 3; a prefilling one the longest wait a correct engine
can give it, every older slot prefilling a whole `max_seq_len` one `prefill_chunk_size`
chunk at a time (plus 3); and a queue whose head stays the same, not admitted, while no
request holds a slot (nothing will ever free one) 3. (Requests that finish in the iteration
that admits them, e.g. `max_new_tokens=1`, leave every slot free at each check while the
queue drains: the head changes, so that is progress.)

The scan runs every `CHECK_EVERY` iterations, not every one: it visits every slot, and the
engine's host work between two steps is on the critical path (at batch 64 the scan was ~20 us of
a ~180 us iteration on a 2-core CPU, ~3x that on the H200's host). A change is dated at the
scan that sees it, so a stall is reported at most CHECK_EVERY - 1 iterations after its bound.
"""

from __future__ import annotations

import math

from ..config import SpecConfig
from .request import PREFILLING, RUNNING, RequestState

__all__ = ["ProgressWatchdog"]

RUNNING_LIMIT = 3
CHECK_EVERY = 3  # iterations between two scans


class ProgressWatchdog:
    """`check(slots, waiting)` once per engine iteration -> [(request, why)] to fail now."""

    def __init__(self, config: SpecConfig) -> None:
        chunks = math.ceil(config.cache.max_seq_len / config.schedule.prefill_chunk_size)
        self.limits = {RUNNING: RUNNING_LIMIT, PREFILLING: config.cache.max_batch_size * chunks + 3}
        self.iteration = 0
        self._marks: dict[int, tuple[tuple, int]] = {}  # request id -> (its state, iteration it last changed)
        self._idle_head: tuple[int, int] | None = None  # (queue head's id, iteration it was first seen idle)

    def check(self, slots: list[RequestState | None], waiting) -> list[tuple[RequestState, str]]:
        self.iteration += 1
        if self.iteration % CHECK_EVERY:
            return []
        stalled = []
        limits, marks, iteration = self.limits, self._marks, self.iteration
        holders = [r for r in slots if r is not None and r.status in limits]
        for r in holders:
            mark = (r.status, len(r.token_ids), r.prefilled, r.slot)
            seen = marks.get(r.id)
            if seen is None or seen[0] != mark:
                marks[r.id] = (mark, iteration)
                continue
            limit = limits[r.status]
            if iteration - seen[1] >= limit:
                stalled.append((r, f"request {r.id} in slot {r.slot} made no progress in {limit} engine iterations "
                                   f"({r.status}, {len(r.token_ids)} tokens, {r.prefilled} prompt positions prefilled); "
                                   "failed instead of hanging (an engine bug)"))
        if len(marks) > len(holders):  # some request left: drop its mark (every holder has one now)
            live = {r.id for r in holders}
            self._marks = {k: v for k, v in marks.items() if k in live}
        if waiting and not any(r is not None for r in slots):
            head = waiting[0]
            if self._idle_head is None or self._idle_head[0] != head.id:
                self._idle_head = (head.id, self.iteration)
            elif self.iteration - self._idle_head[1] >= RUNNING_LIMIT:
                stalled.append((head, f"request {head.id} waits for admission while no request holds a slot "
                                      f"(every slot free for {RUNNING_LIMIT} engine iterations); failed instead of "
                                      "hanging (an engine bug)"))
        else:
            self._idle_head = None
        return stalled
