"""EAGLE-3 checkpoints: official layout round trip, speculators / .bin layouts, strict errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.drafters.eagle3_checkpoint import (
    Eagle3CheckpointError,
    check_against_target,
    load_eagle3,
    read_eagle3_config,
    save_eagle3,
)
from specdec.models.config import RopeConfig
from specdec.strategies import TargetInfo

from _eagle3_heads import D_T, V, VD, random_head

LLAMA3_ROPE = RopeConfig(
    rope_type="llama3", theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
    original_max_position_embeddings=64,
)


def assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(fc_norm=True, norm_before_residual=True, rope=LLAMA3_ROPE),
        dict(has_embed_tokens=True, fc_bias=True, capture_layers=None, draft_vocab_size=V),
        dict(norm_before_fc=True, attention_bias=True, num_capture=2, capture_layers=(0, 3), target_hidden_size=24),
        dict(dtype=torch.bfloat16),
        dict(num_layers=3, fc_norm=True),
    ],
    ids=["plain", "fc_norm-llama3", "own-embed-full-vocab", "norm_before_fc-2-layers", "bf16", "three-draft-layers"],
)
def test_saved_head_reloads_bit_for_bit_with_the_same_config(tmp_path, kw):
    dtype = kw.pop("dtype", torch.float32)
    head = random_head(seed=3, dtype=dtype, **kw)
    save_eagle3(head, tmp_path)
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
    loaded = load_eagle3(tmp_path, dtype=dtype)
    assert loaded.config == head.config
    assert_same(head, loaded)
    assert read_eagle3_config(tmp_path) == head.config


def test_saved_layout_is_the_official_one(tmp_path):
    save_eagle3(random_head(), tmp_path)
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.self_attn.q_proj.weight",
            "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight"} <= keys
    assert not any("embed" in k for k in keys)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == VD and cfg["vocab_size"] == V
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]  # output convention
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["fc.weight"].shape == (D_T, 3 * D_T)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * D_T
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool


def test_heads_of_several_layers_save_in_the_speculators_layout(tmp_path):
    """layers.0 is the EAGLE-3 layer (QKV over [embed; hidden], hidden_norm), layers.1 a plain
    decoder layer; config num_hidden_layers 2; the same tensors as the model's."""
    head = random_head(seed=5, num_layers=2)
    save_eagle3(head, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert not any(k.startswith(("midlayer.", "later_layers.")) for k in tensors)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * D_T
    assert tensors["layers.1.self_attn.q_proj.weight"].shape[1] == D_T
    assert "layers.0.hidden_norm.weight" in tensors and "layers.1.hidden_norm.weight" not in tensors
    state = head.state_dict()
    assert torch.equal(tensors["layers.1.mlp.down_proj.weight"], state["later_layers.0.mlp.down_proj.weight"])
    assert json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"] == 2
    _rewrite(tmp_path, drop=["layers.1.mlp.up_proj.weight"])
    with pytest.raises(Eagle3CheckpointError, match=r"missing keys \['layers.1.mlp.up_proj.weight'\]"):
        load_eagle3(tmp_path)


def _rewrite(folder, *, drop=(), add=None, change=None, config=None):
    tensors = load_file(str(folder / "model.safetensors"))
    for k in drop:
        del tensors[k]
    tensors.update(add or {})
    for k, fn in (change or {}).items():
        tensors[k] = fn(tensors[k])
    save_file(tensors, str(folder / "model.safetensors"))
    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))


def test_speculators_layout_loads_with_input_convention_ids_converted(tmp_path):
    head = random_head(seed=1, norm_before_residual=True)
    save_eagle3(head, tmp_path / "official")
    official = load_file(str(tmp_path / "official" / "model.safetensors"))
    spec = tmp_path / "spec"
    spec.mkdir()
    renamed = {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in official.items()}
    save_file(renamed, str(spec / "model.safetensors"))
    cfg = json.loads((tmp_path / "official" / "config.json").read_text())
    layer_cfg = {k: v for k, v in cfg.items() if k not in ("eagle_config", "draft_vocab_size", "norm_before_residual", "target_hidden_size")}
    (spec / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": VD,
        "norm_before_residual": True,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": [2, 3, 5],  # input convention == output (1, 2, 4)
    }))
    loaded = load_eagle3(spec)
    assert loaded.config == head.config
    assert_same(head, loaded)


