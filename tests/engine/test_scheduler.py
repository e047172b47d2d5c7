"""The scheduler's rules alone (`specdec.engine.scheduler`): plain Python over request records,
no model and no torch (a subprocess checks that importing it loads none)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdec.config import SamplingParams
from specdec.engine.request import PREFILLING, RUNNING, WAITING, RequestState
from specdec.engine.scheduler import Scheduler


def request(i: int, prompt_len: int = 4) -> RequestState:
    return RequestState(id=i, prompt=[1] * prompt_len, params=SamplingParams(max_new_tokens=8), seed=i,
                        budget=3, max_positions=prompt_len + 16)


def test_importing_the_scheduler_loads_no_torch():
    code = "import sys, specdec.engine.scheduler; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_oldest_waiting_request_takes_the_lowest_free_slot():
    s = Scheduler(3)
    for i in range(4):
        s.enqueue(request(i))
    admitted = [s.admit_next(lambda r, slot: True) for _ in range(4)]
    assert [r.id for r in admitted[:3]] == [0, 1, 2] and admitted[3] is None  # no slot left
    assert [r.slot for r in admitted[:3]] == [0, 1, 2]
    assert all(r.status == PREFILLING for r in admitted[:3]) and [r.admitted for r in admitted[:3]] == [0, 1, 2]
    s.leave(admitted[1])
    late = s.admit_next(lambda r, slot: True)
    assert late.id == 3 and late.slot == 1 and late.admitted == 3


def test_a_request_the_pool_cannot_back_waits_and_so_does_everyone_behind_it():
    s = Scheduler(4)
    s.enqueue(request(0, prompt_len=100))
    s.enqueue(request(1, prompt_len=2))
    asked = []
    assert s.admit_next(lambda r, slot: asked.append((r.id, slot)) or False) is None
    assert asked == [(0, 0)] and [r.id for r in s.waiting] == [0, 1]  # no overtaking
    assert s.slots == [None] * 4


def test_the_victim_is_the_youngest_other_running_request():
    s = Scheduler(4)
    for i in range(3):
        s.enqueue(request(i))
        s.admit_next(lambda r, slot: True).status = RUNNING
    oldest, middle, youngest = s.slots[:3]
    assert s.victim(oldest) is youngest
    assert s.victim(youngest) is middle
    s.leave(middle), s.leave(youngest)
    assert s.victim(oldest) is None


def test_a_preempted_request_waits_at_the_front():
    s = Scheduler(2)
    for i in range(3):
        s.enqueue(request(i))
    first = s.admit_next(lambda r, slot: True)
    assert s.leave(first) and not s.leave(first)  # a second leave holds nothing
    s.requeue(first)
    assert first.status == WAITING and first.slot is None and first.preemptions == 1
    assert [r.id for r in s.waiting] == [0, 1, 2]


def test_the_bucket_holds_the_highest_running_slot():
    s = Scheduler(8)
    for i in range(6):
        s.enqueue(request(i))
        s.admit_next(lambda r, slot: True).status = RUNNING
    assert s.bucket((1, 2, 4, 8)) == 8
    for r in s.slots[3:6]:
        s.leave(r)
    assert s.bucket((1, 2, 4, 8)) == 4


class Buckets:
    """Planted prefill buckets: rows x length up to (4, 64) and (1, 256)."""

    def bucket(self, rows, length):
        if rows <= 4 and length <= 64:
            return (4, 64)
        if rows == 1 and length <= 256:
            return (1, 256)
        return None


@pytest.mark.parametrize("grouped", [True, False])
def test_prefill_groups_pad_to_the_longest_chunk_within_the_budget(grouped):
    s = Scheduler(8)
    lens = [10, 50, 30, 200, 5]
    for i, n in enumerate(lens):
        s.enqueue(request(i, n))
        s.admit_next(lambda r, slot: True)
    group = s.prefill_group(s.prefilling(), 160, grouped=grouped)
    if not grouped:
        assert [r.id for r in group] == [0]
        return
    # 10 -> 2 x 50 = 100 -> 3 x 50 = 150 -> 4 x 160 too many (the 200-token prompt waits) -> 4 x 50 = 200 > 160
    assert [r.id for r in group] == [0, 1, 2]
    with_buckets = s.prefill_group(s.prefilling(), 1024, grouped=True, buckets=Buckets())
    # 4 x 200 fits the budget, but no bucket holds 4 chunks of 200 tokens; 4 x 50 fits (4, 64)
    assert [r.id for r in with_buckets] == [0, 1, 2, 4]


def test_a_scheduler_needs_a_slot():
    with pytest.raises(ValueError, match="num_slots=0"):
        Scheduler(0)


@pytest.mark.parametrize(
    "running, prefilling, spent, budget, more",
    [(0, 3, 900, 10, True),  # nothing runs: prefill on whatever was spent
     (2, 3, 900, 10, True),  # fewer run than wait
     (3, 3, 9, 10, True),  # as many run as wait, budget left
     (3, 3, 10, 10, False),  # budget spent
     (5, 1, 0, 10, True),
     (5, 0, 0, 10, False),  # nothing to prefill
     (0, 0, 0, 10, False)],
)
def test_prefill_goes_on_while_requests_wait_and_fewer_run_or_the_budget_lasts(running, prefilling, spent, budget, more):
    assert Scheduler.prefill_more(running, prefilling, spent, budget) is more


def test_chunk_tokens_count_each_requests_next_chunk():
    a, b = request(0, prompt_len=30), request(1, prompt_len=5)
    a.prefilled = 20  # 10 left
    assert Scheduler.chunk_tokens([a, b], 8) == 8 + 5
    assert Scheduler.chunk_tokens([a, b], 64) == 10 + 5
