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

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "planted failure"
'''


def _run(tmp_path: Path, deadline: float | None) -> tuple[list[dict], str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_timebox"]\n')
    report = tmp_path / "report.jsonl"
    env = {**os.environ, "SPECDEC_TEST_REPORT": str(report), "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("SPECDEC_TEST_DEADLINE", None)
    if deadline is not None:
        env["SPECDEC_TEST_DEADLINE"] = str(deadline)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return rows, out.stdout


def test_failures_and_durations_reach_the_report_as_tests_finish(tmp_path):
    rows, stdout = _run(tmp_path, deadline=None)
    assert "1 failed, 1 passed" in stdout
    by_test = {r["nodeid"].split("::")[1]: r for r in rows}
    assert by_test["test_passes"]["outcome"] == "passed" and by_test["test_passes"]["when"] == "call"
    assert by_test["test_fails"]["outcome"] == "failed" and "planted failure" in by_test["test_fails"]["error"]
    assert all(isinstance(r["seconds"], float) for r in rows)


def test_tests_after_the_deadline_are_skipped_with_the_reason_the_script_counts(tmp_path):
    rows, stdout = _run(tmp_path, deadline=time.time() - 1)
    assert "2 skipped" in stdout
    assert len(rows) == 2 and all(r["outcome"] == "skipped" and "session deadline" in r["reason"] for r in rows)
