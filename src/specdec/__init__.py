"""specdec: speculative decoding for LLMs on PyTorch.

Public API: the decoder (`SpecDecoder`), configs (`SpecConfig`, `SamplingParams`), the
plugin system (`get_plugin_manager`, `hookimpl`), and the records strategies exchange.
"""

from .config import ConfigError, SamplingParams, SpecConfig, resolve_capture_layers
from .decoder import GenerationResult, GenerationStats, SpecDecoder
from .hookspecs import hookimpl
from .models import load_target
from .registry import get_plugin_manager, resolve
from .types import Acceptance, DraftTree, SamplingTensors, TreeMeta

__version__ = "0.1.0"

__all__ = [
    "Acceptance",
    "ConfigError",
    "DraftTree",
    "GenerationResult",
    "GenerationStats",
    "SpecDecoder",
    "SamplingParams",
    "SamplingTensors",
    "SpecConfig",
    "TreeMeta",
    "get_plugin_manager",
    "hookimpl",
    "load_target",
    "resolve",
    "resolve_capture_layers",
]
