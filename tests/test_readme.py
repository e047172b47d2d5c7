"""The README's Python examples run as written: what a new user copies first must work.

Each example is taken from README.md itself (its ```python blocks, found by a line they
contain), so an edit that breaks one fails here:
- "Compose strategies" and the streaming example: the shipped SmolLM2-135M-Instruct and its
  EAGLE-3 head on the CPU, a sampled dynamic tree; the answer comes back lossless;
- "Write a tree policy": the README's `BinaryPolicy` plugin, registered as the user would, and
  decoding through the EAGLE-3 drafter equal to target-only token for token, with every
  tensor it makes on the device of its inputs (a policy that built its indices on the CPU
  would break on a GPU).
"""

from __future__ import annotations

import os
import re
import types
from pathlib import Path

import pytest
import torch

from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.registry import get_plugin_manager
from specdec.testing.check_drafters import builtin_options, tiny_target
from specdec.testing.kit import references_on_cpu

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block(containing: str) -> str:
    """The README's one ```python block with a line containing `containing`."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"README.md has {len(found)} python blocks containing {containing!r}"
    return found[0]


@pytest.mark.slow  # the real 135M model (`pytest -m "not slow"` leaves it out)
def test_the_composition_and_streaming_examples_run(tmp_path, monkeypatch, capsys):
    if not os.environ.get("SPECDEC_CACHE"):  # the GGUF's converted folder: not the user's cache
        monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
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


def _readme_policy_plugin() -> types.ModuleType:
    """The README's tree-policy example as a plugin module, as `pip install` would expose it."""
    module = types.ModuleType("readme_binary_policy")
    exec(compile(python_block("class BinaryPolicy(FrontierPolicy)"), "README: tree policy", "exec"), module.__dict__)
    return module


def test_the_tree_policy_example_decodes_losslessly():
    plugin = _readme_policy_plugin()
    manager = get_plugin_manager(load_entrypoints=False)
    manager.register(plugin)
    assert plugin.specdec_strategy_names() == {"tree": ["binary"]}
    target = tiny_target("cpu")
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8, 9, 7], [30]]
    sampling = SamplingParams(max_new_tokens=16, ignore_eos=True)
    fields = dict(max_batch_size=2, max_seq_len=96, kv_block_size=4, compile=False, cuda_graphs=False)
    with references_on_cpu("cpu"):
        plain = SpecDecoder(target, SpecConfig(**fields))
        dec = SpecDecoder(target, SpecConfig(**fields, drafter="eagle3", tree="binary", max_draft_len=3,
                                             max_total_draft_tokens=14, plugin_options=builtin_options("eagle3")),
                          pm=manager)
        assert type(dec.strategies.tree_policy).__module__ == "readme_binary_policy"
        want = [r.token_ids for r in plain.generate(prompts, sampling)]
        got = dec.generate(prompts, sampling)
    assert [r.token_ids for r in got] == want
    assert all(r.stats.mean_accept_length >= 1.0 for r in got)


def test_the_tree_policy_example_makes_its_indices_on_the_scores_device():
    """`_pick` / `_select` must build their index tensors where the scores live: on a GPU a
    CPU `torch.arange` fails inside the step. Checked on the 'meta' device, which no CPU
    tensor can stand in for."""
    policy = _readme_policy_plugin().BinaryPolicy(3)
    assert policy._pick(1, torch.empty(2, 4, device="meta")).device.type == "meta"
    assert policy._select(torch.empty(2, 14, device="meta")).device.type == "meta"
