"""Load a target from a Hugging Face folder (config.json + safetensors) or a GGUF file.

Owns `load_target` and `Target`: reads the config with transformers' `AutoConfig`, the
weights with safetensors (one file, or shards listed in `model.safetensors.index.json`),
renames/fuses them into `DecoderLM` parameters (q/k/v -> qkv_proj, gate/up -> gate_up_proj),
ties embeddings when the config says so, and loads the tokenizer when the folder has one.
A GGUF path is first converted once to a cached HF folder (`gguf.py`). Missing weights are
an error naming them; unknown weights are an error too (nothing is silently dropped); a
truncated or corrupt weight or config file is a `CheckpointError` naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import ConfigError
from ..strategies import TargetInfo
from .config import ModelConfig
from .llama import DecoderLM
from .weight_files import open_safetensors, read_json

__all__ = ["CheckpointError", "Target", "load_target", "load_state_dict"]

_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")  # older checkpoints saved this buffer
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class CheckpointError(ConfigError):
    """A target checkpoint's file is unreadable (truncated, corrupt) or its weights do not fit
    its config (missing, unknown, wrong shape). A `ConfigError` (hence a `ValueError`)."""


@dataclass
class Target:
    """A loaded target: the model, what strategies may know about it, its tokenizer and HF config."""

    model: DecoderLM
    info: TargetInfo
    tokenizer: object | None
    hf_config: object
    config: ModelConfig
    path: Path


def load_target(path, *, device="cpu", dtype: torch.dtype = torch.float32, attn_impl: str = "auto") -> Target:
    """Load a target model.

    Args:
        path: an HF folder (config.json + *.safetensors, single or sharded) or a `.gguf` file
            (converted once to a cached HF folder under $SPECDEC_CACHE or ~/.cache/specdec).
        device: where the weights go.
        dtype: parameter dtype (float32, bfloat16, float16).
        attn_impl: attention implementation passed to `specdec.runtime.attention`.
    Raises:
        UnsupportedModelError: the config's model_type (or an option) is not supported.
        FileNotFoundError: no config.json / no weights / a listed shard is absent.
        CheckpointError: a truncated or corrupt file (named), missing, unknown or misshapen weights.
    """
    path = Path(path).expanduser()
    if path.suffix == ".gguf":
        from .gguf import convert_gguf

        path = convert_gguf(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with config.json")
    from transformers import AutoConfig

    read_json(path / "config.json", CheckpointError)  # names the file; transformers' own message does not say why
    hf_config = AutoConfig.from_pretrained(str(path))
    config = ModelConfig.from_hf(hf_config)
    eos = set(config.eos_token_ids)
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen_eos = read_json(gen_path, CheckpointError).get("eos_token_id")
        eos.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))

    device = torch.device(device)
    with torch.device("meta"):
        model = DecoderLM(config, attn_impl=attn_impl)
    model.to_empty(device=device).to(dtype)  # the RoPE buffer recomputes itself (Rotary._apply)
    model.tie_weights()
    load_state_dict(model, path, device=device)
    model.eval().requires_grad_(False)

    tokenizer = None
    if any((path / f).is_file() for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    info = TargetInfo(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        model_type=config.model_type,
        eos_token_ids=tuple(sorted(eos)),
        model=model,
    )
    return Target(model=model, info=info, tokenizer=tokenizer, hf_config=hf_config, config=config, path=path)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, CheckpointError).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map' object naming the shards")
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise FileNotFoundError(f"{index} lists shards that are not in {folder}: {missing}")
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder} (pytorch .bin checkpoints are not read)")
    return files


def _hf_to_ours(name: str) -> tuple[str, int]:
    """HF parameter name -> (our parameter name, which chunk of a fused tensor: -1 = whole).

    qkv_proj chunks: 0 q, 1 k, 2 v. gate_up_proj chunks: 0 gate, 1 up.
    """
    if name.startswith("model."):
        name = name[len("model.") :]
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        if f".self_attn.{part}." in name:
            return name.replace(part, "qkv_proj"), i
    for i, part in enumerate(("gate_proj", "up_proj")):
        if f".mlp.{part}." in name:
            return name.replace(part, "gate_up_proj"), i
    return name, -1


@torch.no_grad()
def load_state_dict(model: DecoderLM, folder: Path, *, device=None) -> None:
    """Copy the checkpoint's tensors into `model` (in place), fusing q/k/v and gate/up."""
    cfg = model.config
    params = dict(model.named_parameters(remove_duplicate=False))
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    chunk_rows = {"qkv_proj": (0, q, q + kv, q + 2 * kv), "gate_up_proj": (0, cfg.intermediate_size, 2 * cfg.intermediate_size)}
    expected: dict[tuple[str, int], bool] = {}
    for pname in params:
        if cfg.tie_word_embeddings and pname == "lm_head.weight":
            continue
        fused = next((f for f in chunk_rows if f".{f}." in pname), None)
        for c in range(len(chunk_rows[fused]) - 1) if fused else (-1,):
            expected[(pname, c)] = False
    unknown = []
    for file in _weight_files(folder):
        with open_safetensors(file, CheckpointError) as f:
            for name in f.keys():
                if _IGNORED.search(name):
                    continue
                ours, c = _hf_to_ours(name)
                if cfg.tie_word_embeddings and ours == "lm_head.weight":
                    continue  # tied: the embedding is the head (HF ignores a stored copy too)
                if (ours, c) not in expected:
                    unknown.append(name)
                    continue
                src = f.get_tensor(name)
                dst = params[ours]
                if c >= 0:
                    fused = next(k for k in chunk_rows if f".{k}." in ours)
                    lo, hi = chunk_rows[fused][c], chunk_rows[fused][c + 1]
                    dst = dst[lo:hi]
                if tuple(src.shape) != tuple(dst.shape):
                    raise CheckpointError(f"{file}: {name} has shape {tuple(src.shape)}; the config implies {tuple(dst.shape)}")
                dst.copy_(src.to(dst.dtype))
                expected[(ours, c)] = True
    if unknown:
        raise CheckpointError(f"{folder}: weights this {cfg.model_type} config does not use: {unknown[:8]}{' ...' if len(unknown) > 8 else ''}")
    missing = [f"{n}[{c}]" if c >= 0 else n for (n, c), seen in expected.items() if not seen]
    if missing:
        raise CheckpointError(f"{folder}: missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
