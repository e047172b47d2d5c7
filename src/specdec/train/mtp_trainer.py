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

import dataclasses
import math
import shutil
import time
from pathlib import Path

import torch

from specdec.drafters.mtp_checkpoint import load_mtp, save_mtp
from specdec.drafters.mtp_model import MTPConfig, MTPModel

from .data import collate, epoch_batches, split_validation
from .mtp_unroll import mtp_teacher_forward, mtp_unroll
from .trainer import PROBE_STEPS, STATE_FILE, TrainConfig, TrainResult, _fingerprint, _log, lr_at
from .ttt import estimated_accept_length

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

    opt = torch.optim.AdamW(
        head.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=device.type == "cuda"
    )
    lengths = train_data.lengths.tolist()

    def batches_of(epoch: int) -> list[list[int]]:
        return epoch_batches(lengths, cfg.batch_tokens, seed=cfg.seed, epoch=epoch, max_len=cfg.max_len)

    per_epoch = len(batches_of(0))
    total = cfg.max_steps or max(1, math.ceil(cfg.epochs * per_epoch))
    step, epoch, pos, elapsed_before = 0, 0, 0, 0.0
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        step, epoch, pos = state["step"], state["epoch"], state["pos"]
        total, elapsed_before = state["total_steps"], state["elapsed"]
        torch.set_rng_state(state["rng"])
    batches = batches_of(epoch)
    val_list = []
    if val_data is not None and cfg.val_batches:
        val_list = epoch_batches(val_data.lengths.tolist(), cfg.batch_tokens, seed=cfg.seed, epoch=0, max_len=cfg.max_len)
        val_list = val_list[: cfg.val_batches]

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

    def validate() -> dict | None:
        if not val_list:
            return None
        head.eval()
        S = cfg.ttt_steps
        loss = torch.zeros((), device=device)
        correct, count = torch.zeros(S, device=device), torch.zeros(S, device=device)
        with torch.no_grad():
            for idx in val_list:
                batch = collate(val_data, idx, max_len=cfg.max_len, prompt_weight=cfg.prompt_weight).to(device)
                res = run(batch, train=False)
                loss += res.loss.detach()
                correct += res.correct
                count += res.count
        head.train()
        acc = (correct / count.clamp_min(1)).tolist()
        return {"kind": "val", "step": step, "loss": float(loss) / len(val_list), "step_acc": acc,
                "est_tau": estimated_accept_length(acc)}

    deadline = None if cfg.max_minutes is None else t_start + 60 * cfg.max_minutes
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=step, desc="train", unit="step", smoothing=0.05)
    S = cfg.ttt_steps
    acc_loss = torch.zeros((), device=device)
    acc_step_loss, acc_correct, acc_count = (torch.zeros(S, device=device) for _ in range(3))
    acc_tokens, acc_n, t_log = 0, 0, time.perf_counter()
    last, last_val, stopped_early = {}, None, False
    probe_start, probe_from = None, step
    last_ckpt = time.perf_counter()

    def save():
        _save_mtp_checkpoint(work, head, {
            "optimizer": opt.state_dict(), "step": step, "epoch": epoch, "pos": pos, "total_steps": total,
            "elapsed": elapsed_before + time.perf_counter() - t_start, "rng": torch.get_rng_state(),
            "data_fingerprint": fingerprint, "config": dataclasses.asdict(cfg),
        })

    steps_this_call = 0
    while step < total:
        if stop_after is not None and steps_this_call >= stop_after:
            stopped_early = True
            break
        if deadline is not None and time.perf_counter() > deadline:
            stopped_early = True
            break
        if step - probe_from == 3:
            if device.type == "cuda":
                torch.cuda.synchronize()
            probe_start = time.perf_counter()
        if deadline is not None and probe_start is not None and step - probe_from == 3 + PROBE_STEPS:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.perf_counter() - probe_start) / PROBE_STEPS
            fit = step + int(0.95 * (deadline - time.perf_counter()) / per_step)
            if fit < total:
                print(f"[train] {per_step * 1000:.0f} ms/step: the schedule of {total} steps does not fit "
                      f"max_minutes={cfg.max_minutes}; shortened to {fit} steps")
                total = max(step + 1, fit)
                if bar is not None:
                    bar.total = total
                    bar.refresh()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, cfg)
        batch = collate(train_data, batches[pos], max_len=cfg.max_len, prompt_weight=cfg.prompt_weight).to(device)
        res = run(batch, train=True)
        res.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        steps_this_call += 1
        pos += 1
        if pos == len(batches):
            epoch, pos = epoch + 1, 0
            batches = batches_of(epoch)
        acc_loss += res.loss.detach()
        acc_step_loss += res.step_loss
        acc_correct += res.correct
        acc_count += res.count
        acc_tokens += batch.num_tokens
        acc_n += 1
        if bar is not None:
            bar.update(1)
        if step % cfg.log_every == 0 or step == total:
            now = time.perf_counter()
            acc = (acc_correct / acc_count.clamp_min(1)).tolist()
            last = {
                "kind": "train", "step": step, "epoch": round(epoch + pos / max(1, len(batches)), 3),
                "lr": lr_at(step - 1, total, cfg), "loss": float(acc_loss) / acc_n,
                "step_loss": (acc_step_loss / acc_n).tolist(), "step_acc": acc, "est_tau": estimated_accept_length(acc),
                "grad_norm": float(grad_norm), "tokens_per_s": acc_tokens / max(1e-9, now - t_log),
                "elapsed_s": round(elapsed_before + now - t_start, 1),
            }
            _log(log_path, last)
            if bar is not None:
                bar.set_postfix(loss=f"{last['loss']:.3f}", acc0=f"{acc[0]:.3f}", tau=f"{last['est_tau']:.2f}")
            acc_loss.zero_(), acc_step_loss.zero_(), acc_correct.zero_(), acc_count.zero_()
            acc_tokens, acc_n, t_log = 0, 0, time.perf_counter()
        if step % cfg.val_every == 0 or step == total:
            val = validate()
            if val is not None:
                last_val = val
                _log(log_path, val)
        if time.perf_counter() - last_ckpt > 60 * cfg.ckpt_minutes:
            save()
            last_ckpt = time.perf_counter()
    if bar is not None:
        bar.close()
    save()
    head.eval()
    return TrainResult(head, step, total, elapsed_before + time.perf_counter() - t_start, cover, last, last_val, stopped_early)
