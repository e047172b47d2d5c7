"""`specdec.train`: train EAGLE-3 draft heads with the training-time test, on self-distilled data.

Pipeline (one command: `python -m specdec.train eagle3 --target PATH --out DIR`):

1. `prompts`: code-completion and chat prompts from the Python source on this machine, with a
   held-out split by source file (`heldout_prompts`, `frozen_heldout_prompts` for evaluation).
2. `distill`: the target's own responses, generated in big batches over its paged KV cache.
3. `vocab`: the draft vocabulary (most frequent training targets, injective d2t / t2d).
4. `teacher` + `ttt` + `trainer`: one dense target forward per batch gives the captured states
   and the target's next-token distributions; the head (`specdec.drafters.Eagle3Model`) is
   unrolled for 7 TTT steps on its own outputs; AdamW, warmup + cosine, resumable
   checkpoints in the official EAGLE-3 layout.
5. `evaluate`: acceptance length and speed on held-out prompts; `plot`: the curves PNG.
"""

import importlib

_EXPORTS = {  # name -> submodule: imported on first use (PEP 562), so `specdec train --help` stays light
    "DistillData": "distill",
    "Prompt": "prompts",
    "TeacherOutput": "teacher",
    "TrainBatch": "data",
    "TrainConfig": "trainer",
    "TrainResult": "trainer",
    "build_distill_data": "distill",
    "build_head": "trainer",
    "build_vocab_map": "vocab",
    "collate": "data",
    "coverage": "vocab",
    "dense_forward": "teacher",
    "encode_prompt": "prompts",
    "epoch_batches": "data",
    "estimated_accept_length": "ttt",
    "frozen_heldout_prompts": "prompts",
    "generate_responses": "distill",
    "heldout_prompts": "prompts",
    "is_heldout": "prompts",
    "main": "cli",
    "sample_prompts": "prompts",
    "teacher_distribution": "ttt",
    "teacher_forward": "teacher",
    "token_counts": "vocab",
    "train_eagle3": "trainer",
    "ttt_attention": "ttt",
    "ttt_attention_ref": "ttt",
    "ttt_mask": "ttt",
    "ttt_unroll": "ttt",
}

__all__ = [
    "DistillData",
    "Prompt",
    "TeacherOutput",
    "TrainBatch",
    "TrainConfig",
    "TrainResult",
    "build_distill_data",
    "build_head",
    "build_vocab_map",
    "collate",
    "coverage",
    "dense_forward",
    "encode_prompt",
    "epoch_batches",
    "estimated_accept_length",
    "frozen_heldout_prompts",
    "generate_responses",
    "heldout_prompts",
    "is_heldout",
    "main",
    "sample_prompts",
    "teacher_distribution",
    "teacher_forward",
    "token_counts",
    "train_eagle3",
    "ttt_attention",
    "ttt_attention_ref",
    "ttt_mask",
    "ttt_unroll",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
