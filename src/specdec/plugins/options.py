"""Reading a plugin's own options (`SpecConfig.plugin_options[name]`), for built-in and
third-party plugins alike: a dict with known keys only, and the device / dtype a plugin's
model should run in (the target's unless the options say otherwise)."""

from __future__ import annotations

import torch

from specdec.config import ConfigError, SpecConfig

__all__ = ["device_and_dtype", "plugin_options"]


def plugin_options(config: SpecConfig, name: str, known: set[str] | frozenset[str] | None = None) -> dict:
    """`config.plugin_options[name]` ({} when absent); an error names unknown keys and the allowed ones."""
    options = config.plugin_options.get(name, {})
    if not isinstance(options, dict):
        raise ConfigError(f"plugin_options[{name!r}] must be a dict, got {type(options).__name__}")
    if known is not None:
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"plugin_options[{name!r}] has unknown keys {unknown}; allowed: {sorted(known)}")
    return options


def device_and_dtype(options: dict, target, name: str) -> tuple[torch.device, torch.dtype]:
    """options['device'] / options['dtype'] (a torch dtype or its name), else the target model's."""
    model = getattr(target, "model", None)
    param = next(model.parameters(), None) if model is not None else None
    device = options.get("device", param.device if param is not None else "cpu")
    dtype = options.get("dtype", param.dtype if param is not None else torch.float32)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"plugin_options[{name!r}]['dtype']={options['dtype']!r} is not a torch dtype")
    return torch.device(device), dtype
