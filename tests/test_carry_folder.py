"""scripts/carry_folder.sh and scripts/join_carried.sh: a folder too large for one device call
(a 29 MB head, cached prompts) travels in pieces, one per call, and the GPU machine joins it
back once every piece has come, whatever the order (gpu_setup.sh sources the join each call)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _carry(tmp_path: Path, name: str, folder: Path, piece_bytes: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "CARRY_DIR": str(tmp_path / "carry"), "PIECE_BYTES": str(piece_bytes)}
    return subprocess.run(["bash", "scripts/carry_folder.sh", name, str(folder)], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def _join(tmp_path: Path, call_root: Path) -> str:
    """One device call: its .carry holds one piece folder; /root's pieces and carried stay."""
    env = {**os.environ, "CARRY_ROOT": str(call_root), "PIECES": str(tmp_path / "site" / "pieces"),
           "CARRIED": str(tmp_path / "carried")}
    script = "set -u; have=kept1; want=kept2; source scripts/join_carried.sh; echo \"GGUF $have $want\""
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert run.stdout.endswith("GGUF kept1 kept2\n")  # gpu_check.sh reads gpu_setup.sh's have / want after the join
    return run.stdout


def test_a_folder_travels_in_pieces_and_joins_back(tmp_path):
    head = tmp_path / "heads" / "e3"
    head.mkdir(parents=True)
    weights = os.urandom(3 * 1024 * 1024 + 17)  # incompressible
    (head / "model.safetensors").write_bytes(weights)
    (head / "config.json").write_text('{"draft_vocab_size": 16384}')
    run = _carry(tmp_path, "e3", head, 1024 * 1024)
    assert run.returncode == 0, run.stderr
    folders = sorted((tmp_path / "carry").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    assert [p.name for p in folders] == [f"e3-{k}" for k in range(4)] and "carry/e3-3\"]" in run.stdout
    assert all((p / "e3.size").is_file() and len(list(p.glob("e3.tgz.*"))) == 1 for p in folders)
    for k, folder in enumerate(reversed(folders)):  # any order
        call = tmp_path / f"call{k}"
        shutil.copytree(folder, call / folder.name)
        out = _join(tmp_path, call)
        if k < len(folders) - 1:
            assert "carried folder e3:" in out and not (tmp_path / "carried" / "e3").exists()
    assert "carried folder ready:" in out
    back = tmp_path / "carried" / "e3"
    assert (back / "model.safetensors").read_bytes() == weights
    assert (back / "config.json").read_text() == '{"draft_vocab_size": 16384}'
    assert "carried folder ready:" in _join(tmp_path, tmp_path / "empty")  # later calls: still there


def test_bad_names_and_folders_are_refused(tmp_path):
    run = _carry(tmp_path, "e3-head", tmp_path, 1024)
    assert run.returncode != 0 and "NAME e3-head must be letters, digits and _" in run.stderr
    run = _carry(tmp_path, "e3", tmp_path / "missing", 1024)
    assert run.returncode != 0 and "is not a folder" in run.stderr
