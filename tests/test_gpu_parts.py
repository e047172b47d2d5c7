"""The GPU property parts (scripts/gpu_props.sh) hold every test file exactly once: a new or
renamed test file lands in a part (the `engine` part takes whatever the named lists do not),
and no file listed by name is missing (a stale name would run nothing and be missed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("attention", "kernels", "drafters", "tools", "engine")


def part_files(part: str) -> list[str]:
    run = subprocess.run(["bash", "scripts/gpu_props.sh", part], cwd=ROOT, env={**os.environ, "GPU_PROPS_LIST": "1"},
                         capture_output=True, text=True, check=True)
    return run.stdout.split()


def test_the_parts_hold_every_test_file_exactly_once():
    listed = {part: part_files(part) for part in PARTS}
    flat = [f for part in PARTS for f in listed[part]]
    every = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py"))
    assert sorted(flat) == every, sorted(set(flat) ^ set(every))
    assert listed["attention"] == ["tests/runtime/test_attention.py"]
    assert "tests/models/test_smollm2.py" in listed["tools"]  # the one part that needs the GGUF


def test_an_unknown_part_is_refused_by_name():
    with pytest.raises(subprocess.CalledProcessError) as err:
        part_files("kernel")
    assert err.value.returncode == 2
    assert "unknown part 'kernel'; allowed: attention, kernels, drafters, tools, engine" in err.value.stderr
