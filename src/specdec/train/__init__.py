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

from .cli import main
from .data import TrainBatch, collate, epoch_batches
from .distill import DistillData, build_distill_data, generate_responses
from .prompts import Prompt, encode_prompt, frozen_heldout_prompts, heldout_prompts, is_heldout, sample_prompts
from .teacher import TeacherOutput, dense_forward, teacher_forward
from .trainer import TrainConfig, TrainResult, build_head, train_eagle3
from .ttt import estimated_accept_length, ttt_attention, ttt_attention_ref, ttt_mask, ttt_unroll
from .vocab import build_vocab_map, coverage, token_counts

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
    "teacher_forward",
    "token_counts",
    "train_eagle3",
    "ttt_attention",
    "ttt_attention_ref",
    "ttt_mask",
    "ttt_unroll",
]
