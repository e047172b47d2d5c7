"""Drafters: the EAGLE-3 and MTP heads, their checkpoints, capture-layer conventions, the
shared draft loop, and the model-free n-gram drafter.

- `eagle3_model`: the head (`Eagle3Model`, `Eagle3Config`), explicit first-step flag.
- `eagle3_checkpoint`: strict `load_eagle3` / `save_eagle3` (official and speculators layouts).
- `capture_conventions`: "output" (specdec) vs "input" (SGLang/vLLM) layer ids, converters.
- `dynamic_tree`: EAGLE-2 expansion and sampled whole-group trees, as tensor functions.
- `draft_layers`: the attention and SwiGLU pieces both heads are built from.
- `draft_attention`: attention over the paged draft prefix plus draft-tree nodes.
- `head_drafter`: `HeadDrafter`, the draft loop over a paged draft KV shared by the heads.
- `eagle3_drafter`: `Eagle3Drafter`, the `Drafter` the `eagle3` plugin returns.
- `mtp_model`, `mtp_checkpoint`, `mtp_drafter`: the MTP module (MiMo and specdec layouts)
  and `MTPDrafter`, the `Drafter` the `mtp` plugin returns.
- `ngram_drafter`: prompt-lookup drafting as a chain or a tree of continuations (no model).
"""

from .capture_conventions import (
    CaptureConventionError,
    check_capture_layers,
    convert_capture_layers,
    default_capture_layers,
    from_output_indices,
    to_output_indices,
)
from .eagle3_checkpoint import Eagle3CheckpointError, check_against_target, load_eagle3, read_eagle3_config, save_eagle3
from .eagle3_drafter import Eagle3Drafter
from .eagle3_model import Eagle3Config, Eagle3Model, Eagle3ShapeError, init_random_, random_vocab_map

__all__ = [
    "CaptureConventionError",
    "Eagle3CheckpointError",
    "Eagle3Config",
    "Eagle3Drafter",
    "Eagle3Model",
    "Eagle3ShapeError",
    "check_against_target",
    "check_capture_layers",
    "convert_capture_layers",
    "default_capture_layers",
    "from_output_indices",
    "init_random_",
    "load_eagle3",
    "random_vocab_map",
    "read_eagle3_config",
    "save_eagle3",
    "to_output_indices",
]
