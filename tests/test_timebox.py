"""The time box of the GPU property parts (tests/_timebox.py, scripts/gpu_props.sh): past the
deadline tests are skipped with a reason the script counts, and every failure reaches the
report file as the test finishes, with its error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _timebox import unfinished

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "planted failure"
'''


PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]


def _reporting_env(tmp_path: Path) -> tuple[dict, Path]:
    """A pytest run in tmp_path with the _timebox plugin, writing its report; no deadline."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_timebox"]\n')
    report = tmp_path / "report.jsonl"
    env = {**os.environ, "SPECDEC_TEST_REPORT": str(report), "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("SPECDEC_TEST_DEADLINE", None)
    return env, report


def _run(tmp_path: Path, deadline: float | None) -> tuple[list[dict], str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env, report = _reporting_env(tmp_path)
    if deadline is not None:
        env["SPECDEC_TEST_DEADLINE"] = str(deadline)
    out = subprocess.run([*PYTEST, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return rows, out.stdout


def test_failures_and_durations_reach_the_report_as_tests_finish(tmp_path):
    rows, stdout = _run(tmp_path, deadline=None)
    assert "1 failed, 1 passed" in stdout
    starts = [r for r in rows if r["when"] == "start"]
    assert [r["nodeid"].split("::")[1] for r in starts] == ["test_passes", "test_fails"]
    rows = [r for r in rows if r["when"] != "start"]
    by_test = {r["nodeid"].split("::")[1]: r for r in rows}
    assert by_test["test_passes"]["outcome"] == "passed" and by_test["test_passes"]["when"] == "call"
    assert by_test["test_fails"]["outcome"] == "failed" and "planted failure" in by_test["test_fails"]["error"]
    assert all(isinstance(r["seconds"], float) for r in rows)
    assert all(isinstance(r["cpu_seconds"], float) and r["cpu_seconds"] >= 0 and r["load1"] >= 0 for r in rows)


def test_tests_after_the_deadline_are_skipped_with_the_reason_the_script_counts(tmp_path):
    rows, stdout = _run(tmp_path, deadline=time.time() - 1)
    assert "2 skipped" in stdout
    rows = [r for r in rows if r["when"] != "start"]
    assert len(rows) == 2 and all(r["outcome"] == "skipped" and "session deadline" in r["reason"] for r in rows)


HANGS = '''
import time

def test_ends():
    pass

def test_hangs():
    time.sleep(60)
'''


def test_a_test_that_never_ends_is_named_by_its_start_row(tmp_path):
    """What gpu_check.sh lists instead of dumping every thread's stack: a test that started and
    reported no end (here the run is killed inside it, as a hang cut off by the time limit is)."""
    (tmp_path / "test_hang.py").write_text(HANGS)
    env, report = _reporting_env(tmp_path)
    proc = subprocess.Popen([*PYTEST, "test_hang.py"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and "test_hangs" not in (report.read_text() if report.exists() else ""):
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert unfinished(rows) == ["test_hang.py::test_hangs"]


ORDERED = '''
import os

def _log(name):
    with open(os.environ["ORDER_LOG"], "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\\n")

''' + "".join(f'''
def test_{name}():
    _log("{name}")
''' for name in ("a", "b", "c", "d", "e", "f", "g", "h"))


def _run_ordered(tmp_path: Path, seconds: dict[str, float] | None, xdist: list[str]) -> list[tuple[str, str]]:
    """The sample's tests as (name, worker), in the order they started."""
    (tmp_path / "test_ordered.py").write_text(ORDERED)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_timebox"]\n')
    log = tmp_path / "order.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "ORDER_LOG": str(log), "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name in ("SPECDEC_TEST_DEADLINE", "SPECDEC_TEST_REPORT", "SPECDEC_TEST_ORDER"):
        env.pop(name, None)
    if seconds is not None:
        order = tmp_path / "durations.json"
        order.write_text(json.dumps({"seconds": {f"test_ordered.py::test_{k}": v for k, v in seconds.items()}}))
        env["SPECDEC_TEST_ORDER"] = str(order)
    out = subprocess.run([*PYTEST, *xdist, "test_ordered.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "8 passed" in out.stdout, out.stdout + out.stderr
    return [tuple(line.split()) for line in log.read_text().splitlines()]


def test_known_durations_run_longest_first_and_unknown_tests_keep_their_order(tmp_path):
    started = _run_ordered(tmp_path, {"c": 1.0, "f": 30.0, "h": 2.5}, [])
    assert [name for name, _ in started] == ["f", "h", "c", "a", "b", "d", "e", "g"]
    assert [name for name, _ in _run_ordered(tmp_path, None, [])] == list("abcdefgh")


def test_loadgroup_puts_the_two_longest_on_separate_workers(tmp_path):
    """What gpu_sched.sh relies on: under --dist loadgroup the first tests go one per worker;
    --dist load first hands each worker a chunk of neighbours (here 2: both longest on one)."""
    seconds = {"g": 200.0, "b": 180.0}
    worker = dict(_run_ordered(tmp_path, seconds, ["-n", "2", "--dist", "loadgroup"]))
    assert worker["g"] != worker["b"]
    worker = dict(_run_ordered(tmp_path, seconds, ["-n", "2", "--dist", "load"]))
    assert worker["g"] == worker["b"]


def test_gpu_durations_keeps_each_calls_longest_time_above_the_floor(tmp_path):
    sys.path.insert(0, str(TESTS.parent / "scripts"))
    try:
        from gpu_durations import main, read_durations
    finally:
        sys.path.pop(0)
    rows = [dict(nodeid="t.py::a", when="call", outcome="passed", seconds=3.0),
            dict(nodeid="t.py::b", when="call", outcome="passed", seconds=0.2),
            dict(nodeid="t.py::a", when="setup", outcome="failed", seconds=90.0)]
    first, second = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows))
    second.write_text(json.dumps(dict(nodeid="t.py::a", when="call", outcome="passed", seconds=5.5)) + "\n")
    assert read_durations([first, second], min_seconds=1.0) == {"t.py::a": 5.5}
    assert read_durations([first], min_seconds=0.0) == {"t.py::a": 3.0, "t.py::b": 0.2}
    out = tmp_path / "durations.json"
    main([str(first), str(second), "--out", str(out)])
    assert json.loads(out.read_text())["seconds"] == {"t.py::a": 5.5}
