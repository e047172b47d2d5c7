"""Who runs where and when: the request queue, slots, admission order, prefill groups and
preemption victims. Plain Python over `RequestState` records (no torch), so every rule here
is unit-tested without a model (`tests/engine/test_scheduler.py`); the engine asks it and does the
device work (KV blocks, forwards) itself.

Rules:
- admission: the oldest waiting request takes the lowest free slot (live slots stay packed at
  the front, so the batch bucket stays small), if the engine can back its prompt with KV
  blocks; otherwise it and everyone behind it wait;
- a prefill group: the oldest prefilling request, then each younger one whose next chunk,
  padded to the group's longest, still fits one forward of `budget` tokens (and one padded
  prefill bucket, when prefills replay bucket graphs);
- preemption: the youngest running request (the last admitted) gives its slot back first and
  waits at the front of the queue;
- a step's batch bucket: the smallest bucket above the highest running slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from .request import PREFILLING, RUNNING, WAITING, RequestState

__all__ = ["PrefillBuckets", "Scheduler", "bucket_holding"]


class PrefillBuckets(Protocol):
    """The padded (rows, length) prefill buckets of a runner (`runtime.bucket_graphs`)."""

    def bucket(self, rows: int, length: int) -> object | None:
        """The bucket holding `rows` chunks of up to `length` tokens, or None."""


class Scheduler:
    """The queue and the slots of `num_slots` concurrent requests."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots}: a scheduler needs at least one slot")
        self.slots: list[RequestState | None] = [None] * num_slots  # the request holding each slot
        self.waiting: deque[RequestState] = deque()  # submitted, not admitted (oldest first)
        self._admissions = 0  # admission counter: `request.admitted`, the age order of running requests

    # ------------------------------------------------------------------ views
    def free_slots(self) -> list[int]:
        return [s for s, r in enumerate(self.slots) if r is None]

    def running(self) -> list[RequestState]:
        return [r for r in self.slots if r is not None and r.status == RUNNING]

    def prefilling(self) -> list[RequestState]:
        """Requests admitted but not yet running, oldest first."""
        return sorted((r for r in self.slots if r is not None and r.status == PREFILLING), key=lambda r: r.admitted)

    def holds(self, request: RequestState) -> bool:
        """Whether `request` holds its slot now."""
        return request.slot is not None and self.slots[request.slot] is request

    def has_requests(self) -> bool:
        return bool(self.waiting) or any(r is not None for r in self.slots)

    def has_running(self) -> bool:
        """Whether any request runs (stops at the first: `running()` builds the whole list)."""
        return any(r is not None and r.status == RUNNING for r in self.slots)

    # ------------------------------------------------------------------ queue and slots
    def enqueue(self, request: RequestState, *, front: bool = False) -> None:
        self.waiting.appendleft(request) if front else self.waiting.append(request)

    def dequeue(self, request: RequestState) -> None:
        """Take a waiting request out of the queue (aborted, failed, or admitted out of turn)."""
        self.waiting.remove(request)

    def admit_next(self, can_back: Callable[[RequestState, int], bool]) -> RequestState | None:
        """Admit the oldest waiting request into the lowest free slot if `can_back(request,
        slot)` (the engine backs its prompt with KV blocks) says yes; returns it, or None when
        nothing waits, no slot is free or the pool cannot back it yet."""
        free = self.free_slots()
        if not self.waiting or not free:
            return None
        request, slot = self.waiting[0], free[0]
        if not can_back(request, slot):
            return None  # waits until finished requests give blocks back
        self.waiting.popleft()
        request.slot, request.status, request.prefilled = slot, PREFILLING, 0
        request.admitted, self._admissions = self._admissions, self._admissions + 1
        self.slots[slot] = request
        return request

    def leave(self, request: RequestState) -> bool:
        """Free `request`'s slot (it keeps the number: finished requests report it); False if it
        held none."""
        if not self.holds(request):
            return False
        self.slots[request.slot] = None
        return True

    def requeue(self, request: RequestState) -> None:
        """A preempted request (its slot already left): waits at the front, resumes later."""
        request.slot, request.status, request.preemptions = None, WAITING, request.preemptions + 1
        self.waiting.appendleft(request)

    # ------------------------------------------------------------------ decisions
    def prefill_group(self, prefilling: list[RequestState], budget: int, *, grouped: bool,
                      buckets: PrefillBuckets | None = None) -> list[RequestState]:
        """Prefilling requests, oldest first, whose next chunks, padded to the longest, fit one
        forward of `budget` tokens: always the oldest, then each younger one that still fits
        (one that does not waits, oldest, for the next forward); only the oldest unless the
        runner prefills several prompts in one forward (`grouped`). With `buckets` (fresh
        prompts replay one CUDA graph per padded (rows, length) bucket) a group of them must
        also fit one bucket, or its forward runs eagerly (three 150-token prompts fit 512
        tokens, their bucket 4 x 256 does not)."""
        if not grouped:
            return prefilling[:1]
        group: list[RequestState] = []
        width = 0
        for request in prefilling:
            chunk = self.next_chunk(request, budget)
            rows, longest = len(group) + 1, max(width, chunk)
            if group and (rows * longest > budget or not _keeps_a_bucket(buckets, group, request, rows, longest)):
                continue
            group.append(request)
            width = longest
        return group

    @staticmethod
    def next_chunk(request: RequestState, chunk_size: int) -> int:
        """Prompt tokens `request`'s next prefill chunk holds."""
        return min(chunk_size, len(request.prefill_tokens) - request.prefilled)

    @classmethod
    def chunk_tokens(cls, group: list[RequestState], chunk_size: int) -> int:
        """Prompt tokens the next forward of `group` prefills (each request's next chunk)."""
        return sum(cls.next_chunk(r, chunk_size) for r in group)

    @staticmethod
    def prefill_more(running: int, prefilling: int, spent: int, budget: int) -> bool:
        """Whether an iteration runs another prefill forward before its step, after forwards of
        `spent` prompt tokens: yes while requests wait for their prefill and either none or
        fewer run than wait (a batch starting, or a wave finishing together), or the
        iteration's `budget` of prompt tokens is not spent. Why: a step costs what its batch
        bucket costs however few of its slots run, so every request prefilled now rides the
        next step for free; the budget bounds the running requests' wait for their next token."""
        if prefilling == 0:
            return False
        return running == 0 or running < prefilling or spent < budget

    def victim(self, keep: RequestState) -> RequestState | None:
        """The running request to preempt so that `keep` can grow: the youngest other one."""
        others = [r for r in self.running() if r is not keep]
        return max(others, key=lambda r: r.admitted) if others else None

    def bucket(self, buckets: tuple[int, ...]) -> int:
        """The smallest batch bucket holding every running slot."""
        return bucket_holding(buckets, max(r.slot for r in self.running()))


def bucket_holding(buckets: tuple[int, ...], last_slot: int) -> int:
    """The smallest batch bucket that holds slot `last_slot` (buckets count slots from 0)."""
    return next(b for b in sorted(buckets) if b > last_slot)


def _keeps_a_bucket(buckets: PrefillBuckets | None, group: list[RequestState], request: RequestState,
                    rows: int, longest: int) -> bool:
    """Whether `request` may join `group` (making it `rows` chunks of at most `longest` tokens)
    without losing its bucket: always without buckets, or when the group already runs eagerly
    (a chunk past position 0); else the request's chunk starts at 0 too and a bucket holds them."""
    if buckets is None or any(r.prefilled for r in group):
        return True
    return request.prefilled == 0 and buckets.bucket(rows, longest) is not None
