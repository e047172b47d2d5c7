"""The plugin system: built-ins, hook documentation, unknown names, third-party entry points."""

import inspect

import pytest
import torch

import specdec
from specdec import hookspecs
from specdec.registry import UnknownStrategyError, get_plugin_manager, resolve, strategy_names
from specdec.strategies import TargetInfo

TINY = TargetInfo(num_layers=8, hidden_size=16, vocab_size=32)


def test_every_hook_is_documented_and_prefixed():
    hooks = [f for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("specdec_")]
    assert {f.__name__ for f in hooks} >= {
        "specdec_capture_layers",
        "specdec_draft",
        "specdec_build_tree",
        "specdec_verify",
        "specdec_relocate_kv",
        "specdec_strategy_names",
    }
    for f in hooks:
        assert f.__doc__ and len(f.__doc__.strip()) > 80, f"{f.__name__} needs a docstring with its contract"


def test_builtin_plugins_register_and_pass_check_pending():
    pm = get_plugin_manager(load_entrypoints=False)
    names = [name for name, _ in pm.list_name_plugin()]
    assert names == list(specdec.plugins.BUILTIN_PLUGINS)
    pm.check_pending()


def test_builtin_strategy_names_cover_the_documented_ones():
    names = strategy_names(get_plugin_manager(load_entrypoints=False))
    assert {"none", "eagle3"} <= set(names["drafter"])
    assert {"greedy", "target-only", "speculative"} <= set(names["verifier"])


@pytest.mark.parametrize("kind", ["drafter", "verifier"])
def test_unknown_strategy_name_lists_the_available_names(kind):
    config = specdec.SpecConfig(**{kind: "no-such-thing"})
    with pytest.raises(UnknownStrategyError, match=rf"{kind}='no-such-thing' is not provided by any plugin; available: \["):
        resolve(config, TINY, get_plugin_manager(load_entrypoints=False))


def test_third_party_plugin_is_discovered_through_its_entry_point(installed_example_plugin):
    pm = get_plugin_manager()
    assert "top2" in [name for name, _ in pm.list_name_plugin()]
    assert "top2" in strategy_names(pm)["verifier"]
    assert "top2" not in strategy_names(get_plugin_manager(load_entrypoints=False)).get("verifier", [])


def test_third_party_verifier_is_selectable_by_name(installed_example_plugin):
    pm = get_plugin_manager()
    config = specdec.SpecConfig(verifier="top2")
    verifier = pm.hook.specdec_verify(config=config)
    assert type(verifier).__name__ == "Top2Verifier" and verifier.lossless is False
    # It works on a chain: drafts 5, 6 at nodes 1, 2; the target's top-2 at the root holds 5.
    tokens = torch.tensor([[4, 5, 6]])
    tree = specdec.ops.build_tree(torch.tensor([[-1, 0, 1]]), torch.tensor([3]))
    logits = torch.full((1, 3, 10), -5.0)
    logits[0, 0, 5], logits[0, 0, 1] = 1.0, 2.0  # root: 1 then 5 in the top-2 -> accept node 1
    logits[0, 1, 7], logits[0, 1, 8] = 2.0, 1.0  # node 1: 6 not in top-2 -> stop, bonus 7
    acc = verifier(tokens, tree, logits, None)
    assert acc.accept_length.tolist() == [1]
    assert acc.accept_nodes[0, :2].tolist() == [0, 1]
    assert acc.accept_tokens[0, :2].tolist() == [5, 7]


def test_plugin_options_helpers_name_the_bad_key_or_value():
    import torch

    from specdec.config import ConfigError, SpecConfig
    from specdec.plugins.options import device_and_dtype, plugin_options

    assert plugin_options(SpecConfig(), "mine", {"a"}) == {}
    with pytest.raises(ConfigError, match=r"plugin_options\['mine'\] must be a dict, got list"):
        plugin_options(SpecConfig(plugin_options={"mine": [1]}), "mine")
    with pytest.raises(ConfigError, match=r"plugin_options\['mine'\] has unknown keys \['b'\]; allowed: \['a'\]"):
        plugin_options(SpecConfig(plugin_options={"mine": {"a": 1, "b": 2}}), "mine", {"a"})
    assert device_and_dtype({"dtype": "bfloat16"}, None, "mine") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(ConfigError, match=r"plugin_options\['mine'\]\['dtype'\]='float33' is not a torch dtype"):
        device_and_dtype({"dtype": "float33"}, None, "mine")
