"""A truncated or corrupt weight or config file is a `ConfigError` subclass naming the file
(not safetensors' `SafetensorError: ... incomplete metadata`, not a `JSONDecodeError`):
targets (`CheckpointError`), EAGLE-3 heads (`Eagle3CheckpointError`), MTP heads and their
draft vocabularies (`MTPCheckpointError`), directly and through `SpecDecoder.from_pretrained`."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from specdec import ConfigError, SpecConfig, SpecDecoder
from specdec.drafters.eagle3_checkpoint import Eagle3CheckpointError, load_eagle3, save_eagle3
from specdec.drafters.mtp_checkpoint import (
    DRAFT_VOCAB_FILE,
    MTPCheckpointError,
    load_draft_vocab,
    load_mtp,
    save_draft_vocab,
    save_mtp,
)
from specdec.models import load_target
from specdec.models.loader import CheckpointError

from _eagle3_heads import random_head
from _mtp_heads import random_mtp
from _tiny_models import make_checkpoint


def truncate(file, keep: float = 0.5) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Intact checkpoints, copied per test before they are damaged."""
    target = tmp_path_factory.mktemp("target")
    make_checkpoint("llama", target, num_hidden_layers=6)
    eagle = tmp_path_factory.mktemp("eagle3")
    save_eagle3(random_head(hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 2, 3)), eagle)
    mtp = tmp_path_factory.mktemp("mtp")
    save_mtp(random_mtp(), mtp)
    save_draft_vocab(mtp, torch.arange(0, 96, 2))
    return dict(target=target, eagle3=eagle, mtp=mtp)


@pytest.fixture
def copies(originals, tmp_path):
    return {k: shutil.copytree(v, tmp_path / k) for k, v in originals.items()}


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.5, 0.999])
def test_a_truncated_target_weight_file_names_the_file(copies, keep):
    file = copies["target"] / "model.safetensors"
    truncate(file, keep)
    with pytest.raises(CheckpointError, match=re.escape(str(file)) + r": cannot read this safetensors file .*truncated"):
        load_target(copies["target"])


def test_a_corrupt_target_config_names_the_file(copies):
    file = copies["target"] / "config.json"
    truncate(file)
    with pytest.raises(CheckpointError, match=re.escape(str(file)) + r": not valid JSON"):
        load_target(copies["target"])


def test_a_truncated_eagle3_head_names_the_file(copies):
    file = copies["eagle3"] / "model.safetensors"
    truncate(file)
    with pytest.raises(Eagle3CheckpointError, match=re.escape(str(file)) + ": cannot read this safetensors file"):
        load_eagle3(copies["eagle3"])


@pytest.mark.parametrize("name", ["model.safetensors", DRAFT_VOCAB_FILE])
def test_a_truncated_mtp_head_or_draft_vocabulary_names_the_file(copies, name):
    file = copies["mtp"] / name
    truncate(file)
    loader = load_mtp if name == "model.safetensors" else load_draft_vocab
    with pytest.raises(MTPCheckpointError, match=re.escape(str(file)) + ": cannot read this safetensors file"):
        loader(copies["mtp"])


def test_checkpoint_errors_are_config_errors():
    for cls in (CheckpointError, Eagle3CheckpointError, MTPCheckpointError):
        assert issubclass(cls, ConfigError) and issubclass(cls, ValueError)


@pytest.mark.parametrize("drafter", ["eagle3", "mtp"])
def test_from_pretrained_with_a_truncated_head_is_a_config_error_naming_the_file(copies, drafter):
    target = load_target(copies["target"])
    file = copies[drafter] / "model.safetensors"
    truncate(file, 0.3)
    config = SpecConfig(drafter=drafter, max_batch_size=1, max_seq_len=64, kv_block_size=4)
    with pytest.raises(ConfigError, match=re.escape(str(file))):
        SpecDecoder.from_pretrained(target, copies[drafter], config)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rms_norm_eps", None, r"rms_norm_eps=None must be a number > 0"),
        ("rms_norm_eps", "1e-5", r"rms_norm_eps='1e-5' must be a number > 0"),
        ("max_position_embeddings", "x", r"max_position_embeddings='x' must be an int >= 1"),
        ("num_key_value_heads", 3, r"num_attention_heads=4 must be a multiple of num_key_value_heads=3"),
        ("intermediate_size", 10**9, r"has shape .* the config implies"),  # shapes checked on meta: nothing allocated
    ],
)
def test_bad_values_in_an_eagle3_config_are_checkpoint_errors(copies, field, value, message):
    import json

    file = copies["eagle3"] / "config.json"
    cfg = json.loads(file.read_text())
    cfg[field] = value
    file.write_text(json.dumps(cfg))
    with pytest.raises(Eagle3CheckpointError, match=message):
        load_eagle3(copies["eagle3"])


def test_an_integer_tensor_where_a_float_weight_belongs_is_an_error(copies):
    from safetensors.torch import load_file, save_file

    file = copies["eagle3"] / "model.safetensors"
    tensors = load_file(str(file))
    tensors["fc.weight"] = tensors["fc.weight"].to(torch.int32)
    save_file(tensors, str(file))
    with pytest.raises(Eagle3CheckpointError, match=r"fc.weight has dtype torch.int32; expected a float tensor"):
        load_eagle3(copies["eagle3"])
