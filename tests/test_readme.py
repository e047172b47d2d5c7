"""The README's Python examples run as written: what a new user copies first must work.

Each example is taken from README.md itself (its ```python blocks, found by a line they
contain), so an edit that breaks one fails here:
- "Compose strategies" and the streaming example: the shipped SmolLM2-135M-Instruct and its
  EAGLE-3 head on the CPU, a sampled dynamic tree; the answer comes back lossless;
- "Write a tree policy": the README's `BinaryPolicy` makes every tensor on the device of its
  inputs (a policy that built its indices on the CPU would break on a GPU); registered as a
  user would, it decodes equal to target-only beside the example plugin's twin
  (tests/policies/test_tree_policies.py).
"""

from __future__ import annotations

import re

import pytest
import torch

from _readme import python_block, readme_policy_plugin


@pytest.mark.slow  # the real 135M model (`pytest -m "not slow"` leaves it out)
def test_the_composition_and_streaming_examples_run(smollm2, monkeypatch, capsys):
    _, folder = smollm2
    monkeypatch.setenv("SPECDEC_CACHE", str(folder.parent.parent))  # the session's converted folder, not the user's cache
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the ops' torch references (interpreted kernels: their own suites)
    scope: dict = {}
    exec(compile(python_block("SpecDecoder.from_pretrained(smollm2_gguf_path()"), "README: compose", "exec"), scope)
    out = scope["out"]
    assert len(out) == 1 and out[0].text.strip() and out[0].stats.lossless
    assert out[0].stats.mean_accept_length >= 1.0
    exec(compile(python_block("dec.stream("), "README: stream", "exec"), scope)
    printed = capsys.readouterr().out
    # the streaming block prints `index, repr(text), finish_reason` per delta; both prompts finish
    finished = {int(line.split()[0]) for line in printed.splitlines() if re.match(r"^[01] .* (eos|stop|length)$", line)}
    assert finished == {0, 1}, printed[-2000:]


def test_the_tree_policy_example_makes_its_indices_on_the_scores_device():
    """`_pick` / `_select` must build their index tensors where the scores live: on a GPU a
    CPU `torch.arange` fails inside the step. Checked on the 'meta' device, which no CPU
    tensor can stand in for."""
    policy = readme_policy_plugin().BinaryPolicy(3)
    assert policy._pick(1, torch.empty(2, 4, device="meta")).device.type == "meta"
    assert policy._select(torch.empty(2, 14, device="meta")).device.type == "meta"
