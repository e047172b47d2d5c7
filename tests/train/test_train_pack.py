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


def test_pack_prompts_carries_the_finished_prompts_to_a_later_session(tmp_path):
    """`pack-prompts` puts <work>/prompts.jsonl (+ its settings) in pieces; `data` with
    PROMPTS_FROM unpacks them into a new work folder the same way (`cat | tar -x`)."""
    work, out = tmp_path / "work", tmp_path / "OUT"
    work.mkdir()
    out.mkdir()
    lines = "".join(f'{{"kind": "general-chat", "text": "request {i} {os.urandom(8).hex()}"}}\n' for i in range(20000))
    (work / "prompts.jsonl").write_text(lines)
    (work / "prompts.settings.json").write_text('{"seed": 1}')
    env = {**os.environ, "OUT": str(out), "WORK": str(work)}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack-prompts", str(tmp_path / "e4")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["prompts.tgz.00"]
    later = tmp_path / "later"
    later.mkdir()
    subprocess.run(f"cat {out}/prompts.tgz.* | tar -xzf - -C {later}", shell=True, check=True)
    assert (later / "prompts.jsonl").read_text() == lines and (later / "prompts.settings.json").read_text() == '{"seed": 1}'
    empty = {**env, "WORK": str(tmp_path / "nothing")}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack-prompts", str(tmp_path / "e4")], cwd=ROOT, env=empty,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "run the data stage first" in run.stderr


def _fake_python(bin_dir: Path, seen: Path) -> None:
    """A `python` that passes the script's import check and records, at the `data` stage's run, the
    files its work folder holds then (what the real run would find and reuse)."""
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\nls "$WORK" > {seen}\necho "$@" >> {seen}\n')
    fake.chmod(0o755)


def test_pack_data_carries_the_answered_data_to_a_later_session(tmp_path):
    """`pack-data` puts <work>/data.pt, val_data.pt and the prompts in pieces of at most 15 MiB;
    a later `data` with DATA_FROM (the pieces, or the folder they unpack to) puts them into its
    new work folder before the run, which then reuses them instead of answering the prompts again."""
    work, out = tmp_path / "work", tmp_path / "OUT"
    work.mkdir()
    out.mkdir()
    blobs = {"data.pt": os.urandom(20 * 1024 * 1024), "val_data.pt": os.urandom(4096),
             "prompts.jsonl": b'{"kind": "math", "text": "1 + 1"}\n', "prompts.settings.json": b'{"seed": 3}'}
    for name, blob in blobs.items():
        (work / name).write_bytes(blob)
    (work / "responses.pt").write_bytes(b"partial")  # generation's resume file: not part of the finished data
    env = {**os.environ, "OUT": str(out), "WORK": str(work)}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack-data", str(tmp_path / "e8")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    pieces = sorted(out.iterdir())
    assert [p.name for p in pieces] == ["data.tgz.00", "data.tgz.01"] and all(p.stat().st_size <= PIECE for p in pieces)

    seen = tmp_path / "seen"
    _fake_python(tmp_path / "bin", seen)
    fresh = tmp_path / "fresh"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "WORK": str(fresh), "DATA_FROM": str(out)}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "data", str(tmp_path / "e8")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"data restored from {out}" in run.stdout
    assert {p.name: p.read_bytes() for p in fresh.iterdir()} == blobs
    *listed, args = seen.read_text().splitlines()  # the work folder's files when the run started, then its flags
    assert sorted(listed) == sorted(blobs) and "--data-only" in args

    unpacked = tmp_path / "carried"  # the folder the pieces unpack to (scripts/carry_folder.sh carries it)
    unpacked.mkdir()
    subprocess.run(f"cat {out}/data.tgz.* | tar -xzf - -C {unpacked}", shell=True, check=True)
    again = tmp_path / "again"
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "data", str(tmp_path / "e8")], cwd=ROOT,
                         env={**env, "WORK": str(again), "DATA_FROM": str(unpacked)}, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert {p.name: p.read_bytes() for p in again.iterdir()} == blobs


def test_data_from_without_data_names_the_folder(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    seen = tmp_path / "seen"
    _fake_python(tmp_path / "bin", seen)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "WORK": str(tmp_path / "w"), "DATA_FROM": str(empty)}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "data", str(tmp_path / "e8")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and f"DATA_FROM={empty} holds no data.pt" in run.stderr
    assert not seen.exists()  # nothing ran


def test_pack_data_needs_the_data(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "WORK": str(tmp_path / "nothing")}
    run = subprocess.run(["bash", "scripts/train_smollm2_parts.sh", "pack-data", str(tmp_path / "e8")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "run the data stage first" in run.stderr
