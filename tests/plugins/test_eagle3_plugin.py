"""The eagle3 plugin: capture layers from the checkpoint, building the drafter, bad heads, and
greedy generation through `SpecDecoder` that equals target-only decoding (random head)."""

import dataclasses

import pytest
import torch

from specdec import SamplingParams, SpecConfig
from specdec.config import ConfigError
from specdec.drafters.capture_conventions import CaptureConventionError
from specdec.drafters.eagle3_checkpoint import Eagle3CheckpointError, save_eagle3
from specdec.drafters.eagle3_drafter import Eagle3Drafter
from specdec.plugins import eagle3 as plugin
from specdec.strategies import TargetInfo

from _eagle3_heads import random_head

D, L, V = 64, 8, 96  # the tiny target of _tiny_models with 8 layers


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from _tiny_models import make_checkpoint

    from specdec.models import load_target

    folder = tmp_path_factory.mktemp("target")
    make_checkpoint("llama", folder, num_hidden_layers=L)
    return load_target(folder)


@pytest.fixture(scope="module")
def head_path(tmp_path_factory):
    folder = tmp_path_factory.mktemp("head")
    save_eagle3(random_head(hidden_size=D, target_hidden_size=D, head_dim=16, capture_layers=(1, 3, 4), std=0.1), folder)
    return folder


def cfg(head, **kw):
    return SpecConfig(drafter="eagle3", max_batch_size=2, max_seq_len=64, plugin_options={"eagle3": {"checkpoint": head}}, **kw)


def draft(config, info):
    """The plugin's hook, called as the resolver calls it: with the tree policy and the verifier's capabilities."""
    from specdec.registry import get_plugin_manager, resolve_tree_policy, verifier_caps

    pm = get_plugin_manager(load_entrypoints=False)
    caps = verifier_caps(pm.hook.specdec_verify(config=config))
    return plugin.specdec_draft(config, info, resolve_tree_policy(config, caps, pm), caps)


def test_capture_layers_come_from_the_checkpoint_and_input_convention_ids_are_caught(head_path):
    info = TargetInfo(num_layers=L, hidden_size=D, vocab_size=V)
    assert plugin.specdec_capture_layers(cfg(head_path), info) == (1, 3, 4)
    assert plugin.specdec_capture_layers(cfg(head_path, layers_to_capture=(4, 1, 3)), info) == (1, 3, 4)
    with pytest.raises(CaptureConventionError, match="'input' convention"):
        plugin.specdec_capture_layers(cfg(head_path, layers_to_capture=(2, 4, 5)), info)
    assert plugin.specdec_capture_layers(SpecConfig(drafter="none"), info) is None


def test_the_plugin_builds_a_drafter_sharing_the_targets_embedding(target, head_path):
    drafter = draft(cfg(head_path, tree="dynamic", topk=2), target.info)
    assert isinstance(drafter, Eagle3Drafter)
    assert drafter.reads == "captured" and not drafter.samples_drafts
    # the target's table itself (a plain lookup: its draft glue reads it in place), not a copy
    assert drafter.num_tree_slots == 2 * 5 + 1 and drafter.embed is target.model.embed_tokens
    assert drafter._lookup is target.model.embed_tokens
    sampled = draft(cfg(head_path, verifier="speculative"), target.info)
    assert sampled.samples_drafts
    model_obj = random_head(hidden_size=D, target_hidden_size=D, head_dim=16, capture_layers=(1, 3, 4))
    options = {"eagle3": {"model": model_obj, "seed": 3}}
    built = draft(dataclasses.replace(cfg(head_path), plugin_options=options), target.info)
    assert built.model is model_obj


def test_bad_heads_and_options_are_clear_errors(target, head_path, tmp_path):
    wrong = tmp_path / "wrong"
    save_eagle3(random_head(capture_layers=(1, 3, 4)), wrong)  # hidden 32, target has 64
    with pytest.raises(Eagle3CheckpointError, match="target_hidden_size=32, but the target's hidden_size is 64"):
        draft(cfg(wrong), target.info)
    with pytest.raises(ConfigError, match="needs a head"):
        draft(SpecConfig(drafter="eagle3"), target.info)
    with pytest.raises(ConfigError, match=r"unknown keys \['chekpoint'\]"):
        draft(SpecConfig(drafter="eagle3", plugin_options={"eagle3": {"chekpoint": head_path}}), target.info)
    with pytest.raises(ConfigError, match="shares the target's embeddings"):
        draft(cfg(head_path), dataclasses.replace(target.info, model=None))


@pytest.mark.parametrize("tree, topk", [("linear", None), ("dynamic", 3)])
def test_greedy_generation_with_a_random_head_equals_target_only_decoding(target, head_path, tree, topk):
    from specdec.entrypoints.decoder import SpecDecoder

    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15]]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    base = SpecDecoder.from_pretrained(target, None, SpecConfig(drafter="none", max_batch_size=2, max_seq_len=64))
    config = SpecConfig(drafter="eagle3", tree=tree, topk=topk, max_draft_len=3, max_batch_size=2, max_seq_len=64)
    spec = SpecDecoder.from_pretrained(target, head_path, config)
    for ref, out in zip(base.generate(prompts, params), spec.generate(prompts, params)):
        assert out.token_ids == ref.token_ids
        assert out.stats.steps >= 1 and len(out.token_ids) == 16
