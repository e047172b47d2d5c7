"""Strict loading and saving of EAGLE-3 heads (config.json + weights).

Formats read:

- **official** (SafeAILab EAGLE / SpecForge ``to_sglang`` export): ``fc.weight``
  [d, n*d_t], ``midlayer.*``, ``norm.weight``, ``lm_head.weight`` [Vd, d], ``d2t`` [Vd],
  ``t2d`` [V]; optional ``fc_norm.{i}.weight`` (per captured chunk), ``fc.bias``,
  ``embed_tokens.weight``. Config: a Llama config with ``num_hidden_layers: 1``
  (several: below),
  ``draft_vocab_size``, optional ``target_hidden_size`` and
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (output convention).
- **several layers** (speculators / vLLM, ``num_hidden_layers`` > 1): ``layers.0.*`` is the
  EAGLE-3 layer, ``layers.1.*`` on plain Llama decoder layers over its output; `save_eagle3`
  writes such a head that way (a one-layer head keeps ``midlayer.*``).
- **speculators** (vLLM): ``layers.0.*`` instead of ``midlayer.*``; optional
  ``input_norm.weight`` (``norm_before_fc``); config with ``speculators_model_type: eagle3``,
  ``transformer_layer_config``, ``norm_before_residual``, top-level
  ``eagle_aux_hidden_state_layer_ids`` (input convention, converted here).

Weights: ``model.safetensors``, sharded safetensors (``model.safetensors.index.json``) or
``pytorch_model.bin``. `save_eagle3` always writes the official layout
(config.json + model.safetensors) and reloads bit for bit.

Strict means: a missing or unexpected key, a wrong shape, ``d2t`` out of range or not
injective, ``t2d`` that disagrees with ``d2t``, or (with
`check_against_target`) a hidden size / vocabulary / layer count that does not fit the
target is an `Eagle3CheckpointError` naming the value, and so is a truncated or corrupt
weight or config file (naming the file). Nothing is left at random init.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from specdec.errors import ConfigError
from specdec.models.config import RopeConfig, _rope_from_hf
from specdec.models.weight_files import open_safetensors, read_json

from .capture_conventions import checkpoint_capture_layers, check_capture_layers
from .eagle3_model import Eagle3Config, Eagle3Model

__all__ = [
    "Eagle3CheckpointError",
    "load_eagle3",
    "save_eagle3",
    "read_eagle3_config",
    "check_against_target",
    "validate_vocab_map",
    "official_config_dict",
]

IGNORED_KEYS = frozenset({"verifier_norm.weight", "verifier_lm_head.weight"})  # speculators training leftovers
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class Eagle3CheckpointError(ConfigError):
    """The draft checkpoint is malformed, unreadable (truncated, corrupt) or does not fit the target.

    A `ConfigError` (hence a `ValueError`): the message names the folder or file and the value."""


# ---------------------------------------------------------------------------- config
def _is_speculators(cfg: dict) -> bool:
    return "speculators_model_type" in cfg or "transformer_layer_config" in cfg


def _int(cfg: dict, key: str, source: str, default=None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Eagle3CheckpointError(f"{source}: {key}={value!r} must be an int >= 1")
    return value


def _float(cfg: dict, key: str, source: str, default: float) -> float:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise Eagle3CheckpointError(f"{source}: {key}={value!r} must be a number > 0")
    return float(value)


def _config_from_dict(cfg: dict, fc_in_features: int | None, keys: set[str], source: str) -> Eagle3Config:
    """Build an `Eagle3Config` from a config.json dict and the weights' key set / fc width."""
    speculators = _is_speculators(cfg)
    if speculators:
        kind = cfg.get("speculators_model_type", "eagle3")
        if kind != "eagle3":
            raise Eagle3CheckpointError(f"{source}: speculators_model_type={kind!r}; specdec loads 'eagle3' heads")
        layer = dict(cfg.get("transformer_layer_config") or {})
        if not layer:
            raise Eagle3CheckpointError(f"{source}: speculators config has no transformer_layer_config")
    else:
        layer = cfg
    n_layers = _int(layer, "num_hidden_layers", source, default=1)
    act = layer.get("hidden_act", "silu")
    if act != "silu":
        raise Eagle3CheckpointError(f"{source}: hidden_act={act!r} is not supported; supported: ['silu']")
    d = _int(layer, "hidden_size", source)
    heads = _int(layer, "num_attention_heads", source)
    vocab = _int(layer, "vocab_size", source)
    draft_vocab = cfg.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab
    draft_vocab = _int({"draft_vocab_size": draft_vocab}, "draft_vocab_size", source)
    head_dim = _int({"head_dim": layer.get("head_dim") or d // heads}, "head_dim", source)
    d_t = cfg.get("target_hidden_size") or layer.get("target_hidden_size") or d
    d_t = _int({"target_hidden_size": d_t}, "target_hidden_size", source)
    try:
        rope = _rope_from_hf(SimpleNamespace(**layer))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise Eagle3CheckpointError(f"{source}: bad RoPE settings ({type(e).__name__}: {e})") from None
    capture = checkpoint_capture_layers(cfg, source=source)
    if fc_in_features is None:
        num_capture = len(capture) if capture is not None else 3
    else:
        if fc_in_features % d_t:
            raise Eagle3CheckpointError(
                f"{source}: fc.weight has {fc_in_features} input features, not a multiple of "
                f"target_hidden_size={d_t}; is target_hidden_size right?"
            )
        num_capture = fc_in_features // d_t
    if capture is not None and len(capture) != num_capture:
        raise Eagle3CheckpointError(
            f"{source}: config names {len(capture)} capture layers {capture} but fc.weight reads "
            f"{num_capture} * target_hidden_size={d_t} features"
        )
    fc_norm = any(k.startswith("fc_norm.") for k in keys) if keys else bool(cfg.get("fc_norm", False))
    if "fc_norm" in cfg and bool(cfg["fc_norm"]) != fc_norm and keys:
        raise Eagle3CheckpointError(
            f"{source}: config says fc_norm={cfg['fc_norm']} but the weights {'have' if fc_norm else 'lack'} fc_norm.* keys"
        )
    norm_before_fc = bool(cfg.get("norm_before_fc", False)) or "input_norm.weight" in keys
    try:
        return _eagle3_config(layer, cfg, keys, source, d, heads, vocab, draft_vocab, head_dim, d_t, num_capture, rope,
                              capture, fc_norm, norm_before_fc, n_layers)
    except ValueError as e:  # Eagle3Config's own rules (GQA groups, draft vocabulary size, ...)
        if isinstance(e, Eagle3CheckpointError):
            raise
        raise Eagle3CheckpointError(f"{source}: {e}") from None


def _eagle3_config(layer, cfg, keys, source, d, heads, vocab, draft_vocab, head_dim, d_t, num_capture, rope, capture,
                   fc_norm, norm_before_fc, num_layers) -> Eagle3Config:
    return Eagle3Config(
        hidden_size=d,
        intermediate_size=_int(layer, "intermediate_size", source),
        num_attention_heads=heads,
        num_key_value_heads=_int(layer, "num_key_value_heads", source, default=heads),
        head_dim=head_dim,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=d_t,
        num_capture=num_capture,
        rms_norm_eps=_float(layer, "rms_norm_eps", source, 1e-6),
        rope=rope,
        max_position_embeddings=_int({"max_position_embeddings": layer.get("max_position_embeddings") or 2048},
                                     "max_position_embeddings", source),
        capture_layers=capture,
        fc_bias="fc.bias" in keys,
        fc_norm=fc_norm,
        norm_before_fc=norm_before_fc,
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        attention_bias=bool(layer.get("attention_bias", False)),
        has_embed_tokens="embed_tokens.weight" in keys,
        num_layers=num_layers,
    )


def _rope_dict(rope: RopeConfig) -> dict | None:
    fields = {
        "default": (),
        "linear": ("factor",),
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        "yarn": (
            "factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim", "truncate",
        ),
    }[rope.rope_type]
    if not fields:
        return None
    out = {"rope_type": rope.rope_type}
    out.update({f: getattr(rope, f) for f in fields if getattr(rope, f) is not None})
    return out


def official_config_dict(config: Eagle3Config, dtype: torch.dtype = torch.float32) -> dict:
    """The official (SpecForge-style) config.json for `config`."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_layers,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "attention_bias": config.attention_bias,
        "rope_theta": config.rope.theta,
        "rope_scaling": _rope_dict(config.rope),
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if config.capture_layers is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(config.capture_layers)}
    for flag in ("fc_norm", "norm_before_fc", "norm_before_residual"):
        if getattr(config, flag):
            out[flag] = True
    return out


# --------------------------------------------------------------------------- weights
def _weights_file(path: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (path / name).exists():
            return path / name
    raise Eagle3CheckpointError(f"{path}: no weights found; expected one of {list(_WEIGHT_FILES)}")


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    file = _weights_file(path)
    if file.name == "pytorch_model.bin":
        try:
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle, zip and unpickler errors: the file is not a readable checkpoint
            raise Eagle3CheckpointError(f"{file}: cannot read ({type(e).__name__}: {e}); it is truncated or corrupt") from None
        return dict(state.get("state_dict", state)) if isinstance(state, dict) else {}
    tensors = {}
    for f in _shards(path, file):
        with open_safetensors(f, Eagle3CheckpointError) as st:
            for key in st.keys():
                tensors[key] = st.get_tensor(key)
    return tensors


def _shards(path: Path, file: Path) -> list[Path]:
    """The safetensors files behind `file` (itself, or the shards its index lists, all present)."""
    if not file.name.endswith(".index.json"):
        return [file]
    weight_map = read_json(file, Eagle3CheckpointError).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise Eagle3CheckpointError(f"{file}: no 'weight_map' object naming the shards")
    shards = [path / f for f in sorted(set(map(str, weight_map.values())))]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise Eagle3CheckpointError(f"{file} lists shards that are not in {path}: {missing}")
    return shards


def _key_set(path: Path) -> tuple[set[str], int | None]:
    """Weight names and fc's input width, without reading the tensors (safetensors only)."""
    file = _weights_file(path)
    if file.name == "pytorch_model.bin":
        tensors = _read_tensors(path)
        fc = tensors.get("fc.weight")
        return set(tensors), None if fc is None else fc.shape[-1]
    keys, fc_in = set(), None
    for f in _shards(path, file):
        with open_safetensors(f, Eagle3CheckpointError) as st:
            for key in st.keys():
                keys.add(key)
                if key == "fc.weight":
                    fc_in = st.get_slice(key).get_shape()[-1]
    return keys, fc_in


def _rename(key: str) -> str:
    """speculators names -> the model's: ``layers.0.`` is ``midlayer.``, ``layers.{i}.``
    (i >= 1) ``later_layers.{i-1}.``."""
    if not key.startswith("layers."):
        return key
    index, dot, rest = key[len("layers."):].partition(".")
    if not (dot and index.isdigit()):
        return key
    i = int(index)
    return f"midlayer.{rest}" if i == 0 else f"later_layers.{i - 1}.{rest}"


def _file_name(key: str, num_layers: int) -> str:
    """The model's names -> the saved ones: official for one layer, ``layers.{i}.`` for several."""
    if num_layers == 1:
        return key
    if key.startswith("midlayer."):
        return "layers.0." + key[len("midlayer."):]
    if key.startswith("later_layers."):
        index, _, rest = key[len("later_layers."):].partition(".")
        return f"layers.{int(index) + 1}.{rest}"
    return key


def read_eagle3_config(path) -> Eagle3Config:
    """The `Eagle3Config` of a checkpoint folder (reads config.json and the weight names only)."""
    path = Path(path).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise Eagle3CheckpointError(f"{path}: no config.json; an EAGLE-3 checkpoint is a folder with config.json + weights")
    cfg = read_json(cfg_file, Eagle3CheckpointError)
    keys, fc_in = _key_set(path)
    return _config_from_dict(cfg, fc_in, {_rename(k) for k in keys}, str(cfg_file))


def validate_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int, source: str = "checkpoint"):
    """Check `d2t` maps every draft id to a distinct target id in [0, V), and `t2d` agrees.

    Returns:
        (d2t [Vd] int64, t2d [V] bool), t2d derived from d2t when None.
    """
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool or d2t.dim() != 1:
        raise Eagle3CheckpointError(f"{source}: d2t must be a 1-D integer tensor, got {d2t.dtype} {tuple(d2t.shape)}")
    d2t = d2t.to(torch.int64)
    target = torch.arange(d2t.numel()) + d2t  # [Vd]
    bad = ((target < 0) | (target >= vocab_size)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise Eagle3CheckpointError(
            f"{source}: d2t maps draft id {i} to target id {int(target[i])} (d2t[{i}]={int(d2t[i])}), "
            f"out of range [0, {vocab_size})"
        )
    uniq, counts = torch.unique(target, return_counts=True)
    if uniq.numel() != target.numel():
        dup = int(uniq[counts > 1][0])
        ids = (target == dup).nonzero()[:, 0].tolist()
        raise Eagle3CheckpointError(
            f"{source}: d2t is not injective: draft ids {ids[:4]} all map to target id {dup}"
        )
    derived = torch.zeros(vocab_size, dtype=torch.bool)
    derived[target] = True
    if t2d is None:
        return d2t, derived
    if t2d.dim() != 1 or t2d.numel() != vocab_size:
        raise Eagle3CheckpointError(f"{source}: t2d has shape {tuple(t2d.shape)}; expected [{vocab_size}]")
    t2d = t2d.to(torch.bool)
    if not torch.equal(t2d, derived):
        extra = (t2d & ~derived).nonzero()
        missing = (derived & ~t2d).nonzero()
        what = (
            f"t2d marks target id {int(extra[0, 0])} that no draft id maps to"
            if extra.numel()
            else f"t2d misses target id {int(missing[0, 0])} that d2t maps to"
        )
        raise Eagle3CheckpointError(f"{source}: t2d disagrees with d2t: {what}")
    return d2t, t2d


def load_eagle3(path, *, device="cpu", dtype: torch.dtype = torch.float32, target=None) -> Eagle3Model:
    """Load an EAGLE-3 head strictly (official or speculators layout).

    Args:
        path: checkpoint folder (config.json + weights).
        device, dtype: of the floating-point parameters (d2t stays int64, t2d bool).
        target: a `TargetInfo` to check the head against (see `check_against_target`), or None.
    Raises:
        Eagle3CheckpointError: naming the missing/unexpected key, bad shape or bad value.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise Eagle3CheckpointError(f"draft checkpoint {path} is not a folder (expected config.json + weights)")
    raw = _read_tensors(path)
    source = str(path)
    tensors = {_rename(k): v for k, v in raw.items() if k not in IGNORED_KEYS}
    file_names = {_rename(k): k for k in raw}  # for messages: the names as the file spells them
    cfg = read_json(path / "config.json", Eagle3CheckpointError) if (path / "config.json").exists() else None
    if cfg is None:
        raise Eagle3CheckpointError(f"{path}: no config.json")
    fc = tensors.get("fc.weight")
    config = _config_from_dict(cfg, None if fc is None else fc.shape[-1], set(tensors), source)
    try:  # shapes first, on the meta device: a config with absurd sizes allocates nothing
        with torch.device("meta"):
            expected = Eagle3Model(config).state_dict()
    except (ValueError, TypeError, RuntimeError) as e:
        raise Eagle3CheckpointError(f"{source}: the config does not describe a head ({e})") from None
    optional = {"d2t", "t2d"} if config.draft_vocab_size == config.vocab_size else {"t2d"}
    missing = sorted(_file_name(k, config.num_layers) for k in expected if k not in tensors and k not in optional)
    unexpected = sorted(file_names[k] for k in tensors if k not in expected)
    if missing or unexpected:
        hint = ""
        if "architectures" in cfg and not any("Eagle3" in a for a in cfg.get("architectures") or []):
            hint = f" (architectures={cfg['architectures']}: is this an EAGLE-1/2 head rather than EAGLE-3?)"
        raise Eagle3CheckpointError(f"{source}: missing keys {missing}, unexpected keys {unexpected}{hint}")
    for key, ref in expected.items():
        if key in tensors and key not in ("d2t", "t2d") and tuple(tensors[key].shape) != tuple(ref.shape):
            raise Eagle3CheckpointError(
                f"{source}: {file_names.get(key, key)} has shape {tuple(tensors[key].shape)}; the config implies "
                f"{tuple(ref.shape)}"
            )
        if key in tensors and ref.dtype.is_floating_point and not tensors[key].dtype.is_floating_point:
            raise Eagle3CheckpointError(f"{source}: {key} has dtype {tensors[key].dtype}; expected a float tensor")
    model = Eagle3Model(config).to(dtype)
    d2t = tensors.get("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
    if d2t.shape != (config.draft_vocab_size,):
        raise Eagle3CheckpointError(
            f"{source}: d2t has shape {tuple(d2t.shape)}; expected [draft_vocab_size={config.draft_vocab_size}]"
        )
    tensors["d2t"], tensors["t2d"] = validate_vocab_map(d2t, tensors.get("t2d"), config.vocab_size, source)
    for key, value in tensors.items():
        if value.dtype.is_floating_point:
            tensors[key] = value.to(dtype)
    model.load_state_dict(tensors, strict=True)
    model = model.to(device)
    if target is not None:
        check_against_target(config, target, source=source)
    return model


def check_against_target(config: Eagle3Config, target, *, source: str = "draft head") -> tuple[int, ...]:
    """Check the head fits `target` (a `TargetInfo`); returns its capture layers (output convention).

    Raises:
        Eagle3CheckpointError: target_hidden_size, embedding width or vocabulary mismatch,
            or capture layers out of range for the target's layer count.
    """
    if config.target_hidden_size != target.hidden_size:
        raise Eagle3CheckpointError(
            f"{source}: fc reads captured states of width target_hidden_size={config.target_hidden_size}, but the "
            f"target's hidden_size is {target.hidden_size}; this head was trained for another target"
        )
    if not config.has_embed_tokens and config.hidden_size != target.hidden_size:
        raise Eagle3CheckpointError(
            f"{source}: the head shares the target's embeddings but its hidden_size={config.hidden_size} differs "
            f"from the target's hidden_size={target.hidden_size}"
        )
    if config.vocab_size != target.vocab_size:
        raise Eagle3CheckpointError(
            f"{source}: vocab_size={config.vocab_size} differs from the target's vocab_size={target.vocab_size}; "
            "this head was trained for another tokenizer"
        )
    try:
        return check_capture_layers(None, config.capture_layers, target.num_layers, expected_source=source)
    except ValueError as e:
        raise Eagle3CheckpointError(f"{source}: {e}") from None


def save_eagle3(model: Eagle3Model, path, *, dtype: torch.dtype | None = None) -> Path:
    """Write `model` in the official layout: config.json + model.safetensors (d2t int64, t2d bool);
    a head of several layers names them ``layers.{i}.*`` (speculators / vLLM).

    Args:
        dtype: cast floating-point weights (None keeps them as they are).
    """
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in model.state_dict().items():
        value = value.detach().to("cpu")
        if dtype is not None and value.dtype.is_floating_point:
            value = value.to(dtype)
        state[_file_name(key, model.config.num_layers)] = value.contiguous().clone()
    float_dtype = next((v.dtype for v in state.values() if v.dtype.is_floating_point), torch.float32)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = official_config_dict(model.config, float_dtype)
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return path
