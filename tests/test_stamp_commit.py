"""scripts/stamp_commit.sh and scripts/tree_digest.sh: the GPU check names the commit it ran
from a stamp, and says when the tree is not that commit (a check once ran with a mistyped hash)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
GIT = dict(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def sh(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=repo, capture_output=True, text=True, env={**os.environ, **GIT})


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("scripts/stamp_commit.sh runs git, which this machine lacks (CI has it: it clones the repository)")
    (tmp_path / "scripts").mkdir()
    for name in ("stamp_commit.sh", "tree_digest.sh"):
        shutil.copy(SCRIPTS / name, tmp_path / "scripts" / name)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("def test(): pass\n")
    (tmp_path / ".gitignore").write_text(".carry/\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "one"]):
        assert sh(tmp_path, *cmd).returncode == 0
    return tmp_path


def verify(repo: Path, commit: str) -> str:
    done = sh(repo, "bash", "scripts/tree_digest.sh", "--verify", ".carry/wheels", commit)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_stamped_tree_verifies_as_its_commit_and_no_other(repo):
    assert verify(repo, "0" * 40).startswith("tree not verified (no stamp")
    done = sh(repo, "bash", "scripts/stamp_commit.sh")
    assert done.returncode == 0, done.stderr
    head = sh(repo, "git", "rev-parse", "HEAD").stdout.strip()
    stamp = repo / ".carry" / "wheels"
    assert (stamp / "commit").read_text().strip() == head
    assert (stamp / "manifest").read_text().split() == ["scripts/stamp_commit.sh", "scripts/tree_digest.sh", "src/a.py",
                                                       "tests/t.py"]
    assert verify(repo, head).startswith("tree verified")
    assert verify(repo, "f" * 40).startswith("TREE NOT VERIFIED: the commit named")
    (repo / "src" / "a.py").write_text("x = 2\n")  # the tree changed after the stamp
    assert verify(repo, head).startswith("TREE NOT VERIFIED: its tracked source differs")


def test_stamping_refuses_uncommitted_or_untracked_changes(repo):
    (repo / "src" / "b.py").write_text("y = 1\n")
    done = sh(repo, "bash", "scripts/stamp_commit.sh")
    assert done.returncode == 1 and "commit first" in done.stderr and "src/b.py" in done.stderr
    assert not (repo / ".carry" / "wheels" / "commit").exists()
