"""MTP checkpoints: the standalone layout round trip, the MiMo layout, strict key and shape checks."""

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.drafters.mtp_checkpoint import (
    MTPCheckpointError,
    check_against_target,
    detect_layout,
    load_mtp,
    read_mtp_config,
    save_mtp,
)
from specdec.strategies import TargetInfo

from _mtp_heads import D, V, random_mtp

VARIANTS = [
    dict(),
    dict(has_lm_head=True, qkv_bias=True, o_bias=True, concat_order="hidden_first", feed_normed=True),
    dict(qk_norm=True, has_final_norm=False, has_lm_head=True),
]


@pytest.mark.parametrize("kw", VARIANTS, ids=["shared-head", "own-head-biases", "qk-norm-no-final-norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_heads_reload_bit_for_bit_with_the_same_config(tmp_path, kw, dtype):
    model = random_mtp(seed=7, **kw).to(dtype)
    save_mtp(model, tmp_path / "head")
    assert detect_layout(tmp_path / "head") == "specdec"
    loaded = load_mtp(tmp_path / "head", dtype=dtype)
    assert loaded.config == model.config
    ref, got = model.state_dict(), loaded.state_dict()
    assert list(got) == list(ref)
    for key in ref:
        assert got[key].dtype == dtype and torch.equal(got[key], ref[key]), key
    assert read_mtp_config(tmp_path / "head") == model.config


def test_the_standalone_layout_has_the_documented_keys(tmp_path):
    save_mtp(random_mtp(has_lm_head=True), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["specdec_mtp"] == 1 and cfg["architectures"] == ["SpecdecMTP"]
    assert cfg["concat_order"] == "embed_first" and cfg["rope"]["theta"] == 10000.0
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as st:
        keys = set(st.keys())
    assert {"token_layernorm.weight", "hidden_layernorm.weight", "input_proj.weight", "self_attn.q_proj.weight",
            "mlp.gate_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
            "final_layernorm.weight", "lm_head.weight"} <= keys
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as st:
        assert tuple(st.get_slice("input_proj.weight").get_shape()) == (D, 2 * D)


MIMO_CONFIG = dict(
    architectures=["MiMoForCausalLM"], model_type="mimo", hidden_act="silu", hidden_size=D, intermediate_size=48,
    num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=V, rms_norm_eps=1e-5,
    rope_theta=10000.0, max_position_embeddings=256, num_nextn_predict_layers=1, tie_word_embeddings=False,
)


def write_mimo(folder, model, *, layer=0, edit=None, config=None):
    """A MiMo-layout folder: the target's own weights in one shard, the MTP layer in another."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**MIMO_CONFIG, **(config or {})}))
    mtp = {f"model.mtp_layers.{layer}.{k}": v.contiguous() for k, v in model.state_dict().items()}
    if edit is not None:
        edit(mtp)
    body = {"model.embed_tokens.weight": torch.zeros(V, D), "model.norm.weight": torch.ones(D), "lm_head.weight": torch.zeros(V, D)}
    save_file(body, str(folder / "model-00001-of-00002.safetensors"))
    save_file(mtp, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in body}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in mtp})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def mimo_head(seed=8):
    return random_mtp(seed=seed, qkv_bias=True, concat_order="hidden_first", feed_normed=True)


def test_mimo_layout_loads_the_mtp_layer_from_a_sharded_full_model(tmp_path):
    model = mimo_head()
    write_mimo(tmp_path, model)
    assert detect_layout(tmp_path) == "mimo"
    loaded = load_mtp(tmp_path)
    cfg = loaded.config
    assert cfg.concat_order == "hidden_first" and cfg.feed_normed and cfg.qkv_bias and not cfg.o_bias
    assert cfg.has_final_norm and not cfg.has_lm_head
    assert cfg.hidden_size == D and cfg.num_key_value_heads == 2 and cfg.head_dim == D // 4
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def _drop(key):
    return lambda state: state.pop(f"model.mtp_layers.0.{key}")


def _add(key):
    return lambda state: state.__setitem__(f"model.mtp_layers.0.{key}", torch.zeros(3))


def _reshape(key, shape):
    return lambda state: state.__setitem__(f"model.mtp_layers.0.{key}", torch.zeros(shape))


@pytest.mark.parametrize(
    "edit, config, message",
    [
        (_drop("hidden_layernorm.weight"), None, r"missing keys \['hidden_layernorm.weight'\], unexpected keys \[\]"),
        (_add("eh_proj.weight"), None, r"missing keys \[\], unexpected keys \['model.mtp_layers.0.eh_proj.weight'\]"),
        (_reshape("input_proj.weight", (D, D)), None,
         r"model.mtp_layers.0.input_proj.weight has shape \(64, 64\); the config needs \(64, 128\)"),
        (None, dict(num_key_value_heads=4),
         r"model.mtp_layers.0.self_attn.k_proj.weight has shape \(32, 64\); the config needs \(64, 64\)"),
        (None, dict(hidden_act="gelu"), r"hidden_act='gelu' is not supported"),
    ],
    ids=["missing", "unexpected", "shape", "config-shape", "activation"],
)
def test_malformed_mimo_checkpoints_are_clear_errors(tmp_path, edit, config, message):
    write_mimo(tmp_path, mimo_head(), edit=edit, config=config)
    with pytest.raises(MTPCheckpointError, match=message):
        load_mtp(tmp_path)


def test_mimo_layer_index_is_checked_against_the_config_and_the_weights(tmp_path):
    write_mimo(tmp_path, mimo_head())
    with pytest.raises(MTPCheckpointError, match=r"mtp_layer=1 is out of range; allowed: \[0, 1\)"):
        load_mtp(tmp_path, layer=1)
    write_mimo(tmp_path / "b", mimo_head(), layer=1, config=dict(num_nextn_predict_layers=2))
    with pytest.raises(MTPCheckpointError, match=r"no 'model.mtp_layers.0.\*' weights; MTP layers present: \['1'\]"):
        load_mtp(tmp_path / "b")
    assert load_mtp(tmp_path / "b", layer=1).config.concat_order == "hidden_first"


def test_malformed_standalone_checkpoints_are_clear_errors(tmp_path):
    model = random_mtp(has_lm_head=True)
    save_mtp(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "has_lm_head": False}))
    with pytest.raises(MTPCheckpointError, match=r"missing keys \[\], unexpected keys \['lm_head.weight'\]"):
        load_mtp(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_layers": 2}))
    with pytest.raises(MTPCheckpointError, match=r"unknown config keys \['num_layers'\]"):
        load_mtp(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "specdec_mtp": 9}))
    with pytest.raises(MTPCheckpointError, match=r"specdec_mtp=9; this specdec reads format 1"):
        load_mtp(tmp_path)
    with pytest.raises(MTPCheckpointError, match=r"layout='gguf' is unknown; allowed: \['auto', 'specdec', 'mimo'\]"):
        load_mtp(tmp_path, layout="gguf")
    with pytest.raises(MTPCheckpointError, match=r"is not a folder"):
        load_mtp(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(MTPCheckpointError, match=r"no weights; expected model.safetensors"):
        load_mtp(tmp_path / "empty")


def test_a_head_for_another_target_is_rejected_naming_both_sizes():
    cfg = random_mtp().config
    check_against_target(cfg, TargetInfo(num_layers=3, hidden_size=D, vocab_size=V))
    with pytest.raises(MTPCheckpointError, match=r"hidden_size=64 differs from the target's hidden_size=32"):
        check_against_target(cfg, TargetInfo(num_layers=3, hidden_size=32, vocab_size=V))
    with pytest.raises(MTPCheckpointError, match=r"vocab_size=96 differs from the target's vocab_size=100"):
        check_against_target(cfg, TargetInfo(num_layers=3, hidden_size=D, vocab_size=100))
