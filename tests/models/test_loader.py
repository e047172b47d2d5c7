"""Checkpoint loading: sharded safetensors, tied embeddings, clear errors, RoPE frequencies."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny_models import hf_config, make_checkpoint, run_prefill, spec_config
from safetensors.torch import load_file, save_file

import specdec
from specdec.models import SUPPORTED_MODEL_TYPES, ModelConfig, UnsupportedModelError, load_target
from specdec.models.rope import rope_inv_freq


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path):
    make_checkpoint("llama", tmp_path / "one", seed=3)
    make_checkpoint("llama", tmp_path / "sharded", seed=3, max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 2
    one = load_target(tmp_path / "one").model.state_dict()
    sharded = load_target(tmp_path / "sharded").model.state_dict()
    assert one.keys() == sharded.keys()
    for k in one:
        torch.testing.assert_close(one[k], sharded[k], rtol=0, atol=0)


def test_tied_embeddings_share_the_head_and_target_info_is_filled(tmp_path):
    make_checkpoint("qwen2", tmp_path, eos_token_id=[5, 7])
    assert "lm_head.weight" not in load_file(str(tmp_path / "model.safetensors"))
    target = specdec.load_target(tmp_path)
    model = target.model
    assert model.lm_head.weight is model.embed_tokens.weight
    info = target.info
    assert (info.num_layers, info.hidden_size, info.vocab_size, info.model_type) == (3, 64, 96, "qwen2")
    assert set(info.eos_token_ids) == {5, 7}
    assert info.model is model
    assert target.tokenizer is None  # the tiny folder has no tokenizer files
    assert model.sliding_window_per_layer == (None, 8, 8)
    assert model.num_kv_heads_per_layer == (2, 2, 2)
    assert not any(p.requires_grad for p in model.parameters())


def test_unsupported_model_type_is_an_error_listing_the_supported_ones(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2).save_pretrained(str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="'gpt2'") as err:
        load_target(tmp_path)
    for name in SUPPORTED_MODEL_TYPES:
        assert name in str(err.value)


def test_dynamic_rope_is_refused_with_the_supported_types():
    cfg = hf_config("llama", rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))
    with pytest.raises(UnsupportedModelError, match="dynamic.*supported: \\['default', 'linear', 'llama3', 'yarn'\\]"):
        ModelConfig.from_hf(cfg)


def test_missing_and_unknown_weights_are_errors_naming_them(tmp_path):
    make_checkpoint("mistral", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing weights: \['layers.1.self_attn.qkv_proj.weight\[1\]'\]"):
        load_target(tmp_path)
    weights["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(32, 64)
    weights["model.layers.0.mystery.weight"] = torch.zeros(3)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="mystery"):
        load_target(tmp_path)


def test_a_shard_listed_in_the_index_but_absent_is_an_error(tmp_path):
    make_checkpoint("llama", tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    (tmp_path / first).unlink()
    with pytest.raises(FileNotFoundError, match=first):
        load_target(tmp_path)


def test_a_path_without_config_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_target(tmp_path)


@pytest.mark.parametrize(
    "params",
    [
        dict(rope_type="default", rope_theta=500000.0),
        dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
             original_max_position_embeddings=8192),
        dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=32768),
        dict(rope_type="yarn", rope_theta=10000.0, factor=16.0, original_max_position_embeddings=4096,
             beta_fast=16.0, beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5),
    ],
    ids=lambda p: p["rope_type"],
)
def test_rope_frequencies_equal_transformers(params):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = hf_config("llama", num_attention_heads=8, num_key_value_heads=8, hidden_size=1024, head_dim=128,
                    max_position_embeddings=131072, rope_parameters=params)
    ours, scale = rope_inv_freq(ModelConfig.from_hf(cfg).rope, 128)
    if params["rope_type"] == "default":
        ref = 1.0 / (params["rope_theta"] ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
        ref_scale = 1.0
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
    torch.testing.assert_close(ours, ref.float(), rtol=0, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)


def test_load_to_bfloat16_keeps_weights_and_runs(tmp_path):
    make_checkpoint("qwen3", tmp_path)
    target = load_target(tmp_path, dtype=torch.bfloat16)
    model = target.model
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    ref = load_file(str(tmp_path / "model.safetensors"))["model.layers.0.self_attn.q_norm.weight"]
    torch.testing.assert_close(model.layers[0].self_attn.q_norm.weight, ref.bfloat16())
    out, _ = run_prefill(model, model.make_cache(spec_config(), dtype=torch.bfloat16), [[1, 2, 3]], [0])
    assert out.logits.dtype == torch.float32 and out.logits.isfinite().all()


def test_rope_buffer_follows_the_construction_device_and_stays_float32():
    from specdec.models import DecoderLM

    cfg = ModelConfig.from_hf(hf_config("llama"))
    with torch.device("meta"):
        meta = DecoderLM(cfg)
    assert meta.rotary.inv_freq.device.type == "meta"
    model = meta.to_empty(device="cpu").to(torch.bfloat16)
    assert model.rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(model.rotary.inv_freq, DecoderLM(cfg).rotary.inv_freq, rtol=0, atol=0)
