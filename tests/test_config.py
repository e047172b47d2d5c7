"""Every validation rule of SpecConfig / SamplingParams / capture layers, with its message."""

import dataclasses

import pytest

from specdec import ConfigError, SamplingParams, SpecConfig, resolve_capture_layers


def test_default_capture_layers_follow_the_seed():
    assert resolve_capture_layers(30, None) == (1, 14, 26)
    assert resolve_capture_layers(7, None) == (1, 2, 3)


def test_default_capture_layers_never_overlap_silently():
    with pytest.raises(ConfigError, match=r"for L=6 are \(1, 2, 2\), not distinct"):
        resolve_capture_layers(6, None)


@pytest.mark.parametrize("num_layers", [1, 3, 5])
def test_default_capture_layers_reject_five_layers_or_fewer(num_layers):
    with pytest.raises(ConfigError, match=rf"L > 5, got L={num_layers}"):
        resolve_capture_layers(num_layers, None)


def test_explicit_capture_layers_are_sorted():
    cfg = SpecConfig(layers_to_capture=(9, 1, 4))
    assert cfg.layers_to_capture == (1, 4, 9)
    assert resolve_capture_layers(10, cfg.layers_to_capture) == (1, 4, 9)


def test_explicit_capture_layers_reject_duplicates():
    with pytest.raises(ConfigError, match=r"duplicates"):
        SpecConfig(layers_to_capture=(1, 4, 4))


def test_explicit_capture_layer_outside_the_target_names_the_range():
    with pytest.raises(ConfigError, match=r"capture layer 12 is out of range; allowed: \[0, 12\)"):
        resolve_capture_layers(12, (1, 5, 12))
    with pytest.raises(ConfigError, match=r"ints >= 0, got -1"):
        SpecConfig(layers_to_capture=(-1, 3))


# Which tree names exist and which knobs each takes are the tree policy's rules (plugins add
# policies), so these checks run when the policy is resolved (`registry.resolve_tree_policy`,
# called by `resolve` and so by `SpecDecoder`), not in SpecConfig itself.
def policy(**kw):
    from specdec.registry import get_plugin_manager, resolve_tree_policy

    return resolve_tree_policy(SpecConfig(**kw), pm=get_plugin_manager(load_entrypoints=False))


def test_dynamic_tree_requires_topk():
    with pytest.raises(ConfigError, match=r"tree='dynamic' needs topk >= 1"):
        policy(tree="dynamic")
    with pytest.raises(ConfigError, match=r"topk=0 is out of range; allowed: \[1, 64\]"):
        SpecConfig(tree="dynamic", topk=0)


def test_topk_without_dynamic_tree_is_an_error():
    with pytest.raises(ConfigError, match=r"topk=4 does not apply to tree='linear'"):
        policy(tree="linear", topk=4)
    with pytest.raises(ConfigError, match=r"topk=2 does not apply to tree='static'"):
        policy(tree="static", topk=2)


def test_max_total_draft_tokens_defaults_to_topk_times_depth():
    assert SpecConfig(tree="dynamic", topk=8, max_draft_len=6).max_total_draft_tokens == 48
    assert SpecConfig(max_draft_len=5).max_total_draft_tokens == 5
    assert SpecConfig(tree="dynamic", topk=8, max_draft_len=6).num_tree_slots == 49


@pytest.mark.parametrize("total", [5, 49])
def test_max_total_draft_tokens_must_lie_between_depth_and_topk_times_depth(total):
    with pytest.raises(ConfigError, match=rf"max_total_draft_tokens={total} is out of range; allowed: \[6, 48\]"):
        policy(tree="dynamic", topk=8, max_draft_len=6, max_total_draft_tokens=total)
    with pytest.raises(ConfigError, match=r"max_total_draft_tokens=0 is out of range; allowed: \[1, 4095\]"):
        SpecConfig(max_total_draft_tokens=0)


def test_replace_recomputes_the_derived_budget():
    cfg = SpecConfig(tree="dynamic", topk=4, max_draft_len=3)
    assert cfg.replace(topk=8).max_total_draft_tokens == 24
    assert cfg.replace(max_draft_len=5).replace(topk=2).max_total_draft_tokens == 10  # derived, again and again
    assert cfg.replace(max_batch_size=2).max_total_draft_tokens == 12


def test_replace_keeps_a_chosen_budget():
    cfg = SpecConfig(tree="dynamic", topk=4, max_draft_len=3, max_total_draft_tokens=7)
    assert cfg.replace(topk=8).max_total_draft_tokens == 7  # the user's choice: never silently reset
    assert cfg.replace(max_draft_len=5).max_total_draft_tokens == 7
    assert cfg.replace(max_total_draft_tokens=None, topk=2).max_total_draft_tokens == 6  # asked to derive it
    assert cfg.replace(topk=8) == SpecConfig(tree="dynamic", topk=8, max_draft_len=3, max_total_draft_tokens=7)
    # a kept budget that the new shape cannot hold is a clear error, not a reset
    with pytest.raises(ConfigError, match=r"max_total_draft_tokens=7 is out of range; allowed: \[8, 32\]"):
        policy(**{f.name: getattr(cfg.replace(max_draft_len=8), f.name) for f in dataclasses.fields(cfg) if f.init})


def test_unknown_tree_shape_lists_the_shapes():
    with pytest.raises(ConfigError, match=r"tree='bushy' is not provided by any plugin; available: \['dynamic', 'linear', 'sampled', 'static'\]"):
        policy(tree="bushy")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_draft_len", 0, r"max_draft_len=0 is out of range; allowed: \[1, 64\]"),
        ("max_batch_size", 0, r"max_batch_size=0 is out of range"),
        ("kv_block_size", 0, r"kv_block_size=0 is out of range"),
        ("max_seq_len", 1.5, r"max_seq_len must be an int, got 1.5"),
    ],
)
def test_capacities_out_of_range_name_the_value(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SpecConfig(**{field: value})


def test_max_seq_len_must_exceed_the_tree():
    with pytest.raises(ConfigError, match=r"max_seq_len=6 must exceed the tree slots N=6"):
        SpecConfig(max_seq_len=6, max_draft_len=5)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("temperature", -0.1, r"temperature=-0.1 is out of range; allowed: finite and >= 0"),
        ("temperature", float("nan"), r"temperature=nan is out of range"),
        ("top_k", -1, r"top_k=-1 is out of range; allowed: >= 0"),
        ("top_p", 0.0, r"top_p=0.0 is out of range; allowed: \(0, 1\]"),
        ("top_p", 1.5, r"top_p=1.5 is out of range; allowed: \(0, 1\]"),
        ("min_p", 1.1, r"min_p=1.1 is out of range; allowed: \[0, 1\]"),
        ("seed", -3, r"seed=-3 is out of range"),
        ("max_new_tokens", 0, r"max_new_tokens=0 is out of range; allowed: >= 1"),
        ("stop_token_ids", (3, -2), r"stop_token_ids entries must be token ids >= 0, got -2"),
    ],
)
def test_sampling_params_out_of_range_name_the_value(field, value, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**{field: value})


def test_sampling_params_defaults_are_greedy():
    params = SamplingParams()
    assert params.greedy and params.top_p == 1.0 and params.min_p == 0.0
    assert not SamplingParams(temperature=0.7).greedy
