"""The MTP training loop: the EAGLE-3 trainer's loop (`trainer.train_eagle3`: AdamW with
warmup + cosine, logs, validation, resumable checkpoints, wall-clock budget, same
`TrainConfig`) around an MTP head and the MTP-Eagle unroll (`mtp_unroll`).

Owns `build_mtp_head` (one decoder block shaped like the target's layers, ``input_proj``
2d -> d, norms; no ``lm_head`` of its own: logits go through the target's frozen lm_head;
``final_layernorm`` initialised from the target's final norm, scaled so first logits have
std ~1) and `train_mtp`. `TrainConfig.ttt_steps` is the recursion depth trained;
``draft_vocab_size``, ``fc_norm`` and ``capture_layers`` do not apply to MTP and are ignored.

Checkpoints (``<work>/checkpoint/``): the head through `save_mtp` (standalone specdec layout,
float32, reloaded with `load_mtp` on resume) plus ``trainer_state.pt``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import torch

from specdec.drafters.mtp_checkpoint import load_mtp, save_mtp
from specdec.drafters.mtp_model import MTPConfig, MTPModel

from .data import split_validation
from .mtp_unroll import mtp_teacher_forward, mtp_unroll
from .trainer import STATE_FILE, TrainConfig, TrainResult, _fingerprint, run_training_loop

__all__ = ["build_mtp_head", "train_mtp"]


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
    head = MTPModel(mcfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * cfg.init_std)
        if cfg.init_from_target and head.final_layernorm is not None:
            rows = target.model.lm_head.weight.detach().float().cpu()  # [V, d]
            w = target.model.norm.weight.detach().float().cpu()  # [d]
            scale = (rows.pow(2) @ w.pow(2)).sqrt().median().clamp_min(1e-6)  # as trainer.build_head
            head.final_layernorm.weight.copy_(w / scale)
    return head


def _save_mtp_checkpoint(work: Path, head: MTPModel, state: dict) -> None:
    tmp, final, old = work / "checkpoint.tmp", work / "checkpoint", work / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    save_mtp(head, tmp)  # float32, standalone layout
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


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
) -> TrainResult:
    """Train an MTP head (MTP-Eagle recursion) for `target` on `data` (`DistillData`).

    Args:
        target: a loaded `specdec.models.Target` (frozen; its device decides where training runs).
        work_dir: holds ``checkpoint/`` (resumable state).
        log_path: JSON-lines log (appended; one record per `log_every` steps and per validation).
        resume: continue from ``work_dir/checkpoint`` when it exists.
        stop_after: end this call after that many optimizer steps (checkpointed; the next call
            resumes and the result is the same as one uninterrupted run).
    Returns:
        `TrainResult` with the trained `MTPModel` (float32, on the target's device); coverage is 1.0
        (the head predicts over the full vocabulary).
    """
    t_start = time.perf_counter()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    log_path = Path(log_path) if log_path is not None else None
    device = next(target.model.parameters()).device
    use_amp = cfg.amp and device.type == "cuda"
    torch.manual_seed(cfg.seed)
    if len(data) < 2:
        raise ValueError(f"{len(data)} training sequences; need at least 2")

    train_idx, val_idx = split_validation(len(data), cfg.val_fraction, cfg.seed)
    train_data = data.subset(train_idx)
    val_data = data.subset(val_idx) if val_idx else None
    fingerprint = _fingerprint(data)
    ckpt = work / "checkpoint"
    state = None
    if resume and (ckpt / STATE_FILE).is_file():
        state = torch.load(ckpt / STATE_FILE, map_location="cpu", weights_only=False)
        if state["data_fingerprint"] != fingerprint:
            raise ValueError(
                f"{ckpt} was trained on other data (fingerprint {state['data_fingerprint'][:12]} != "
                f"{fingerprint[:12]}); pass resume=False (--no-resume) or another work dir"
            )
        head = load_mtp(ckpt, layout="specdec", device="cpu", dtype=torch.float32)
    else:
        head = build_mtp_head(target, cfg)
    head = head.to(device).train()
    cover = 1.0

    teacher_fn, unroll_fn = mtp_teacher_forward, mtp_unroll
    if cfg.compile:
        teacher_fn = torch.compile(mtp_teacher_forward)  # shapes become dynamic on the first recompile
        unroll_fn = torch.compile(mtp_unroll)
    embed = target.model.embed
    lm_head = target.model.lm_head  # frozen, shared

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else torch.autocast("cpu", enabled=False)

    def run(batch, *, train: bool):
        with autocast():
            teacher = teacher_fn(target.model, batch.tokens)
            return unroll_fn(
                head, embed, lm_head, teacher.last_hidden, batch.tokens, teacher.logits, teacher.argmax, batch.weights,
                batch.response, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
            )

    return run_training_loop(
        head=head, run=run, cfg=cfg, device=device, train_data=train_data, val_data=val_data, state=state,
        t_start=t_start, work=work, fingerprint=fingerprint, log_path=log_path, progress=progress,
        stop_after=stop_after, cover=cover, save_checkpoint=_save_mtp_checkpoint,
    )
