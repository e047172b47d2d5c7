"""Strict loading and saving of MTP heads, in two layouts.

- **specdec** (standalone; what `save_mtp` and specdec's trainer write): a folder with
  ``config.json`` (``"specdec_mtp": 1`` plus every `MTPConfig` field; RoPE as a dict of
  `RopeConfig` fields) and ``model.safetensors`` whose keys are `MTPModel.state_dict()`
  (``token_layernorm.weight``, ``hidden_layernorm.weight``, ``input_proj.weight`` [d, 2d],
  ``self_attn.*``, ``mlp.*``, ``input_layernorm.weight``, ``post_attention_layernorm.weight``,
  optional ``final_layernorm.weight`` and ``lm_head.weight`` [V, d]).
- **mimo** (XiaomiMiMo/MiMo-7B-*): the full model's folder; the head is
  ``model.mtp_layers.{layer}.*`` with the same names as above, the concatenation is
  ``[hidden; embed]`` and a recursive step feeds back the final-normed state (as vLLM runs
  it). Dimensions come from the model's ``config.json`` (``num_nextn_predict_layers``
  bounds ``layer``); biases / q-k norms / own head are read off the key set. Every other key
  of the folder (the target's own weights, other MTP layers) is ignored.

Optional draft vocabulary (either layout): ``draft_vocab.safetensors`` beside the weights,
key ``target_ids`` [Vd] int64, strictly ascending ids of the target vocabulary that drafting
is restricted to (the Vd most frequent training targets; `save_draft_vocab` /
`load_draft_vocab`). The head itself still covers the whole vocabulary; restricting it
makes each draft step's output projection V / Vd times cheaper.

Weights: ``model.safetensors`` or shards listed in ``model.safetensors.index.json``.
Strict means: a missing or unexpected key, a shape that disagrees with the config, or
(with `check_against_target`) a hidden size / vocabulary that does not fit the target is an
`MTPCheckpointError` naming it, and so is a truncated or corrupt weight or config file
(naming the file). Nothing is left at random init. `save_mtp` then
`load_mtp` gives the same tensors bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from specdec.errors import ConfigError
from specdec.models.config import RopeConfig, _rope_from_hf
from specdec.models.weight_files import open_safetensors, read_json

from .mtp_model import MTPConfig, MTPModel

__all__ = [
    "MTPCheckpointError",
    "LAYOUTS",
    "load_mtp",
    "save_mtp",
    "read_mtp_config",
    "detect_layout",
    "check_against_target",
    "config_to_dict",
    "check_draft_vocab",
    "load_draft_vocab",
    "save_draft_vocab",
    "DRAFT_VOCAB_FILE",
]

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"

LAYOUTS = ("auto", "specdec", "mimo")
FORMAT_VERSION = 1
_MIMO_PREFIX = "model.mtp_layers."


class MTPCheckpointError(ConfigError):
    """The MTP checkpoint is malformed, unreadable (truncated, corrupt) or does not fit the target.

    A `ConfigError` (hence a `ValueError`): the message names the folder or file and the value."""


# --------------------------------------------------------------------------- files
def _weight_files(path: Path) -> dict[str, Path]:
    """Key -> safetensors file, for a single file or an index of shards (names only)."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index, MTPCheckpointError).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise MTPCheckpointError(f"{index}: no 'weight_map' object naming the shards")
        return {key: path / str(name) for key, name in weight_map.items()}
    if single.exists():
        with open_safetensors(single, MTPCheckpointError) as st:
            return {key: single for key in st.keys()}
    raise MTPCheckpointError(f"{path}: no weights; expected model.safetensors or model.safetensors.index.json")


def _read(files: dict[str, Path], keys: list[str]) -> dict[str, torch.Tensor]:
    """Read only `keys` (grouped per shard)."""
    by_file: dict[Path, list[str]] = {}
    for key in keys:
        by_file.setdefault(files[key], []).append(key)
    out = {}
    for file, names in by_file.items():
        if not file.exists():
            raise MTPCheckpointError(f"{file}: shard listed in the index is missing")
        with open_safetensors(file, MTPCheckpointError) as st:
            stored = set(st.keys())
            for name in names:
                if name not in stored:
                    raise MTPCheckpointError(f"{file}: has no tensor {name!r}, which the index places in it")
                out[name] = st.get_tensor(name)
    return out


