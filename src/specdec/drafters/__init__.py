"""Drafters: the EAGLE-3 head, its checkpoints, capture-layer conventions and the draft loop.

- `eagle3_model`: the head (`Eagle3Model`, `Eagle3Config`), explicit first-step flag.
- `eagle3_checkpoint`: strict `load_eagle3` / `save_eagle3` (official and speculators layouts).
- `capture_conventions`: "output" (specdec) vs "input" (SGLang/vLLM) layer ids, converters.
- `dynamic_tree`: EAGLE-2 expansion and sampled whole-group trees, as tensor functions.
- `draft_attention`: attention over the paged draft prefix plus draft-tree nodes.
- `eagle3_drafter`: `Eagle3Drafter`, the `Drafter` the `eagle3` plugin returns.
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
