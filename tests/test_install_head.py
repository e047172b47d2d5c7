"""scripts/install_head.sh: a head packed on the GPU machine replaces a shipped head's weights and
config, the shipped one kept as the end-to-end baseline; a head of another kind is refused.
The script writes into the checkout's assets, so each test runs it on a copy of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIAS = "smollm2-mtp"


def _checkout(tmp_path: Path) -> Path:
    """The script and the shipped MTP head's config in a throwaway tree (weights stand-ins)."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install_head.sh", tree / "scripts")
    shipped = tree / "src" / "specdec" / "assets" / "heads" / ALIAS
    shipped.mkdir(parents=True)
    shutil.copy(ROOT / "src" / "specdec" / "assets" / "heads" / ALIAS / "config.json", shipped)
    (shipped / "model.safetensors").write_bytes(b"old weights")
    (shipped / "draft_vocab.safetensors").write_bytes(b"old vocab")
    (shipped / "TRAINING.md").write_text("old record")
    return tree


def _pack(tmp_path: Path, name: str, config: dict, files: dict[str, bytes]) -> Path:
    """NAME.tgz.00 / .01 as `train_smollm2_parts.sh pack` leaves them in a call's files."""
    head = tmp_path / "out" / name
    head.mkdir(parents=True)
    (head / "config.json").write_text(json.dumps(config))
    for file, data in files.items():
        (head / file).write_bytes(data)
    with tarfile.open(tmp_path / "all.tgz", "w:gz") as tar:
        tar.add(head, arcname=name)
    data = (tmp_path / "all.tgz").read_bytes()
    files_at = tmp_path / "files"
    files_at.mkdir()
    half = len(data) // 2
    (files_at / f"{name}.tgz.00").write_bytes(data[:half])
    (files_at / f"{name}.tgz.01").write_bytes(data[half:])
    return files_at


def _install(tree: Path, tmp_path: Path, files_at: Path, name: str) -> subprocess.CompletedProcess:
    # the throwaway tree has no specdec package: the script reads the head kinds with the checkout's
    env = {**os.environ, "KEEP": str(tmp_path / "keep"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["bash", "scripts/install_head.sh", str(files_at), name, ALIAS], cwd=tree, env=env,
                          capture_output=True, text=True)


def test_a_packed_head_replaces_the_shipped_weights_and_the_old_ones_become_the_baseline(tmp_path):
    tree = _checkout(tmp_path)
    files_at = _pack(tmp_path, "e7mt0", {"specdec_mtp": 1, "hidden_size": 576},
                     {"model.safetensors": b"new weights", "draft_vocab.safetensors": b"new vocab"})
    run = _install(tree, tmp_path, files_at, "e7mt0")
    assert run.returncode == 0, run.stderr
    shipped = tree / "src" / "specdec" / "assets" / "heads" / ALIAS
    assert (shipped / "model.safetensors").read_bytes() == b"new weights"
    assert (shipped / "draft_vocab.safetensors").read_bytes() == b"new vocab"
    assert json.loads((shipped / "config.json").read_text()) == {"specdec_mtp": 1, "hidden_size": 576}
    assert (shipped / "TRAINING.md").read_text() == "old record"  # rewritten by hand for the new head
    base = tree / ".carry" / f"base_{ALIAS}" / ALIAS
    assert (base / "model.safetensors").read_bytes() == b"old weights"
    assert (base / "draft_vocab.safetensors").read_bytes() == b"old vocab"
    assert (tmp_path / "keep" / "e7mt0" / "model.safetensors").is_file()
    assert f"installed e7mt0 as {ALIAS}" in run.stdout


def test_a_head_of_another_kind_or_missing_pieces_are_refused(tmp_path):
    tree = _checkout(tmp_path)
    files_at = _pack(tmp_path, "e7t0", {"draft_vocab_size": 16384}, {"model.safetensors": b"eagle3 weights"})
    run = _install(tree, tmp_path, files_at, "e7t0")
    assert run.returncode != 0 and "e7t0 is a head of kind eagle3, smollm2-mtp of kind mtp" in run.stderr
    shipped = tree / "src" / "specdec" / "assets" / "heads" / ALIAS
    assert (shipped / "model.safetensors").read_bytes() == b"old weights"  # untouched
    run = _install(tree, tmp_path, files_at, "e7mt1")
    assert run.returncode != 0 and "no e7mt1.tgz.* pieces in" in run.stderr