def test_pytorch_bin_checkpoints_load_too(tmp_path):
    head = random_head(seed=2)
    save_eagle3(head, tmp_path)
    torch.save(load_file(str(tmp_path / "model.safetensors")), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    assert_same(head, load_eagle3(tmp_path))


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(drop=["lm_head.weight"]), r"missing keys \['lm_head.weight'\]"),
        (dict(drop=["d2t"]), r"missing keys \['d2t'\]"),
        (dict(add={"midlayer.extra.weight": torch.zeros(2)}), r"unexpected keys \['midlayer.extra.weight'\]"),
        (dict(change={"norm.weight": lambda t: t[:-1]}), r"norm.weight has shape \(31,\); the config implies \(32,\)"),
        (dict(change={"d2t": lambda t: -torch.arange(VD)}, drop=["t2d"]), r"not injective: draft ids \[0, 1, 2, 3\] all map to target id 0"),
        (dict(change={"d2t": lambda t: t + V}), "out of range"),
        (dict(change={"t2d": lambda t: ~t}), "t2d disagrees with d2t"),
        (dict(change={"d2t": lambda t: t.float()}), "1-D integer tensor"),
        (dict(config=lambda c: c.update(num_hidden_layers=2)), r"missing keys \['layers.1.input_layernorm.weight', "),
        (dict(config=lambda c: c.update(num_hidden_layers=0)), "num_hidden_layers=0 must be an int >= 1"),
        (dict(config=lambda c: c.update(hidden_act="gelu")), "hidden_act='gelu'"),
        (dict(config=lambda c: c.update(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2]})), "names 2 capture layers"),
        (dict(config=lambda c: c.update(target_hidden_size=40)), "not a multiple of target_hidden_size=40"),
    ],
    ids=["missing-lm_head", "missing-d2t", "unexpected", "shape", "non-injective", "d2t-range", "t2d", "d2t-float",
         "two-layers-one-saved", "no-layers", "act", "layer-count", "target-hidden"],
)
def test_malformed_checkpoints_are_clear_errors(tmp_path, edit, message):
    save_eagle3(random_head(seed=4), tmp_path)
    _rewrite(tmp_path, **edit)
    with pytest.raises(Eagle3CheckpointError, match=message):
        load_eagle3(tmp_path)


def test_full_vocabulary_heads_may_omit_the_vocab_map(tmp_path):
    head = random_head(draft_vocab_size=V)
    save_eagle3(head, tmp_path)
    _rewrite(tmp_path, drop=["d2t", "t2d"])
    loaded = load_eagle3(tmp_path)
    assert torch.equal(loaded.d2t, torch.zeros(V, dtype=torch.int64)) and bool(loaded.t2d.all())


def test_a_head_for_another_target_is_rejected_naming_both_sizes():
    cfg = random_head().config
    ok = TargetInfo(num_layers=6, hidden_size=D_T, vocab_size=V)
    assert check_against_target(cfg, ok) == (1, 2, 4)
    with pytest.raises(Eagle3CheckpointError, match=f"target_hidden_size={D_T}, but the target's hidden_size is 64"):
        check_against_target(cfg, TargetInfo(num_layers=6, hidden_size=64, vocab_size=V))
    with pytest.raises(Eagle3CheckpointError, match=f"vocab_size={V} differs from the target's vocab_size=100"):
        check_against_target(cfg, TargetInfo(num_layers=6, hidden_size=D_T, vocab_size=100))
    with pytest.raises(Eagle3CheckpointError, match=r"capture layer 4 is out of range; allowed: \[0, 4\)"):
        check_against_target(cfg, TargetInfo(num_layers=4, hidden_size=D_T, vocab_size=V))


def test_loading_a_folder_without_weights_or_config_says_what_is_missing(tmp_path):
    with pytest.raises(Eagle3CheckpointError, match="not a folder"):
        load_eagle3(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(Eagle3CheckpointError, match="no weights found"):
        load_eagle3(tmp_path)
