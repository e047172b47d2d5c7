"""The engine's scheduling decisions, asserted exactly (not only through exact outputs):
a new request takes the lowest free slot, a step runs the smallest batch bucket that holds
every live slot, and a short KV pool preempts the youngest running request (the oldest are
served first). Outputs stay exact whatever these decide, so only a direct check catches a
wrong choice (a request in slot 3 makes every step run the 4-slot bucket).

Drives `SpecEngine` through `submit` / `run_iteration` on a tiny random Llama (CPU, fp32,
target-only), recording each step's bucket and each preemption.
"""

from __future__ import annotations

import pytest

import specdec
from specdec import SamplingParams, SpecConfig, SpecDecoder

from _mtp_heads import e2e_cpu  # noqa: F401  (fixture)
from _tiny_models import make_checkpoint

pytestmark = pytest.mark.usefixtures("e2e_cpu")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sched")
    make_checkpoint("llama", folder, num_hidden_layers=2, seed=2)
    return specdec.load_target(folder)


def _engine(target, **kw):
    config = SpecConfig(drafter="none", max_batch_size=4, max_seq_len=64, kv_block_size=4, **kw)
    engine = SpecDecoder(target, config).engine
    engine.buckets_run = []
    launch = engine._launch

    def record(b, speculative=True):
        engine.buckets_run.append(b)
        return launch(b, speculative)

    engine._launch = record
    return engine


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def _run_until(engine, done) -> None:
    for _ in range(500):
        if done():
            return
        engine.run_iteration()
    raise AssertionError("the engine made no progress in 500 iterations")


def test_a_new_request_takes_the_lowest_free_slot(target):
    engine = _engine(target)
    a, b, c = (engine.submit([5, 6, 7], _params(n)) for n in (2, 30, 30))
    engine.run_iteration()
    assert (a.slot, b.slot, c.slot) == (0, 1, 2)
    _run_until(engine, lambda: a.finished)
    assert engine.free_slots() == [0, 3]
    d = engine.submit([9, 9], _params(5))
    engine.run_iteration()
    assert d.slot == 0  # not 3: the smallest bucket keeps serving
    e = engine.submit([4], _params(5))
    engine.run_iteration()
    assert e.slot == 3


def test_each_step_runs_the_smallest_bucket_that_holds_every_live_slot(target):
    engine = _engine(target)
    assert engine.buckets == (1, 2, 4)
    a = engine.submit([1, 2], _params(12))
    engine.run_iteration()
    assert engine.buckets_run[-1] == 1  # slot 0 only
    b = engine.submit([3, 4], _params(4))
    c = engine.submit([5, 6], _params(30))
    engine.run_iteration()
    assert (b.slot, c.slot) == (1, 2) and engine.buckets_run[-1] == 4  # slot 2 lives: bucket 4
    _run_until(engine, lambda: a.finished and b.finished)
    assert engine.buckets_run[-1] == 4  # c still sits in slot 2
    _run_until(engine, lambda: c.finished)
    engine.buckets_run.clear()
    d = engine.submit([7], _params(6))
    e = engine.submit([8], _params(3))
    _run_until(engine, lambda: d.finished and e.finished)
    # d and e take slots 0 and 1: bucket 2 while both run, then bucket 1 once e (slot 1) is done
    assert (d.slot, e.slot) == (0, 1) and set(engine.buckets_run) == {1, 2}
    assert engine.buckets_run == sorted(engine.buckets_run, reverse=True)


def test_a_short_pool_preempts_the_youngest_running_request(target):
    # 3 requests of 4 prompt tokens, each admitted with 3 blocks (9 positions: prompt + 5 ahead);
    # a pool of 9 blocks then cannot grow anyone: the oldest (a) grows first and takes the
    # youngest's (c) blocks; b, the middle one, is never the victim while c runs
    engine = _engine(target, num_kv_blocks=9)
    victims = []
    preempt = engine._preempt

    def record(request):
        running = [r for r in engine.running() if r is not request]
        victims.append((request, max(r.admitted for r in running + [request]) == request.admitted))
        return preempt(request)

    engine._preempt = record
    a, b, c = (engine.submit([1, 2, 3, 4], _params(20)) for _ in range(3))
    engine.run_iteration()
    assert [r.slot for r in (a, b, c)] == [0, 1, 2]
    _run_until(engine, lambda: bool(victims))
    assert victims[0][0] is c  # the youngest, not the middle one, not the oldest
    _run_until(engine, lambda: a.finished and b.finished and c.finished)
    assert all(youngest for _, youngest in victims), [(v.id, y) for v, y in victims]
    assert a.preemptions == 0  # the oldest is always served first


@pytest.mark.filterwarnings("ignore:1 request.s. failed:UserWarning")
def test_a_request_the_engine_never_steps_fails_by_name_instead_of_hanging(target):
    """An engine bug that leaves slot 1 out of every step: its request fails, naming the
    request and the slot; the others finish normally (SIGALRM fails the test on a hang)."""
    import signal

    dec = SpecDecoder(target, SpecConfig(drafter="none", max_batch_size=4, max_seq_len=64, kv_block_size=4))
    engine = dec.engine
    bucket = engine._bucket

    def skip_slot_one():
        b = bucket()
        for r in engine.running():  # the bug: slot 1 is never handed its tokens
            if r.slot == 1:
                r.status, r._hidden = "stuck", True
        return b

    def restore():
        for r in engine.slots:
            if r is not None and getattr(r, "_hidden", False):
                r.status, r._hidden = "running", False

    step = engine.step

    def buggy_step():
        skip_slot_one()
        try:
            step()
        finally:
            restore()

    engine.step = buggy_step
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("the engine hung")))
    signal.alarm(60)
    try:
        results = dec.generate([[1, 2], [3, 4], [5, 6]], _params(10))
    finally:
        signal.alarm(0)
    assert [r.stats.finish_reason for r in results] == ["length", "error", "length"]
    assert "request 1 in slot 1 made no progress in 3 engine iterations" in results[1].stats.error
    assert [len(r.token_ids) for r in results] == [10, 1, 10]
    assert engine.free_slots() == [0, 1, 2, 3] and not engine.has_work()


def test_requests_that_finish_at_admission_drain_the_queue_without_a_false_stall(target):
    """max_new_tokens=1 at batch 1: each request finishes in the iteration that admits it, so
    every watchdog check sees all slots free and a waiting queue; the queue's head changes
    each time, which is progress (this failed 3 of 10 requests as "an engine bug")."""
    dec = SpecDecoder(target, SpecConfig(drafter="none", max_batch_size=1, max_seq_len=64, kv_block_size=4))
    prompts = [[i + 1, i + 2, i + 3] for i in range(10)]
    results = dec.generate(prompts, _params(1))
    assert [r.stats.finish_reason for r in results] == ["length"] * 10
    assert all(len(r.token_ids) == 1 for r in results)


@pytest.mark.filterwarnings("ignore:2 request.s. failed:UserWarning")
def test_a_queue_head_that_is_never_admitted_fails_by_name(target):
    """An engine bug that never admits: the queue's head fails after 3 idle iterations, then
    the next one, so `generate` returns instead of hanging."""
    dec = SpecDecoder(target, SpecConfig(drafter="none", max_batch_size=2, max_seq_len=64, kv_block_size=4))
    dec.engine._admit = lambda: None
    results = dec.generate([[1, 2], [3, 4]], _params(4))
    assert [r.stats.finish_reason for r in results] == ["error", "error"]
    assert "request 0 waits for admission while no request holds a slot" in results[0].stats.error
