"""`scripts/train_smollm2_parts.sh pack`: a trained head's folder leaves the GPU machine in pieces
that its file limits let through (at most 16 MiB a file, 8 files a call; a head with a
16384-token draft vocabulary is ~29 MB), and the pieces join back to the same bytes."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIECE = 15 * 1024 * 1024


def test_pack_splits_a_head_folder_into_pieces_that_join_back(tmp_path):
    head = tmp_path / "runs" / "e3"
    head.mkdir(parents=True)
    weights = os.urandom(29 * 1024 * 1024)  # incompressible, like bf16 weights
    (head / "model.safetensors").write_bytes(weights)
    (head / "TRAINING.md").write_text("# trained\n")
    out = tmp_path / "OUT"
    out.mkdir()
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack", str(head)], cwd=ROOT,
                         env={**os.environ, "OUT": str(out)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    pieces = sorted(out.iterdir())
    assert [p.name for p in pieces] == ["e3.tgz.00", "e3.tgz.01"]
    assert all(p.stat().st_size <= PIECE for p in pieces)
    joined = tmp_path / "joined.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in pieces))  # `cat e3.tgz.* > joined.tgz`
    with tarfile.open(joined) as tar:
        tar.extractall(tmp_path / "back", filter="data")
    assert (tmp_path / "back" / "e3" / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "back" / "e3" / "TRAINING.md").read_text() == "# trained\n"


def test_pack_needs_out(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack", str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "pack writes its pieces to $OUT" in run.stderr
