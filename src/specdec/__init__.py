"""specdec: speculative decoding for LLMs on PyTorch.

Public API: the decoder (`SpecDecoder`), configs (`SpecConfig`, `SamplingParams`), the
plugin system (`get_plugin_manager`, `hookimpl`, `strategy_hook`, `declared_names`), and the records strategies exchange.

The configs and `hookimpl` import nothing heavy; the names that need torch are imported on
first use (PEP 562), so `import specdec.entrypoints.cli` and `specdec --help` start without loading
torch and transformers.
"""

from importlib import import_module

from .config import ConfigError, SamplingParams, SpecConfig, resolve_capture_layers
from .hookspecs import hookimpl
from .plugin_helpers import declared_names, strategy_hook

__version__ = "0.1.0"

_LAZY = {  # public name -> the module that defines it
    "GenerationResult": ".entrypoints.decoder",
    "GenerationStats": ".entrypoints.decoder",
    "SpecDecoder": ".entrypoints.decoder",
    "load_target": ".models",
    "get_plugin_manager": ".registry",
    "resolve": ".registry",
    "Acceptance": ".types",
    "DraftTree": ".types",
    "SamplingTensors": ".types",
    "TreeMeta": ".types",
}

__all__ = [
    "Acceptance",
    "ConfigError",
    "DraftTree",
    "GenerationResult",
    "GenerationStats",
    "SamplingParams",
    "SamplingTensors",
    "SpecConfig",
    "SpecDecoder",
    "TreeMeta",
    "declared_names",
    "get_plugin_manager",
    "hookimpl",
    "load_target",
    "resolve",
    "resolve_capture_layers",
    "strategy_hook",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # once
        return value
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
