"""The MTP training loop: the EAGLE-3 trainer's loop (`trainer.train_eagle3`: AdamW with
warmup + cosine, logs, validation, resumable checkpoints, wall-clock budget, same
`TrainConfig`) around an MTP head and the MTP-Eagle unroll (`mtp_unroll`).

Owns `build_mtp_head` (one decoder block shaped like the target's layers, ``input_proj``
2d -> d, norms; no ``lm_head`` of its own: logits go through the target's frozen lm_head;
``final_layernorm`` initialised from the target's final norm, scaled so first logits have
std ~1) and `train_mtp`. `TrainConfig.ttt_steps` is the recursion depth trained;
``fc_norm`` and ``capture_layers`` do not apply to MTP and are ignored; ``draft_vocab_size``
sizes the draft vocabulary written beside the head (`mtp_draft_vocab`), which the loss covers
too with ``mtp_loss_vocab="draft"`` (else the loss covers the full vocabulary).

Checkpoints (``<work>/checkpoint/``): the head through `save_mtp` (standalone specdec layout,
float32, reloaded with `load_mtp` on resume) plus ``trainer_state.pt``.
"""

from __future__ import annotations

import torch

from specdec.drafters.mtp_checkpoint import check_against_target, load_mtp, save_mtp
from specdec.drafters.mtp_drafter import restricted_head
from specdec.drafters.mtp_model import MTPConfig, MTPModel, init_random_

from .data import split_validation
from .mtp_unroll import mtp_teacher_forward, mtp_unroll
from .trainer import TrainConfig, TrainResult, checkpoint_saver, prepare_run, run_training_loop, scaled_output_norm
from .vocab import build_vocab_map, coverage, token_counts

__all__ = ["build_mtp_head", "mtp_draft_vocab", "train_mtp"]


def mtp_draft_vocab(target, data, cfg: TrainConfig) -> tuple[torch.Tensor, float] | None:
    """(target ids [Vd] int64 ascending, coverage) of the MTP draft vocabulary: the
    `cfg.draft_vocab_size` most frequent training targets of `data`'s training split (as the
    EAGLE-3 trainer counts them); None when that is the whole vocabulary. The trainer (with
    ``mtp_loss_vocab="draft"``) and the exported ``draft_vocab.safetensors`` both come from here."""
    V = target.info.vocab_size
    if cfg.draft_vocab_size >= V:
        return None
    train_idx, _ = split_validation(len(data), cfg.val_fraction, cfg.seed)
    counts = token_counts(data.subset(train_idx), V, prompt_weight=cfg.prompt_weight)
    d2t, t2d = build_vocab_map(counts, cfg.draft_vocab_size)
    return torch.arange(cfg.draft_vocab_size) + d2t, coverage(counts, t2d)


def build_mtp_head(target, cfg: TrainConfig) -> MTPModel:
    """A fresh MTP head shaped after `target` (its layer sizes, RoPE, vocabulary), float32 on the CPU."""
    mc = target.config
    mcfg = MTPConfig(
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_attention_heads=mc.num_heads,
        num_key_value_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        vocab_size=mc.vocab_size,
        rms_norm_eps=float(mc.rms_norm_eps),
        rope=mc.rope,
        max_position_embeddings=mc.max_position_embeddings,
    )
    head = init_random_(MTPModel(mcfg), torch.Generator().manual_seed(cfg.seed), std=cfg.init_std)
    if cfg.init_from_target and head.final_layernorm is not None:
        rows = target.model.lm_head.weight.detach().float().cpu()  # [V, d]
        w = target.model.norm.weight.detach().float().cpu()  # [d]
        with torch.no_grad():
            head.final_layernorm.weight.copy_(scaled_output_norm(rows, w))
    return head


def train_mtp(
    target,
    data,
    cfg: TrainConfig,
    *,
    work_dir,
    log_path=None,
    resume: bool = True,
    progress: bool = True,
    stop_after: int | None = None,
    val_data=None,
) -> TrainResult:
    """Train an MTP head (MTP-Eagle recursion) for `target` on `data` (`DistillData`).

    Args:
        target: a loaded `specdec.models.Target` (frozen; its device decides where training runs).
        work_dir: holds ``checkpoint/`` (resumable state).
        log_path: JSON-lines log (appended; one record per `log_every` steps and per validation).
        resume: continue from ``work_dir/checkpoint`` when it exists.
        stop_after: end this call after that many optimizer steps (checkpointed; the next call
            resumes and the result is the same as one uninterrupted run).
        val_data: validation `DistillData` (its kinds give the categories); None = a
            `cfg.val_fraction` split of `data`.
    Returns:
        `TrainResult` with the trained `MTPModel` (float32, on the target's device); coverage is 1.0
        with the loss over the full vocabulary, else the draft vocabulary's.
    """
    if cfg.draft_layers != 1:  # the field is EAGLE-3's; an MTP head is one module
        raise ValueError(f"TrainConfig.draft_layers={cfg.draft_layers} is out of range for an MTP head; allowed: 1")
    vocab = mtp_draft_vocab(target, data, cfg) if cfg.mtp_loss_vocab == "draft" else None
    run_setup = prepare_run(target, data, cfg, work_dir=work_dir, log_path=log_path, resume=resume, val_data=val_data)
    if run_setup.state is not None:
        head = load_mtp(run_setup.checkpoint, layout="specdec", device="cpu", dtype=torch.float32)
    elif cfg.init_head is not None:  # a warm start: the head's weights, a fresh optimizer and schedule
        head = load_mtp(cfg.init_head, device="cpu", dtype=torch.float32)
        check_against_target(head.config, target.info, source=f"init head {cfg.init_head}")
    else:
        head = build_mtp_head(target, cfg)
    head = head.to(run_setup.device).train()

    teacher_fn, unroll_fn = mtp_teacher_forward, mtp_unroll
    if cfg.compile:
        teacher_fn = torch.compile(mtp_teacher_forward)  # shapes become dynamic on the first recompile
        unroll_fn = torch.compile(mtp_unroll)
    embed = target.model.embed
    lm_head = target.model.lm_head  # frozen, shared
    target_ids, cover = None, 1.0
    if vocab is not None:  # the loss over the draft vocabulary: those lm_head rows only
        target_ids, cover = vocab[0].to(run_setup.device), vocab[1]
        lm_head = restricted_head(target.model.lm_head.weight, target_ids)

    def run(batch, *, train: bool):
        with run_setup.autocast():
            teacher = teacher_fn(target.model, batch.tokens, target_ids=target_ids)
            return unroll_fn(
                head, embed, lm_head, teacher.last_hidden, batch.tokens, teacher.logits, teacher.argmax, batch.weights,
                batch.response, steps=cfg.ttt_steps, step_weight=cfg.step_weight, target_ids=target_ids,
                teacher_temperature=cfg.teacher_temperature,
            )

    return run_training_loop(
        run_setup, head=head, run=run, cfg=cfg, progress=progress, stop_after=stop_after, cover=cover,
        save_checkpoint=checkpoint_saver(save_mtp),  # float32, standalone layout
    )