def _config_json(path: Path) -> dict:
    if not path.is_dir():
        raise MTPCheckpointError(f"MTP checkpoint {path} is not a folder (expected config.json + model.safetensors)")
    file = path / "config.json"
    if not file.exists():
        raise MTPCheckpointError(f"{path}: no config.json")
    return read_json(file, MTPCheckpointError)


def detect_layout(path) -> str:
    """"specdec" when config.json carries ``specdec_mtp``, "mimo" when the weights hold
    ``model.mtp_layers.*``, else an error."""
    path = Path(path).expanduser()
    cfg = _config_json(path)
    if "specdec_mtp" in cfg:
        return "specdec"
    if any(k.startswith(_MIMO_PREFIX) for k in _weight_files(path)):
        return "mimo"
    raise MTPCheckpointError(
        f"{path}: neither a specdec MTP head (config.json has no 'specdec_mtp') nor a MiMo-layout model "
        f"(no '{_MIMO_PREFIX}*' weights)"
    )


# --------------------------------------------------------------------------- configs
def _int(cfg: dict, key: str, source: str, default=None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MTPCheckpointError(f"{source}: {key}={value!r} must be an int >= 1")
    return value


def _float(cfg: dict, key: str, source: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise MTPCheckpointError(f"{source}: {key}={value!r} must be a number > 0")
    return float(value)


def _bool(cfg: dict, key: str, source: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise MTPCheckpointError(f"{source}: {key}={value!r} must be true or false")
    return value


def config_to_dict(config: MTPConfig, dtype: torch.dtype = torch.float32) -> dict:
    """The standalone layout's config.json for `config`."""
    out = {"architectures": ["SpecdecMTP"], "specdec_mtp": FORMAT_VERSION}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        out[f.name] = dataclasses.asdict(value) if isinstance(value, RopeConfig) else value
    out["torch_dtype"] = str(dtype).removeprefix("torch.")
    return out


def _specdec_config(cfg: dict, source: str) -> MTPConfig:
    version = cfg.get("specdec_mtp")
    if version != FORMAT_VERSION:
        raise MTPCheckpointError(f"{source}: specdec_mtp={version!r}; this specdec reads format {FORMAT_VERSION}")
    fields = {f.name for f in dataclasses.fields(MTPConfig)}
    known = fields | {"architectures", "specdec_mtp", "torch_dtype"}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise MTPCheckpointError(f"{source}: unknown config keys {unknown}; allowed: {sorted(known)}")
    rope = cfg.get("rope", {})
    rope_fields = {f.name for f in dataclasses.fields(RopeConfig)}
    if not isinstance(rope, dict) or set(rope) - rope_fields:
        raise MTPCheckpointError(f"{source}: rope={rope!r} must be a dict with keys from {sorted(rope_fields)}")
    kw = {name: cfg[name] for name in fields if name in cfg and name != "rope"}
    try:
        return MTPConfig(rope=RopeConfig(**rope), **kw)
    except (TypeError, ValueError) as e:
        raise MTPCheckpointError(f"{source}: {e}") from None


def _check_mimo_layer(cfg: dict, layer: int, source: str) -> None:
    n = cfg.get("num_nextn_predict_layers")
    if n is not None and not 0 <= layer < n:
        raise MTPCheckpointError(f"{source}: mtp_layer={layer} is out of range; allowed: [0, {n}) (num_nextn_predict_layers)")


def _mimo_config(cfg: dict, keys: set[str], layer: int, source: str) -> MTPConfig:
    _check_mimo_layer(cfg, layer, source)
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise MTPCheckpointError(f"{source}: hidden_act={act!r} is not supported; supported: ['silu']")
    d = _int(cfg, "hidden_size", source)
    heads = _int(cfg, "num_attention_heads", source)
    try:
        rope = _rope_from_hf(SimpleNamespace(**cfg))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise MTPCheckpointError(f"{source}: bad RoPE settings ({type(e).__name__}: {e})") from None
    try:
        return MTPConfig(
            hidden_size=d,
            intermediate_size=_int(cfg, "intermediate_size", source),
            num_attention_heads=heads,
            num_key_value_heads=_int(cfg, "num_key_value_heads", source, default=heads),
            head_dim=_int({"head_dim": cfg.get("head_dim") or d // heads}, "head_dim", source),
            vocab_size=_int(cfg, "vocab_size", source),
            rms_norm_eps=_float(cfg, "rms_norm_eps", source, 1e-6),
            rope=rope,
            max_position_embeddings=_int({"max_position_embeddings": cfg.get("max_position_embeddings") or 2048},
                                         "max_position_embeddings", source),
            qkv_bias="self_attn.q_proj.bias" in keys,
            o_bias="self_attn.o_proj.bias" in keys,
            qk_norm="self_attn.q_norm.weight" in keys,
            concat_order="hidden_first",
            feed_normed=True,
            has_final_norm="final_layernorm.weight" in keys,
            has_lm_head="lm_head.weight" in keys,
        )
    except ValueError as e:
        raise MTPCheckpointError(f"{source}: {e}") from None


def _mimo_keys(files: dict[str, Path], layer: int, source: str) -> dict[str, str]:
    """Model key -> file key for ``model.mtp_layers.{layer}.*``."""
    prefix = f"{_MIMO_PREFIX}{layer}."
    found = {k[len(prefix):]: k for k in files if k.startswith(prefix)}
    if not found:
        layers = sorted({k[len(_MIMO_PREFIX):].split(".", 1)[0] for k in files if k.startswith(_MIMO_PREFIX)})
        raise MTPCheckpointError(f"{source}: no '{prefix}*' weights; MTP layers present: {layers}")
    return found


def read_mtp_config(path, *, layout: str = "auto", layer: int = 0) -> MTPConfig:
    """The `MTPConfig` of a checkpoint folder (reads config.json and weight names only)."""
    path = Path(path).expanduser()
    layout = _check_layout(path, layout)
    cfg = _config_json(path)
    source = str(path / "config.json")
    if layout == "specdec":
        return _specdec_config(cfg, source)
    _check_mimo_layer(cfg, layer, source)
    return _mimo_config(cfg, set(_mimo_keys(_weight_files(path), layer, str(path))), layer, source)


def _check_layout(path: Path, layout: str) -> str:
    if layout not in LAYOUTS:
        raise MTPCheckpointError(f"layout={layout!r} is unknown; allowed: {list(LAYOUTS)}")
    return detect_layout(path) if layout == "auto" else layout


# --------------------------------------------------------------------------- load / save
def load_mtp(path, *, layout: str = "auto", layer: int = 0, device="cpu", dtype: torch.dtype = torch.float32) -> MTPModel:
    """Load an MTP head strictly.

    Args:
        path: a checkpoint folder (see the module docstring).
        layout: "auto", "specdec" or "mimo".
        layer: which ``model.mtp_layers.{layer}`` (mimo layout only; must be 0 otherwise).
        device, dtype: of the parameters.
    Raises:
        MTPCheckpointError: naming the missing / unexpected key, bad shape or bad value.
    """
    path = Path(path).expanduser()
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise MTPCheckpointError(f"mtp_layer={layer!r} must be an int >= 0")
    layout = _check_layout(path, layout)
    source = str(path)
    files = _weight_files(path)
    cfg = _config_json(path)
    if layout == "specdec":
        if layer != 0:
            raise MTPCheckpointError(f"{source}: mtp_layer={layer} applies to the mimo layout only; a specdec head has one layer")
        config = _specdec_config(cfg, str(path / "config.json"))
        names = {k: k for k in files}
    else:
        _check_mimo_layer(cfg, layer, str(path / "config.json"))
        names = _mimo_keys(files, layer, source)
        config = _mimo_config(cfg, set(names), layer, str(path / "config.json"))
    try:  # shapes first, on the meta device: a config with absurd sizes allocates nothing
        with torch.device("meta"):
            expected = dict(MTPModel(config).state_dict())
    except (ValueError, TypeError, RuntimeError) as e:
        raise MTPCheckpointError(f"{source}: the config does not describe an MTP head ({e})") from None
    missing = sorted(k for k in expected if k not in names)
    unexpected = sorted(names[k] for k in names if k not in expected)
    if missing or unexpected:
        raise MTPCheckpointError(f"{source}: missing keys {missing}, unexpected keys {unexpected}")
    tensors = _read(files, [names[k] for k in expected])
    state = {}
    for key, ref in expected.items():
        value = tensors[names[key]]
        if tuple(value.shape) != tuple(ref.shape):
            raise MTPCheckpointError(
                f"{source}: {names[key]} has shape {tuple(value.shape)}; the config needs {tuple(ref.shape)}"
            )
        if not value.dtype.is_floating_point:
            raise MTPCheckpointError(f"{source}: {names[key]} has dtype {value.dtype}; expected a float tensor")
        state[key] = value
    model = MTPModel(config)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def save_mtp(model: MTPModel, path, *, dtype: torch.dtype | None = None) -> Path:
    """Write `model` in the standalone specdec layout (config.json + model.safetensors).

    Args:
        dtype: cast the weights (None keeps them as they are).
    """
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach().to("cpu")
        if dtype is not None:
            value = value.to(dtype)
        state[key] = value.contiguous().clone()
    float_dtype = next(iter(state.values())).dtype
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config_to_dict(model.config, float_dtype), indent=2) + "\n")
    return path


def check_against_target(config: MTPConfig, target, *, source: str = "MTP head") -> None:
    """Check the head fits `target` (a `TargetInfo`).

    Raises:
        MTPCheckpointError: hidden size or vocabulary mismatch.
    """
    if config.hidden_size != target.hidden_size:
        raise MTPCheckpointError(
            f"{source}: hidden_size={config.hidden_size} differs from the target's hidden_size={target.hidden_size}; "
            "an MTP head reads the target's last hidden state and embeddings, so they must match"
        )
    if config.vocab_size != target.vocab_size:
        raise MTPCheckpointError(
            f"{source}: vocab_size={config.vocab_size} differs from the target's vocab_size={target.vocab_size}; "
            "this head was trained for another tokenizer"
        )


def check_draft_vocab(target_ids: torch.Tensor, vocab_size: int | None, source: str) -> torch.Tensor:
    """`target_ids` if it is a valid draft vocabulary ([Vd] int64, strictly ascending, inside
    [0, vocab_size)); else an `MTPCheckpointError` naming `source` and the problem."""
    if target_ids.dim() != 1 or target_ids.numel() == 0 or target_ids.dtype != torch.int64:
        raise MTPCheckpointError(
            f"{source}: target_ids must be a non-empty 1-D int64 tensor, got {tuple(target_ids.shape)} {target_ids.dtype}"
        )
    if target_ids.numel() > 1 and not bool((target_ids[1:] > target_ids[:-1]).all()):
        raise MTPCheckpointError(f"{source}: target_ids must be strictly ascending (distinct target ids)")
    lo, hi = int(target_ids[0]), int(target_ids[-1])
    if lo < 0 or (vocab_size is not None and hi >= vocab_size):
        limit = "" if vocab_size is None else f", {vocab_size}"
        raise MTPCheckpointError(f"{source}: target_ids span [{lo}, {hi}]; allowed: [0{limit})")
    return target_ids


def save_draft_vocab(path, target_ids: torch.Tensor) -> Path:
    """Write ``draft_vocab.safetensors`` (key ``target_ids``) into the head folder `path`."""
    path = Path(path).expanduser()
    ids = check_draft_vocab(target_ids.detach().to("cpu", torch.int64).contiguous(), None, "save_draft_vocab")
    save_file({"target_ids": ids}, str(path / DRAFT_VOCAB_FILE), metadata={"format": "pt"})
    return path / DRAFT_VOCAB_FILE


def load_draft_vocab(path, *, vocab_size: int | None = None) -> torch.Tensor | None:
    """The draft vocabulary of the head folder (or file) `path`: [Vd] int64, or None when the
    folder has no ``draft_vocab.safetensors``; checked ascending and inside [0, vocab_size)."""
    path = Path(path).expanduser()
    file = path / DRAFT_VOCAB_FILE if path.is_dir() else path
    if not file.is_file():
        if path.is_dir():
            return None
        raise MTPCheckpointError(f"{file}: no such draft vocabulary file")
    with open_safetensors(file, MTPCheckpointError) as f:
        keys = set(f.keys())
        if keys != {"target_ids"}:
            raise MTPCheckpointError(f"{file}: expected the single key 'target_ids', found {sorted(keys)}")
        ids = f.get_tensor("target_ids")
    return check_draft_vocab(ids, vocab_size, str(file))
