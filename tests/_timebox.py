"""Time-boxed test runs on the GPU machine (scripts/gpu_props.sh), robust to being cut off.

SPECDEC_TEST_DEADLINE (Unix seconds): tests that would start after it are skipped (reason
"session deadline"), so pytest ends on its own with its summary and slowest tests instead of
being interrupted (SIGINT under xdist crashed the controller, INTERNALERROR, and lost which
tests had failed). SPECDEC_TEST_REPORT (a path): one JSON line per test phase that did not
pass quietly, plus every call's duration, appended as each test finishes (under xdist by the
controller, which receives every worker's reports: one writer, whole lines); and a `start` row
as each test begins, so a test that started and never ended (hung, or its worker died) is named
without dumping thread stacks (pytest's faulthandler_timeout dump killed a GPU check's worker:
CPython's all-thread dump races with threads starting and ending, python/cpython#131580, #116008).
SPECDEC_TEST_ORDER (a path, `tests/gpu_durations.json`): collected tests are run longest first
by the durations recorded there (unknown tests after, in collection order), so under
`pytest -n 8 --dist loadgroup` (scripts/gpu_sched.sh) the slowest properties start at once on separate workers
instead of queuing behind each other in one worker's chunk (the kernels part took 517 s for
1674 s of tests over 8 workers at 0c679cb: its two longest, 234 s and 179 s, were neighbours).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


_IN_WORKER = False  # an xdist worker: the controller receives its reports and writes them


def pytest_configure(config) -> None:
    global _IN_WORKER
    _IN_WORKER = hasattr(config, "workerinput")


def pytest_collection_modifyitems(config, items) -> None:
    path = os.environ.get("SPECDEC_TEST_ORDER")
    if not path:
        return
    with open(path) as f:
        seconds = json.load(f)["seconds"]  # {nodeid: seconds of its call}
    # stable: equal (and unknown) durations keep collection order; every xdist worker sorts the same
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))


def pytest_runtest_setup(item) -> None:
    deadline = os.environ.get("SPECDEC_TEST_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip("session deadline (SPECDEC_TEST_DEADLINE) passed before this test started")


def _cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have been waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A call's CPU seconds beside its wall seconds: a test whose wall time grows while its CPU
    time does not waited (for the GPU, or for cores other workers held). The tools part's SmolLM2
    greedy test took 22 s of wall time at 5436637 and 383 s at a699352 (H200); the next report says
    which."""
    if not os.environ.get("SPECDEC_TEST_REPORT"):
        yield
        return
    start = _cpu_seconds()
    yield
    item.user_properties.append(("cpu_seconds", round(_cpu_seconds() - start, 2)))


def pytest_runtest_logstart(nodeid, location) -> None:
    path = os.environ.get("SPECDEC_TEST_REPORT")
    if not path or _IN_WORKER:
        return
    with open(path, "a") as f:
        f.write(json.dumps(dict(nodeid=nodeid, when="start", outcome="started", end=round(time.time(), 2))) + "\n")


def unfinished(rows: list[dict]) -> list[str]:
    """Tests of a report that started and reported no end (hung, cut off, or their worker died)."""
    ended = {r["nodeid"] for r in rows if r["when"] != "start"}
    return sorted({r["nodeid"] for r in rows if r["when"] == "start"} - ended)


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("SPECDEC_TEST_REPORT")
    if not path or (report.when != "call" and report.passed) or _IN_WORKER:
        return
    node = getattr(report, "node", None)  # xdist: the worker that ran it (a timeline per worker)
    worker = getattr(getattr(node, "gateway", None), "id", None)
    row = dict(nodeid=report.nodeid, when=report.when, outcome=report.outcome, seconds=round(report.duration, 2),
               worker=worker, end=round(time.time(), 2))
    if report.when == "call":  # the call's CPU time (its worker's), and how busy the machine was as it ended
        row["cpu_seconds"] = dict(report.user_properties).get("cpu_seconds")
        row["load1"] = round(os.getloadavg()[0], 1)
    if report.failed:
        row["error"] = str(report.longrepr)[-4000:]
    elif report.skipped:
        row["reason"] = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
