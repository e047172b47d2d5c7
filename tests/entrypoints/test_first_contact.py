"""What a new user meets first (issue 24): threads chosen for a busy CPU, every flag checked
before loading with errors that name the flag, `--tree dynamic` alone, `specdec serve` with
no arguments, `--version`, suggestions for misspellings, help in user terms, the plugins
table, a fast `--help`, and the GGUF reader as a dependency.

Runs `specdec.entrypoints.cli.main` in-process on a tiny target with a chat template; the server's own
behaviour (404 for an unknown model, the access log) is in test_server.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

import specdec.entrypoints.cli as cli
from specdec import ConfigError, SpecConfig, SpecDecoder
from specdec.cpu_threads import auto_threads

from _cli_world import no_loading, run, tiny  # noqa: F401  (fixtures)
from _mtp_heads import e2e_cpu  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.usefixtures("e2e_cpu"),
              pytest.mark.filterwarnings("ignore:drafter='eagle3' accepts almost nothing:UserWarning")]
ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- 1. threads
@pytest.mark.parametrize("current, cpus, load, want", [
    (2, 2, 4.0, 1),     # the box: 2 cores, load 3-6 -> one thread
    (2, 2, 0.1, 2),     # idle: torch's own count, as before
    (2, 2, 1.2, 1),
    (1, 8, 0.0, 1),     # never more than torch already uses (a test's or a user's choice stays)
    (16, 16, 3.4, 13),
    (8, 4, 0.0, 4),     # never more than the CPUs this process may use
    (4, 4, 50.0, 1),    # at least one
])
def test_auto_threads_leave_the_busy_cores_to_the_work_already_running(current, cpus, load, want):
    assert auto_threads(current, cpus=cpus, load=load) == want


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_cpu_decoder_on_a_busy_machine_runs_one_thread(tiny, monkeypatch, restore_threads):
    import specdec.cpu_threads as threads

    monkeypatch.setattr(threads.os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    torch.set_num_threads(2)
    SpecDecoder.from_pretrained(tiny.target, None, SpecConfig(max_batch_size=1, max_seq_len=32))
    assert torch.get_num_threads() == 1
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    SpecDecoder.from_pretrained(tiny.target, None, SpecConfig(max_batch_size=1, max_seq_len=32, threads=2))
    assert torch.get_num_threads() == 2  # an explicit count is set exactly


@pytest.mark.parametrize("value, message", [(0, r"threads=0 is out of range; allowed: \[1, 1024\]"),
                                            ("many", r"threads='many' is not allowed; allowed: 'auto' or an int")])
def test_threads_outside_the_range_are_refused(value, message):
    with pytest.raises(ConfigError, match=message):
        SpecConfig(threads=value)


def test_the_threads_flag(tiny, capsys, no_loading, restore_threads):
    code, _, err = run(["generate", "--target", tiny.target, "--threads", "0", "w1"], capsys)
    assert code == 2 and "threads=0 is out of range" in err
    code, _, err = run(["generate", "--target", tiny.target, "--threads", "two", "w1"], capsys)
    assert code == 2 and "argument --threads: expected an int, got 'two'" in err


def test_generate_reports_its_thread_count(tiny, capsys, restore_threads):
    code, _, err = run(["generate", "--target", tiny.target, "--device", "cpu", "--threads", "1", "--raw",
                        "--max-new-tokens", "3", "w1 w2"], capsys)
    assert code == 0 and "specdec: 1 CPU thread(s) (--threads 1)" in err


# ----------------------------------------------------------------------------- 2. --tree dynamic alone
def test_tree_dynamic_alone_uses_the_documented_top_k(tiny, capsys, restore_threads):
    code, out, err = run(["generate", "--target", tiny.target, "--draft", tiny.head, "--tree", "dynamic", "--raw",
                          "--max-new-tokens", "4", "--ignore-eos", "w1 w2"], capsys)
    assert code == 0, err
    assert "--tree dynamic: --topk 8" in err


def test_the_library_error_for_a_dynamic_tree_without_topk_names_the_flag():
    from specdec.policies.shapes import dynamic

    with pytest.raises(ConfigError, match=r"needs topk >= 1 .*--topk.*got None; EAGLE-2 uses topk=8"):
        dynamic(SpecConfig(tree="dynamic"), samples=False)


# ----------------------------------------------------------------------------- 3. checked before loading
def test_a_head_drafter_without_a_draft_names_the_flag_before_loading(tiny, capsys, no_loading):
    for drafter, alias in (("eagle3", "smollm2-eagle3"), ("mtp", "smollm2-mtp")):
        code, _, err = run(["generate", "--target", tiny.target, "--drafter", drafter, "w1"], capsys)
        assert code == 2, err
        assert f"--drafter {drafter} runs a draft head: pass --draft PATH" in err and alias in err
        assert "from_pretrained" not in err and len(err.strip().splitlines()) == 1


def test_a_folder_without_a_head_is_refused_before_loading(tiny, capsys, no_loading, tmp_path):
    empty = tmp_path / "not-a-head"
    empty.mkdir()
    for extra in ([], ["--drafter", "eagle3"]):
        code, _, err = run(["generate", "--target", tiny.target, "--draft", str(empty), *extra, "w1"], capsys)
        assert code == 2 and f"--draft {empty}: no draft head in this folder (no config.json)" in err, err
    (empty / "config.json").write_text('{"architectures": ["Something"]}')
    code, _, err = run(["generate", "--target", tiny.target, "--draft", str(empty), "w1"], capsys)
    assert code == 2 and "pass --drafter (eagle3 or mtp" in err
    code, _, err = run(["generate", "--target", tiny.target, "--draft", str(empty / "config.json"), "w1"], capsys)
    assert code == 2 and "a draft head is a folder" in err


# ----------------------------------------------------------------------------- 4. specdec serve
def test_serve_with_no_arguments_serves_the_shipped_smollm2_with_its_eagle3_head(monkeypatch, capsys):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    seen = {}

    class Stop(Exception):
        pass

    def fake_load(args, config):
        seen.update(target=args.target, draft=args.draft, target_path=args.target_path, config=config,
                    log_level=args.log_level)
        raise Stop

    monkeypatch.setattr(cli, "load_decoder", fake_load)
    with pytest.raises(Stop):
        cli.main(["serve"])
    assert seen["target"] == "smollm2" and seen["draft"] == "smollm2-eagle3"
    assert seen["target_path"].name.endswith(".gguf")
    assert seen["config"].drafter == "eagle3" and seen["config"].verifier == "target-only"
    assert seen["log_level"] == "info"
    seen.clear()
    with pytest.raises(Stop):  # another target: no head unless asked for
        cli.main(["serve", "--target", "smollm2", "--log-level", "warning"])
    assert seen["draft"] is None and seen["config"].drafter == "none" and seen["log_level"] == "warning"


# ----------------------------------------------------------------------------- 5. the rest
def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and re.fullmatch(r"specdec \S+\n", out)


@pytest.mark.parametrize("argv, message", [
    (["generat", "x"], r"invalid choice: 'generat' .*; did you mean generate\?"),
    (["generate", "--target", "t", "--topkk", "3", "x"], r"unrecognized argument: --topkk; did you mean --topk\?"),
    (["generate", "--target", "t", "--max-new-tokns=3", "x"], r"unrecognized argument: --max-new-tokns; did you mean --max-new-tokens\?"),
    (["generate", "--target", "t", "--dtype", "bf16", "x"], r"invalid choice: 'bf16' .*; did you mean bfloat16\?"),
])
def test_misspelled_commands_and_flags_get_a_suggestion(capsys, argv, message):
    code, _, err = run(argv, capsys)
    assert code == 2 and re.search(message, err), err
    assert len(err.strip().splitlines()) == 1


def test_misspelled_strategy_names_get_a_suggestion(tiny, capsys, no_loading):
    code, _, err = run(["generate", "--target", tiny.target, "--verifier", "target_only", "w1"], capsys)
    assert code == 2 and "did you mean target-only?" in err


def test_help_speaks_in_user_terms(capsys):
    code, out, _ = run(["generate", "--help"], capsys)
    assert code == 0
    for internal in ("__post_init__", "1-tuple", "bare id"):
        assert internal not in out


def test_plugins_is_a_table_of_plugin_kind_and_name(capsys):
    code, out, _ = run(["plugins"], capsys)
    lines = [line.split() for line in out.strip().splitlines()]
    assert code == 0 and lines[0] == ["plugin", "kind", "name"]
    assert ["specdec.plugins.greedy", "verifier", "greedy"] in lines
    assert ["specdec.plugins.tree_policies", "tree", "dynamic"] in lines
    assert ["specdec.plugins.eagle3", "drafter", "eagle3"] in lines


def test_top_level_help_and_version_do_not_import_torch():
    code = ("import sys; from specdec.entrypoints.cli import main\n"
            "for argv in (['--help'], ['--version']):\n"
            "    try: main(argv)\n"
            "    except SystemExit: pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "generate" in done.stdout and "specdec " in done.stdout


def test_the_gguf_reader_is_a_dependency_and_its_absence_one_line(tmp_path, monkeypatch):
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "gguf" for d in deps)
    import importlib.util

    import specdec.models.gguf as gguf_module

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(gguf_module.importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs the gguf package .*pip install 'gguf>=0.10'"):
        gguf_module.convert_gguf(fake, root=tmp_path / "cache")
