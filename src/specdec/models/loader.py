"""Load a target from a Hugging Face folder (config.json + safetensors) or a GGUF file.

Owns `load_target` and `Target`: reads the config with transformers' `AutoConfig`, the
weights with safetensors (one file, or shards listed in `model.safetensors.index.json`),
renames/fuses them into `DecoderLM` parameters (q/k/v -> qkv_proj, gate/up -> gate_up_proj),
ties embeddings when the config says so, and loads the tokenizer when the folder has one.
A GGUF path is first converted once to a cached HF folder (`gguf.py`). Missing weights are
an error naming them; unknown weights are an error too (nothing is silently dropped); a
truncated or corrupt weight or config file is a `CheckpointError` naming the file.

Tensor-parallel loading (`tp`, a `TPGroup` of size > 1): the model is built on the meta
device with this rank's shapes (`parallel.ShardLayout`) and every sharded tensor is read
with safetensors' `get_slice` (only this rank's rows or columns leave the file), so no
rank ever holds the full model. `tp_size` is checked against the config before any
weight is read. A GGUF target is converted by rank 0 (the others wait, then read the
same cached folder) and loaded slice by slice from the converted folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..distributed import SINGLE, TPGroup
from ..errors import ConfigError
from ..strategies import TargetInfo
from .config import ModelConfig
from .llama import DecoderLM
from .parallel import ShardLayout
from .weight_files import open_safetensors, read_json

__all__ = ["CheckpointError", "Target", "WeightFiller", "load_target", "load_state_dict"]

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


def load_target(
    path, *, device="cpu", dtype: torch.dtype = torch.float32, attn_impl: str = "auto", tp: TPGroup | None = None
) -> Target:
    """Load a target model (this rank's shard of it when `tp` has size > 1).

    Args:
        path: an HF folder (config.json + *.safetensors, single or sharded) or a `.gguf` file
            (converted once to a cached HF folder under $SPECDEC_CACHE or ~/.cache/specdec).
        device: where the weights go.
        dtype: parameter dtype (float32, bfloat16, float16).
        attn_impl: attention implementation passed to `specdec.runtime.attention`.
        tp: the tensor-parallel group (`specdec.distributed.tensor_parallel_group`); None = one rank.
    Raises:
        UnsupportedModelError: the config's model_type (or an option) is not supported.
        ConfigError: `tp.size` does not split the model's heads or ffn (before any weight loads).
        FileNotFoundError: no config.json / no weights / a listed shard is absent.
        CheckpointError: a truncated or corrupt file (named), missing, unknown or misshapen weights.
    """
    tp = SINGLE if tp is None else tp
    path = Path(path).expanduser()
    if path.suffix == ".gguf":
        from .gguf import convert_gguf

        if not tp.is_first:
            tp.barrier()  # rank 0 converts; the others then find the cached folder
        path = convert_gguf(path)
        if tp.is_first:
            tp.barrier()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is neither a .gguf file nor a folder with config.json")
    from transformers import AutoConfig

    read_json(path / "config.json", CheckpointError)  # names the file; transformers' own message does not say why
    hf_config = AutoConfig.from_pretrained(str(path))
    config = ModelConfig.from_hf(hf_config)
    ShardLayout.of(config, tp.size, tp.rank)  # a tp_size that does not split the model: before any weight
    eos = set(config.eos_token_ids)
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen_eos = read_json(gen_path, CheckpointError).get("eos_token_id")
        eos.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))

    device = torch.device(device)
    with torch.device("meta"):
        model = DecoderLM(config, attn_impl=attn_impl, tp=tp)  # this rank's shapes, no memory
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
    """Copy the checkpoint's tensors into `model` (in place), fusing q/k/v and gate/up; a
    tensor-parallel model reads only its shard of each tensor (`get_slice`)."""
    filler = WeightFiller(model)
    for file in _weight_files(folder):
        with open_safetensors(file, CheckpointError) as f:
            for name in f.keys():
                if filler.wants(name):
                    sl = f.get_slice(name)

                    def read(index, f=f, name=name, sl=sl):
                        return f.get_tensor(name) if index is None else sl[index]

                    filler.fill(name, tuple(sl.get_shape()), read, file)
    filler.check(folder)


class WeightFiller:
    """Copies HF-named checkpoint tensors into a `DecoderLM`, one at a time, each as this
    rank's slice of it, and keeps account of what was filled.

    `fill(name, shape, read, where)` takes a tensor's full shape and `read(index)`, which
    returns the whole tensor for index None and `tensor[index]` for a tuple of slices (a
    safetensors `get_slice`), so only the rows or columns this rank holds are ever read.
    """

    def __init__(self, model: DecoderLM):
        self.model = model
        cfg = model.config
        self.cfg = cfg
        self.shard: ShardLayout = getattr(model, "shard", None) or ShardLayout.of(cfg)
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.chunk_rows = self.shard.fused_rows  # local rows of each fused chunk
        self.expected: dict[tuple[str, int], bool] = {}
        for pname in self.params:
            if cfg.tie_word_embeddings and pname == "lm_head.weight":
                continue
            fused = self._fused(pname)
            for c in range(len(self.chunk_rows[fused]) - 1) if fused else (-1,):
                self.expected[(pname, c)] = False
        self.unknown: list[str] = []

    def _fused(self, ours: str) -> str | None:
        return next((f for f in self.chunk_rows if f".{f}." in ours), None)

    def wants(self, name: str) -> bool:
        """False for names skipped without reading (the RoPE buffer, a tied head's copy)."""
        if _IGNORED.search(name):
            return False
        ours, _ = _hf_to_ours(name)
        return not (self.cfg.tie_word_embeddings and ours == "lm_head.weight")  # tied: HF ignores it too

    def fill(self, name: str, shape: tuple[int, ...], read, where) -> None:
        ours, c = _hf_to_ours(name)
        if (ours, c) not in self.expected:
            self.unknown.append(name)
            return
        dst = self.params[ours]
        if c >= 0:
            rows = self.chunk_rows[self._fused(ours)]
            dst = dst[rows[c] : rows[c + 1]]
        part = self.shard.source_slice(ours, c)
        if part is None:
            want, index = tuple(dst.shape), None
        else:
            dim, start, stop, full = part
            want = tuple(full if i == dim else n for i, n in enumerate(dst.shape))
            index = (slice(None),) * dim + (slice(start, stop),)
            if stop - start < dst.shape[dim]:  # the vocabulary's padding rows (last rank)
                dst.narrow(dim, stop - start, dst.shape[dim] - (stop - start)).zero_()
                dst = dst.narrow(dim, 0, stop - start)
        if tuple(shape) != want:
            raise CheckpointError(f"{where}: {name} has shape {tuple(shape)}; the config implies {want}")
        src = read(index)  # [*dst.shape]
        dst.copy_(src.to(dst.dtype))
        self.expected[(ours, c)] = True

    def check(self, folder) -> None:
        """Raise `CheckpointError` for unknown or missing weights."""
        cfg = self.cfg
        if self.unknown:
            u = self.unknown
            raise CheckpointError(f"{folder}: weights this {cfg.model_type} config does not use: {u[:8]}{' ...' if len(u) > 8 else ''}")
        missing = [f"{n}[{c}]" if c >= 0 else n for (n, c), seen in self.expected.items() if not seen]
        if missing:
            raise CheckpointError(f"{folder}: missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
