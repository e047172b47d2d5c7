"""Test helpers for the `specdec` command: a tiny chat target with a random EAGLE-3 head,
`run(argv)` in-process, and `no_loading` (any weight load fails the test).

Not a test module (leading underscore). Used by test_cli.py and test_first_contact.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import specdec.models
from specdec import SpecDecoder
from specdec.entrypoints.cli import main
from specdec.drafters.eagle3_checkpoint import save_eagle3

from _chat_tokenizer import save_chat_tokenizer
from _eagle3_heads import random_head
from _tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    target = tmp_path_factory.mktemp("cli_target")
    make_checkpoint("llama", target, num_hidden_layers=6)
    save_chat_tokenizer(target)
    head = tmp_path_factory.mktemp("cli_head")
    save_eagle3(random_head(hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 2, 3)), head)
    return SimpleNamespace(target=str(target), head=str(head))


def run(argv, capsys) -> tuple[int, str, str]:
    """`specdec ARGV` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if any target weights are loaded or any decoder is built."""

    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the flags were checked")

    monkeypatch.setattr(specdec.models, "load_target", refuse)
    monkeypatch.setattr(SpecDecoder, "from_pretrained", refuse)
