"""`specdec.strategy_hook` / `specdec.declared_names`: a named strategy's hook answers for its
own name only (the kind read off the hook's name), the names are declared from the hooks, and
a plugin written with them resolves and decodes like a hand-written one."""

import importlib
import types

import pytest
import torch

import specdec
from specdec import SpecConfig, declared_names, strategy_hook
from specdec.plugin_helpers import GUARDED_HOOKS
from specdec.plugins import BUILTIN_PLUGINS
from specdec.plugins.greedy import GreedyVerifier
from specdec.registry import get_plugin_manager, resolve, strategy_names
from specdec.strategies import TargetInfo

TINY = TargetInfo(num_layers=8, hidden_size=16, vocab_size=32)


def test_a_guarded_hook_answers_for_its_names_only_positionally_or_by_keyword():
    @strategy_hook("mine", "mine-too")
    def specdec_verify(config):
        return ("built", config.verifier)

    assert specdec_verify(SpecConfig(verifier="mine")) == ("built", "mine")
    assert specdec_verify(config=SpecConfig(verifier="mine-too")) == ("built", "mine-too")
    assert specdec_verify(SpecConfig(verifier="greedy")) is None
    assert specdec_verify.__name__ == "specdec_verify"


@pytest.mark.parametrize("hook, field", sorted(GUARDED_HOOKS.items()))
def test_the_kind_is_read_off_the_hook_name(hook, field):
    def fn(config, *rest):
        return "answered"

    fn.__name__ = hook
    guarded = strategy_hook("mine")(fn)
    others = {"drafter": "none", "tree": "linear", "verifier": "greedy"}
    assert guarded(SpecConfig(**{**others, field: "mine"}), None, None, None) == "answered"
    assert guarded(SpecConfig(**others), None, None, None) is None  # another name of the same kind
    for other_field in set(others) - {field}:  # the name under another kind does not count
        assert guarded(SpecConfig(**{**others, other_field: "mine"}), None, None, None) is None


def test_bad_uses_are_type_errors_that_say_what_is_allowed():
    with pytest.raises(TypeError, match=r"cannot guard 'specdec_build_tree'; allowed: functions named \["):
        @strategy_hook("mine")
        def specdec_build_tree(config):
            return None
    with pytest.raises(TypeError, match=r"specdec_verify must take `config` as its first argument, got \(cfg\)"):
        @strategy_hook("mine")
        def specdec_verify(cfg):
            return None
    with pytest.raises(TypeError, match="one or more non-empty strategy names"):
        strategy_hook()
    with pytest.raises(TypeError, match="one or more non-empty strategy names"):
        strategy_hook("")
    with pytest.raises(TypeError, match="declared_names takes hooks made by strategy_hook, got 'plain'"):
        def plain(config):
            return None
        declared_names(plain)


def test_declared_names_gather_every_hooks_names_by_kind_once():
    @strategy_hook("a", "b")
    def specdec_tree_policy(config, verifier):
        return None

    @strategy_hook("d")
    def specdec_draft(config, target):
        return None

    @strategy_hook("d")
    def specdec_capture_layers(config, target):
        return ()

    names = declared_names(specdec_tree_policy, specdec_draft, specdec_capture_layers)
    assert names() == {"tree": ["a", "b"], "drafter": ["d"]}
    assert names() is not names()  # a caller may change its copy


class _EveryRowGreedy:
    """A greedy verifier under a new name: lossless, so the decode below must be exact."""

    lossless, needs_draft_probs, greedy_only = True, False, True

    def __call__(self, tokens, tree, target_logits, sampling=None, *, uniforms=None, draft_probs=None):
        return specdec.ops.verify_greedy(tokens, tree, target_logits)


def _newcomers_plugin():
    """A newcomer's plugin: a tree policy and a verifier, a few lines each with the helpers."""
    from specdec.policies.shapes import builtin

    @strategy_hook("my-chain")
    def specdec_tree_policy(config, verifier):
        return builtin(config.replace(tree="linear"), samples=verifier.needs_draft_probs)

    @strategy_hook("my-greedy")
    def specdec_verify(config):
        return _EveryRowGreedy()

    return types.SimpleNamespace(specdec_tree_policy=specdec_tree_policy, specdec_verify=specdec_verify,
                                 specdec_strategy_names=declared_names(specdec_tree_policy, specdec_verify))


def test_a_plugin_written_with_the_helpers_resolves_by_name():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(_newcomers_plugin(), name="newcomer")
    names = strategy_names(pm)
    assert "my-chain" in names["tree"] and "my-greedy" in names["verifier"]
    strategies = resolve(SpecConfig(tree="my-chain", verifier="my-greedy"), TINY, pm)
    assert isinstance(strategies.verifier, _EveryRowGreedy)
    assert isinstance(resolve(SpecConfig(), TINY, pm).verifier, GreedyVerifier)


def test_a_plugin_written_with_the_helpers_decodes_exactly(tmp_path):
    from _eagle3_heads import saved_tiny_head
    from _tiny_models import make_checkpoint

    make_checkpoint("llama", tmp_path / "t", num_hidden_layers=4, seed=3)
    saved_tiny_head(tmp_path / "h", seed=1, capture_layers=(1, 2, 3), std=0.1)
    target = specdec.load_target(tmp_path / "t", device="cpu")
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    plain = specdec.SpecDecoder.from_pretrained(target, None, SpecConfig(max_batch_size=2, max_seq_len=64, compile=False))
    want = [r.token_ids for r in plain.generate(prompts, specdec.SamplingParams(max_new_tokens=12))]
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(_newcomers_plugin(), name="newcomer")
    config = SpecConfig(drafter="eagle3", tree="my-chain", verifier="my-greedy", max_draft_len=3,
                        max_batch_size=2, max_seq_len=64, compile=False)
    ours = specdec.SpecDecoder.from_pretrained(target, tmp_path / "h", config, pm=pm)
    assert [r.token_ids for r in ours.generate(prompts, specdec.SamplingParams(max_new_tokens=12))] == want


@pytest.mark.parametrize("module_name", BUILTIN_PLUGINS)
def test_every_builtin_named_hook_answers_none_for_a_name_it_does_not_declare(module_name):
    module = importlib.import_module(module_name)
    config = SpecConfig(drafter="not-mine", tree="not-mine", verifier="not-mine")
    for hook in GUARDED_HOOKS:
        fn = getattr(module, hook, None)
        if fn is not None:
            assert getattr(fn, "specdec_strategy", None), f"{module_name}.{hook} is not guarded by strategy_hook"
            assert fn(config, None, None, None) is None
