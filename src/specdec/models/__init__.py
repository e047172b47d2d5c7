"""Target models: the compact decoder, config mapping, checkpoint loaders and hidden-state capture.

`load_target(path)` reads an HF folder (safetensors, single or sharded) or a GGUF file and
returns a `Target` (model, `TargetInfo`, tokenizer, HF config). Families: Llama 2/3/3.1
(RoPE scaling), Mistral (sliding window), Qwen2/2.5 (qkv bias), Qwen3 (q/k norm).
"""

from .capture import CaptureBuffer, capture_max_tokens
from .config import SUPPORTED_MODEL_TYPES, ModelConfig, RopeConfig, UnsupportedModelError
from .gguf import convert_gguf, smollm2_gguf_path
from .llama import DecoderLM, ModelOutput
from .loader import Target, load_target

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CaptureBuffer",
    "DecoderLM",
    "ModelConfig",
    "ModelOutput",
    "RopeConfig",
    "Target",
    "UnsupportedModelError",
    "capture_max_tokens",
    "convert_gguf",
    "load_target",
    "smollm2_gguf_path",
]
