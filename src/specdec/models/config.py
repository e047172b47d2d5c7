"""Map a transformers config (`PretrainedConfig`) to our frozen `ModelConfig`.

Owns the family rules: which HF `model_type`s we run, and how each sets biases, q/k norms,
sliding windows and RoPE. Knows nothing of weights or devices. Anything we cannot run
exactly (an unknown `model_type`, a non-SiLU MLP, a RoPE type whose frequencies change with
the sequence length) is an error naming the value and what is supported.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SUPPORTED_MODEL_TYPES", "SUPPORTED_ROPE_TYPES", "ModelConfig", "RopeConfig", "UnsupportedModelError"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its options is not implemented."""


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters` / legacy `rope_scaling` + `rope_theta`)."""

    rope_type: str = "default"  # one of SUPPORTED_ROPE_TYPES
    theta: float = 10000.0
    factor: float = 1.0  # linear / llama3 / yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None  # llama3 / yarn
    attention_factor: float | None = None  # yarn (None = derived from factor/mscale)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn


@dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs to build itself. d = hidden_size, hd = head_dim."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen2; Llama/Qwen3 attention_bias)
    o_bias: bool = False  # output projection bias (Llama/Qwen3 attention_bias)
    mlp_bias: bool = False  # Llama mlp_bias
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    tie_word_embeddings: bool = False
    sliding_windows: tuple[int | None, ...] = ()  # per layer; None = full attention
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type={self.model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads} (GQA groups)"
            )
        if self.rope.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_type={self.rope.rope_type!r} is not supported; supported: {list(SUPPORTED_ROPE_TYPES)}"
            )
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError(f"sliding_windows has {len(self.sliding_windows)} entries; need num_layers={self.num_layers}")
        for w in self.sliding_windows:
            if w is not None and (not isinstance(w, int) or w < 1):
                raise ValueError(f"sliding window {w!r} must be None or an int >= 1")

    @classmethod
    def from_hf(cls, hf_config) -> "ModelConfig":
        """Read a transformers config. Raises `UnsupportedModelError` for anything we cannot run exactly."""
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"model_type={model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
            )
        act = getattr(hf_config, "hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"hidden_act={act!r} is not supported; supported: ['silu']")
        num_heads = hf_config.num_attention_heads
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        n = hf_config.num_hidden_layers
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        family = {
            "llama": dict(qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=bool(getattr(hf_config, "mlp_bias", False))),
            "mistral": dict(),
            "qwen2": dict(qkv_bias=True),
            "qwen3": dict(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True),
        }[model_type]
        return cls(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=n,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf_config.rms_norm_eps),
            rope=_rope_from_hf(hf_config),
            max_position_embeddings=int(getattr(hf_config, "max_position_embeddings", 0) or 0),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            sliding_windows=_sliding_windows(hf_config, model_type, n),
            eos_token_ids=_as_ids(getattr(hf_config, "eos_token_id", None)),
            **family,
        )


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _sliding_windows(hf_config, model_type: str, num_layers: int) -> tuple[int | None, ...]:
    window = getattr(hf_config, "sliding_window", None)
    if model_type == "llama" or window is None:
        return (None,) * num_layers
    if model_type == "mistral":  # one window for every layer
        return (int(window),) * num_layers
    # Qwen2/Qwen3: `layer_types` says which layers slide (HF derives it from max_window_layers).
    if not getattr(hf_config, "use_sliding_window", False):
        return (None,) * num_layers
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is None:
        first = getattr(hf_config, "max_window_layers", num_layers)
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


def _rope_from_hf(hf_config) -> RopeConfig:
    """Read `rope_parameters` (transformers >= 5) or `rope_scaling` + `rope_theta` (older)."""
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params = dict(params)
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        raise UnsupportedModelError("per-layer-type rope_parameters are not supported; give one RoPE for all layers")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        hint = " (its frequencies change with the sequence length at run time)" if rope_type == "dynamic" else ""
        raise UnsupportedModelError(
            f"rope_type={rope_type!r} is not supported{hint}; supported: {list(SUPPORTED_ROPE_TYPES)}"
        )
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError(
            f"partial_rotary_factor={params['partial_rotary_factor']} is not supported; supported: 1.0"
        )
    orig = params.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn") and orig is None:
        orig = getattr(hf_config, "max_position_embeddings", None)
    factor = params.get("factor")
    if factor is None:
        factor = (hf_config.max_position_embeddings / orig) if rope_type == "yarn" else 1.0
    return RopeConfig(
        rope_type=rope_type,
        theta=float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))),
        factor=float(factor),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=None if orig is None else int(orig),
        attention_factor=params.get("attention_factor"),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )
