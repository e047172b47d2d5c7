"""The commands that need no model start without torch (issue 24, "first contact"):
`specdec --help`, `specdec <cmd> --help`, `specdec plugins` and the name suggestions import
neither torch nor transformers, and the torch-free listing of strategy names (the built-ins'
declarations, `specdec.plugins.BUILTIN_STRATEGY_NAMES`) says exactly what the full registry says.

Deterministic: each command runs in a fresh interpreter under `-X importtime` and the test
reads which modules it imported; no timing is asserted.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.registry import (
    declared_strategy_names,
    declared_strategy_table,
    get_plugin_manager,
    strategy_names,
    strategy_table,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_PLUGIN = ROOT / "examples" / "third_party_plugin"
HEAVY = ("torch", "transformers")


def _env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SPECDEC_LOAD_ENTRYPOINTS")}
    if list(importlib.metadata.entry_points(group="specdec")):
        # a third-party plugin installed in this environment may import torch itself (allowed);
        # these checks are about specdec's own code, so they leave such plugins out
        env["SPECDEC_LOAD_ENTRYPOINTS"] = "0"
    env.update(extra)
    return env


def _specdec(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`specdec ARGV` in a fresh interpreter: (the finished process, top-level packages it imported)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "specdec.entrypoints.cli", *argv],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in done.stderr.splitlines() if line.startswith("import time:") and "|" in line}
    assert "specdec" in imported, done.stderr[-2000:]  # the -X importtime report is there
    return done, imported


def _table(stdout: str) -> set[tuple[str, str, str]]:
    lines = [tuple(line.split()) for line in stdout.strip().splitlines()]
    assert lines[0] == ("plugin", "kind", "name")
    return set(lines[1:])


@pytest.mark.parametrize("argv, code, shows", [
    (["--help"], 0, "generate"),
    (["plugins"], 0, "eagle3"),
    (["plugins", "--help"], 0, "list installed plugins"),
    (["generate", "--help"], 0, "installed: eagle3, mtp, ngram, none"),
    (["serve", "--help"], 0, "--verifier"),
    (["check", "--help"], 0, "--profile"),
    (["train", "--help"], 0, "eagle3"),
    (["train", "eagle3", "--help"], 0, "--data-mix"),
    (["genrate", "x"], 2, "did you mean generate?"),
    (["generate", "--target", "t", "--dtype", "bf16", "x"], 2, "did you mean bfloat16?"),
    (["generate", "--target", "t", "--topkk", "3", "x"], 2, "did you mean --topk?"),
    (["generate", "--target", "t", "--verifier", "target_only", "x"], 2, "did you mean target-only?"),
    (["generate", "--target", "t", "--tree", "dynamc", "x"], 2, "did you mean dynamic?"),
    (["serve", "--drafter", "eagl3"], 2, "did you mean eagle3?"),
])
def test_commands_that_load_no_model_import_neither_torch_nor_transformers(argv, code, shows):
    done, imported = _specdec(argv, _env())
    assert done.returncode == code, done.stderr[-2000:]
    assert shows in " ".join((done.stdout + done.stderr).split())  # the help wraps lines
    assert not imported & set(HEAVY), f"specdec {' '.join(argv)} imported {sorted(imported & set(HEAVY))}"


def test_the_plugins_table_lists_every_builtin_name_the_registry_knows():
    done, imported = _specdec(["plugins"], _env(SPECDEC_LOAD_ENTRYPOINTS="0"))
    assert done.returncode == 0 and not imported & set(HEAVY)
    assert _table(done.stdout) == set(strategy_table(get_plugin_manager(load_entrypoints=False)))


def test_the_plugins_table_lists_third_party_plugins(installed_example_plugin, tmp_path):
    # the fixture's dist-info (in tmp_path) and the example package, on the subprocess's path too
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(EXAMPLE_PLUGIN), os.environ.get("PYTHONPATH", "")]))
    env.pop("SPECDEC_LOAD_ENTRYPOINTS", None)
    done, _ = _specdec(["plugins"], env)  # the example plugin imports torch itself: allowed
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _table(done.stdout)
    assert {("top2", "verifier", "top2"), ("top2", "tree", "binary")} <= rows
    assert rows == set(strategy_table(get_plugin_manager()))


@pytest.mark.parametrize("load_entrypoints", [False, True])
def test_declared_names_are_the_registry_names(installed_example_plugin, load_entrypoints):
    pm = get_plugin_manager(load_entrypoints=load_entrypoints)
    assert declared_strategy_table(load_entrypoints=load_entrypoints) == strategy_table(pm)
    assert declared_strategy_names(load_entrypoints=load_entrypoints) == strategy_names(pm)  # same order too
    assert ("top2" in declared_strategy_names(load_entrypoints=load_entrypoints)["verifier"]) == load_entrypoints


def test_the_dtype_choices_are_the_validated_ones():
    from specdec.entrypoints import cli
    from specdec.validation import DTYPES

    assert cli.DTYPES == DTYPES


def test_serve_without_its_server_packages_names_a_mistyped_flag_first():
    """A machine without FastAPI / uvicorn (the H200's) still hears about the typo first,
    then about the missing packages, and imports no torch for either."""
    code = ("import sys; sys.modules['uvicorn'] = None; from specdec.entrypoints.cli import main; "
            "sys.argv = ['specdec'] + sys.argv[1:]; sys.exit(main())")
    run = lambda *argv: subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,  # noqa: E731
                                       env=_env(), timeout=120)
    typo = run("serve", "--drafter", "eagl3")
    assert typo.returncode == 2 and "did you mean eagle3?" in typo.stderr, typo.stderr[-2000:]
    missing = run("serve", "--no-warmup")
    assert missing.returncode == 2 and "pip install 'specdec[serve]'" in missing.stderr, missing.stderr[-2000:]
