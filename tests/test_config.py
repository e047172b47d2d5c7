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
    assert SpecConfig(tree="dynamic", topk=8, max_draft_len=6).shape.max_total_draft_tokens == 48
    assert SpecConfig(max_draft_len=5).shape.max_total_draft_tokens == 5
    assert SpecConfig(tree="dynamic", topk=8, max_draft_len=6).shape.num_tree_slots == 49


@pytest.mark.parametrize("total", [5, 49])
def test_max_total_draft_tokens_must_lie_between_depth_and_topk_times_depth(total):
    with pytest.raises(ConfigError, match=rf"max_total_draft_tokens={total} is out of range; allowed: \[6, 48\]"):
        policy(tree="dynamic", topk=8, max_draft_len=6, max_total_draft_tokens=total)
    with pytest.raises(ConfigError, match=r"max_total_draft_tokens=0 is out of range; allowed: \[1, 4095\]"):
        SpecConfig(max_total_draft_tokens=0)


def test_replace_recomputes_the_derived_budget():
    cfg = SpecConfig(tree="dynamic", topk=4, max_draft_len=3)
    assert cfg.replace(topk=8).shape.max_total_draft_tokens == 24
    assert cfg.replace(max_draft_len=5).replace(topk=2).shape.max_total_draft_tokens == 10  # derived, again and again
    assert cfg.replace(max_batch_size=2).shape.max_total_draft_tokens == 12


def test_replace_keeps_a_chosen_budget():
    cfg = SpecConfig(tree="dynamic", topk=4, max_draft_len=3, max_total_draft_tokens=7)
    assert cfg.replace(topk=8).shape.max_total_draft_tokens == 7  # the user's choice: never silently reset
    assert cfg.replace(max_draft_len=5).shape.max_total_draft_tokens == 7
    assert cfg.replace(max_total_draft_tokens=None, topk=2).shape.max_total_draft_tokens == 6  # asked to derive it
    assert cfg.replace(topk=8) == SpecConfig(tree="dynamic", topk=8, max_draft_len=3, max_total_draft_tokens=7)
    # a kept budget that the new shape cannot hold is a clear error, not a reset
    with pytest.raises(ConfigError, match=r"max_total_draft_tokens=7 is out of range; allowed: \[8, 32\]"):
        policy(**cfg.replace(max_draft_len=8).flat())


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


def test_flat_names_go_to_their_parts():
    from specdec.config import CacheConfig, ExecutionConfig, ScheduleConfig, TreeShape

    cfg = SpecConfig(drafter="eagle3", tree="dynamic", topk=8, max_draft_len=6, max_batch_size=4, max_seq_len=512,
                     prefill_chunk_size=64, adaptive=True, compile=False, graph_batch_sizes=(4, 1))
    assert cfg.shape == TreeShape(max_draft_len=6, topk=8, max_total_draft_tokens=48)
    assert cfg.cache == CacheConfig(max_batch_size=4, max_seq_len=512)
    assert cfg.schedule == ScheduleConfig(prefill_chunk_size=64, adaptive=True)
    assert cfg.execution == ExecutionConfig(compile=False, graph_batch_sizes=(1, 4))
    assert cfg.batch_buckets == (1, 4) and cfg.cache.total_kv_blocks == 4 * 32
    # whole parts build the same config; the flat view rebuilds it
    same = SpecConfig(drafter="eagle3", tree="dynamic", shape=cfg.shape, cache=cfg.cache, schedule=cfg.schedule,
                      execution=cfg.execution)
    assert same == cfg and SpecConfig(**cfg.flat()) == cfg
    assert set(cfg.flat()) == {"drafter", "tree", "verifier", "layers_to_capture", "plugin_options", "max_draft_len",
                               "topk", "max_total_draft_tokens", "max_batch_size", "max_seq_len", "kv_block_size",
                               "num_kv_blocks", "prefill_chunk_size", "prefill_tokens_per_step", "kv_lookahead_steps", "adaptive",
                                   "overlap",
                               "compile", "cuda_graphs", "graph_batch_sizes", "threads", "combo_kernels",
                               "small_linear"}


def test_unknown_names_and_a_part_set_twice_are_errors():
    from specdec.config import CacheConfig

    with pytest.raises(ConfigError, match=r"SpecConfig has no setting 'max_batch'; allowed: \[.*'max_batch_size'"):
        SpecConfig(max_batch=4)
    with pytest.raises(ConfigError, match=r"SpecConfig has no setting 'depth'; allowed:"):
        SpecConfig().replace(depth=3)
    with pytest.raises(ConfigError, match=r"cache= and \['max_seq_len'\] both set the cache part"):
        SpecConfig(cache=CacheConfig(), max_seq_len=64)
    with pytest.raises(ConfigError, match=r"cache must be a CacheConfig, got 4 \(int\)"):
        SpecConfig(cache=4)
    with pytest.raises(ConfigError, match=r"max_batch_size=0 is out of range"):
        CacheConfig(max_batch_size=0)  # a part checks its own fields


def test_replace_changes_only_what_it_names():
    cfg = SpecConfig(drafter="eagle3", max_batch_size=4, max_seq_len=256, adaptive=True, cuda_graphs=False,
                     graph_batch_sizes=(2, 4), plugin_options={"eagle3": {"x": 1}})
    new = cfg.replace(max_seq_len=512, tree="static")
    assert new.cache.max_seq_len == 512 and new.tree == "static"
    assert new.flat() == {**cfg.flat(), "max_seq_len": 512, "tree": "static"}
    # a cross-part rule is checked on the copy: the buckets must end at the new batch size
    with pytest.raises(ConfigError, match=r"graph_batch_sizes=\(2, 4\) must include max_batch_size=8"):
        cfg.replace(max_batch_size=8)
    # the tree size must stay below the context, whichever part changes
    with pytest.raises(ConfigError, match=r"max_seq_len=6 must exceed the tree slots N=6"):
        SpecConfig(max_draft_len=5).replace(max_seq_len=6)


def test_no_source_reads_a_setting_outside_its_part():
    """`config.max_batch_size` would raise only when its line runs, and some lines run only on
    CUDA (CI has none): every read of a part's setting through a name `config` / `cfg` goes
    through the part, checked here on the source itself."""
    import ast
    import pathlib

    import specdec
    from specdec.config import PART_OF

    root = pathlib.Path(specdec.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr in PART_OF):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
            if name in ("config", "spec_config", "base") and not (path.name == "config.py"):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: {name}.{node.attr}")
    assert not bad, "reads of a part's setting on the config itself (use config.<part>.<name>):\n" + "\n".join(bad)
