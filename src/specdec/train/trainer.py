"""The EAGLE-3 training loop: head construction, AdamW with warmup + cosine, TTT steps, logs,
resumable checkpoints in the official layout, and a wall-clock budget.

Owns `TrainConfig`, `build_head` (shape from the target; draft vocabulary from the data;
``lm_head`` rows and final ``norm`` taken from the target's by default, the norm scaled so the
first logits have std ~1; the rest random) and
`train_eagle3`. Each step runs the target once (`teacher.teacher_forward`, no grad) and the
head for `ttt_steps` unrolled steps (`ttt.ttt_unroll`), in bf16 autocast on CUDA (float32
master weights) and float32 on the CPU.

Checkpoints (``<work>/checkpoint/``): the head through the library's `save_eagle3` (official
layout, float32, reloaded with `load_eagle3` on resume) plus ``trainer_state.pt`` (optimizer,
step, data position, schedule length, RNG, log so far). Resuming checks that the data is the
same. A time budget (`max_minutes`) is met by measuring the first steps and, if the planned
steps would not fit, shortening the schedule once (so the cosine still ends at its floor);
a hard stop at the deadline saves a checkpoint that a later call resumes.

Validation is per category (`categories.category_of` of each held-out sequence's kind, the
grouping of the evaluation table): loss, per-step accuracy and the estimated chain acceptance
length (`ttt.estimated_accept_length`) of each category, plus the overall numbers as before.
Early stopping (`TrainConfig.early_stop_patience`, off by default) watches the mean estimated
tau over the categories, so a run that only improves its largest category does not keep going.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec.config import resolve_capture_layers
from specdec.drafters.eagle3_checkpoint import check_against_target, load_eagle3, save_eagle3
from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model

from .categories import CATEGORIES, category_of
from .data import collate, epoch_batches, split_validation
from .prompts import Prompt
from .teacher import teacher_forward
from .ttt import estimated_accept_length, ttt_unroll
from .vocab import build_vocab_map, coverage, token_counts

__all__ = [
    "EarlyStop", "RunSetup", "TrainConfig", "TrainResult", "ValSums", "build_head", "category_of_kind", "checkpoint_saver",
    "deepen",
    "fit_steps", "lr_at", "prepare_run", "run_training_loop", "scaled_output_norm", "summarize_validation", "train_eagle3",
    "validation_batches",
]

STATE_FILE = "trainer_state.pt"
PROBE_STEPS = 12  # steps timed before the schedule is fitted to the budget
REFIT_STEPS = 48  # steps timed after the first fit, to fit again: the first steps run slower (allocator,
# autotuning), and a fit on them alone left 30-45% of the H200 budget unused (297-365 ms/step probed, ~210 run)


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Sizes: Vd = draft_vocab_size; a batch holds <= batch_tokens padded tokens."""

    draft_vocab_size: int = 4096
    ttt_steps: int = 7
    step_weight: float = 0.8  # loss weight of TTT step k is step_weight ** k
    prompt_weight: float = 0.1  # loss weight of prompt tokens (responses weigh 1)
    teacher_temperature: float = 1.0  # the loss's soft target softmax(logits / this): 1 the target's own
    # distribution, below 1 sharper toward its argmax (what greedy verification accepts), 0 the argmax alone
    epochs: float = 4.0
    max_steps: int | None = None  # overrides epochs
    batch_tokens: int = 16384
    max_len: int = 1024  # sequences are cut to this many tokens
    lr: float = 6e-4
    min_lr_ratio: float = 0.05
    warmup_steps: int = 40
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    init_std: float = 0.02
    init_from_target: bool = True  # lm_head rows and final norm from the target's
    fc_norm: bool = True  # per-chunk RMSNorm before fc (SpecForge layout): robust to massive activations
    capture_layers: tuple[int, ...] | None = None  # output convention; None = (1, L//2-1, L-4)
    seed: int = 0
    max_minutes: float | None = None  # wall-clock budget of this call (None = none)
    fit_schedule: bool = True  # shorten the schedule to end within max_minutes; False: max_minutes only stops
    # this call (checkpointed) and a later call resumes the same schedule (a run split into parts)
    log_every: int = 10
    val_fraction: float = 0.02
    val_every: int = 100
    val_batches: int = 8
    ckpt_minutes: float = 2.0
    amp: bool = True  # bf16 autocast on CUDA (ignored on the CPU)
    compile: bool = False  # torch.compile the teacher forward and the TTT unroll
    early_stop_patience: int | None = None  # stop after this many evaluations without a better watched value; None = off
    early_stop_min_delta: float = 0.0  # an evaluation counts as better when it beats the best by more than this
    mtp_loss_vocab: str = "full"  # mtp: the loss over the full vocabulary, or "draft": over the draft vocabulary
    # (the draft_vocab_size most frequent targets, as EAGLE-3 trains: ~V / Vd times less lm_head work per step)
    draft_layers: int = 1  # eagle3: decoder layers of the head (the EAGLE-3 layer, then plain ones; a warm start
    # from a head with fewer adds them as identities: zero o_proj and down_proj, so it starts as that head)
    init_head: str | None = None  # a head folder to start from (its weights and draft vocabulary; a fresh optimizer
    # and schedule): training goes on across machines and sessions, on new data; a resumed checkpoint comes first

    def __post_init__(self) -> None:
        def bad(name, rng):
            raise ValueError(f"TrainConfig.{name}={getattr(self, name)!r} is out of range; allowed: {rng}")

        for name in ("draft_vocab_size", "ttt_steps", "batch_tokens", "log_every", "val_every", "draft_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "int >= 1")
        if self.max_len < 3:
            bad("max_len", ">= 3")
        if self.mtp_loss_vocab not in ("full", "draft"):
            bad("mtp_loss_vocab", "'full' or 'draft'")
        if self.warmup_steps < 0 or self.val_batches < 0:
            bad("warmup_steps" if self.warmup_steps < 0 else "val_batches", ">= 0")
        if self.max_steps is not None and self.max_steps < 1:
            bad("max_steps", ">= 1 or None")
        if not self.epochs > 0:
            bad("epochs", "> 0")
        if not self.lr > 0:
            bad("lr", "> 0")
        if not 0 <= self.min_lr_ratio <= 1:
            bad("min_lr_ratio", "[0, 1]")
        if not 0 < self.step_weight <= 1:
            bad("step_weight", "(0, 1]")
        if not 0 <= self.prompt_weight <= 1:
            bad("prompt_weight", "[0, 1]")
        if not 0 <= self.teacher_temperature < float("inf"):
            bad("teacher_temperature", "finite >= 0 (0: the target's argmax alone)")
        if not self.grad_clip > 0:
            bad("grad_clip", "> 0")
        if self.max_minutes is not None and not self.max_minutes > 0:
            bad("max_minutes", "> 0 or None")
        if not 0 <= self.val_fraction < 1:
            bad("val_fraction", "[0, 1)")
        p = self.early_stop_patience
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            bad("early_stop_patience", "int >= 1 or None")
        if not self.early_stop_min_delta >= 0:
            bad("early_stop_min_delta", ">= 0")


@dataclass
class TrainResult:
    head: Eagle3Model
    steps: int
    total_steps: int
    seconds: float
    coverage: float  # share of (weighted) training targets inside the draft vocabulary
    last: dict  # last train log record
    last_val: dict | None
    stopped_early: bool  # the time budget ended the run before its schedule
    plateaued: bool = False  # early stopping ended the run (the watched value stopped improving)
    tokens: int = 0  # training tokens (unpadded) seen over every call of the run
    best_watched: float | None = None  # best mean validation est. tau over the categories


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """Learning rate before optimizer step `step` (0-based): linear warmup, cosine to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def scaled_output_norm(rows: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """The target's final-norm weight [d] scaled so that a random (unit-RMS) hidden state gives
    logits of std ~1 through the output rows [V', d] (unscaled, SmolLM2's would start at std ~6:
    cross-entropy ~20): a head's initial output norm, keeping the target's output geometry."""
    scale = (rows.pow(2) @ norm_weight.pow(2)).sqrt().median().clamp_min(1e-6)
    return norm_weight / scale


def build_head(target, cfg: TrainConfig, d2t: torch.Tensor, t2d: torch.Tensor) -> Eagle3Model:
    """A fresh EAGLE-3 head shaped after `target` (one layer like the target's), with the vocab map."""
    mc = target.config
    layers = resolve_capture_layers(mc.num_layers, cfg.capture_layers)
    hcfg = Eagle3Config(
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_attention_heads=mc.num_heads,
        num_key_value_heads=mc.num_kv_heads,
        head_dim=mc.head_dim,
        vocab_size=mc.vocab_size,
        draft_vocab_size=int(d2t.shape[0]),
        target_hidden_size=mc.hidden_size,
        num_capture=len(layers),
        rms_norm_eps=mc.rms_norm_eps,
        rope=mc.rope,
        max_position_embeddings=mc.max_position_embeddings,
        capture_layers=layers,
        fc_norm=cfg.fc_norm,
        num_layers=cfg.draft_layers,
    )
    head = Eagle3Model(hcfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight") or name.startswith("fc_norm."):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * cfg.init_std)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        if cfg.init_from_target:
            used = torch.arange(hcfg.draft_vocab_size) + d2t
            rows = target.model.lm_head.weight.detach().float().cpu()[used]  # [Vd, d]
            w = target.model.norm.weight.detach().float().cpu()  # [d]
            head.lm_head.weight.copy_(rows)
            head.norm.weight.copy_(scaled_output_norm(rows, w))
    return head


def load_init_eagle3(target, cfg: TrainConfig) -> Eagle3Model:
    """`cfg.init_head` as a float32 head on the CPU to train on from, checked to be the head this
    config would build for `target` (its width, vocabulary, capture layers, draft vocabulary and
    fc norm), so a warm start never trains a head the settings did not ask for.

    Raises:
        ValueError: naming the setting and both values when the head differs from the config.
    """
    source = f"init head {cfg.init_head}"
    head = load_eagle3(cfg.init_head, device="cpu", dtype=torch.float32)
    layers = check_against_target(head.config, target.info, source=source)
    want = {
        "capture_layers": resolve_capture_layers(target.config.num_layers, cfg.capture_layers),
        "draft_vocab_size": cfg.draft_vocab_size,
        "fc_norm": cfg.fc_norm,
        "hidden_size": target.config.hidden_size,
    }
    have = {"capture_layers": layers, "draft_vocab_size": head.config.draft_vocab_size,
            "fc_norm": head.config.fc_norm, "hidden_size": head.config.hidden_size}
    fix = {"capture_layers": "pass --capture-layers to match it", "draft_vocab_size": "pass --draft-vocab-size to match it",
           "fc_norm": "--no-fc-norm must match it", "hidden_size": "it was trained for another target"}
    for name, value in want.items():
        if have[name] != value:
            raise ValueError(f"{source} has {name}={have[name]!r}, the training settings ask for {name}={value!r}; "
                             f"{fix[name]}")
    if head.config.num_layers > cfg.draft_layers:
        raise ValueError(f"{source} has {head.config.num_layers} draft layers, the training settings ask for "
                         f"draft_layers={cfg.draft_layers}; pass --draft-layers {head.config.num_layers} or more")
    return deepen(head, cfg.draft_layers, torch.Generator().manual_seed(cfg.seed), cfg.init_std)


def deepen(head: Eagle3Model, num_layers: int, generator: torch.Generator, std: float) -> Eagle3Model:
    """`head` with `num_layers` draft layers: its own, then new plain layers that start as
    identities (random q/k/v and gate/up at `std`, unit norms, zero o_proj and down_proj: each
    adds nothing to the residual until trained), so the deeper head drafts what `head` drafts.
    Returns `head` itself when it already has `num_layers`."""
    if head.config.num_layers == num_layers:
        return head
    deeper = Eagle3Model(dataclasses.replace(head.config, num_layers=num_layers))
    missing, unexpected = deeper.load_state_dict(head.state_dict(), strict=False)
    if unexpected or any(not k.startswith("later_layers.") for k in missing):
        raise ValueError(f"cannot deepen the head: unexpected keys {unexpected}, missing {missing}")
    with torch.no_grad():
        for layer in deeper.later_layers[head.config.num_layers - 1:]:
            for name, p in layer.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias") or name.startswith(("self_attn.o_proj.", "mlp.down_proj.")):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=generator) * std)
    return deeper


def _fingerprint(data) -> str:
    h = hashlib.sha1()
    h.update(data.tokens.numpy().tobytes())
    h.update(data.offsets.numpy().tobytes())
    h.update(data.prompt_lens.numpy().tobytes())
    return h.hexdigest()


def fit_steps(step: int, planned: int, per_step: float, seconds_left: float) -> int:
    """The schedule's length that ends by the deadline: the planned steps when they fit, else as
    many as 95% of the time left allows at `per_step` seconds a step (at least one more)."""
    return max(step + 1, min(planned, step + int(0.95 * seconds_left / per_step)))


def checkpoint_saver(save_head: Callable) -> Callable[[Path, torch.nn.Module, dict], None]:
    """`save(work, head, state)`: the head (through `save_head(head, folder)`, float32) plus the
    optimizer state into ``<work>/checkpoint``, replaced atomically (tmp folder, then rename)."""

    def save(work: Path, head: torch.nn.Module, state: dict) -> None:
        tmp, final, old = work / "checkpoint.tmp", work / "checkpoint", work / "checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        save_head(head, tmp)
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)

    return save


@dataclass
class RunSetup:
    """What every head trainer sets up before its loop (`prepare_run`)."""

    t_start: float
    work: Path
    log_path: Path | None
    device: torch.device
    use_amp: bool
    train_data: object  # DistillData
    val_data: object | None
    fingerprint: str
    checkpoint: Path
    state: dict | None  # the resumed optimizer/schedule state, or None for a fresh start

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.use_amp else torch.autocast("cpu", enabled=False)


def prepare_run(target, data, cfg: "TrainConfig", *, work_dir, log_path, resume: bool, val_data=None) -> RunSetup:
    """Seed, validation split, data fingerprint, and the checkpoint state to resume (checked
    to come from the same data). `val_data` (a `DistillData`, e.g. distilled from held-out
    prompts) replaces the `val_fraction` split: then every sequence of `data` trains."""
    t_start = time.perf_counter()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    device = next(target.model.parameters()).device
    torch.manual_seed(cfg.seed)
    if len(data) < 2:
        raise ValueError(f"{len(data)} training sequences; need at least 2")
    if val_data is not None:
        train_idx, val_idx = list(range(len(data))), []
    else:
        train_idx, val_idx = split_validation(len(data), cfg.val_fraction, cfg.seed)
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
    return RunSetup(
        t_start=t_start, work=work, log_path=Path(log_path) if log_path is not None else None, device=device,
        use_amp=cfg.amp and device.type == "cuda", train_data=data.subset(train_idx),
        val_data=val_data if val_data is not None else data.subset(val_idx) if val_idx else None, fingerprint=fingerprint, checkpoint=ckpt, state=state,
    )


def category_of_kind(kind: str) -> str:
    """The evaluation category (`categories.category_of`) of a training sequence's prompt kind,
    so validation during training and the evaluation table group sequences the same way."""
    return category_of(Prompt(kind, "", "", False))


def _ordered(categories) -> list[str]:
    """The categories given, `categories.CATEGORIES` first in their order, then others sorted."""
    present = set(categories)
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def validation_batches(val_data, cfg: TrainConfig) -> dict[str, list[list[int]]]:
    """Sequence indices of the validation batches, per category: a batch holds one category's
    sequences (so its numbers are that category's), at most `cfg.val_batches` per category.
    With one category this is the batching of the whole validation set."""
    groups: dict[str, list[int]] = {}
    for i, kind in enumerate(val_data.kinds):
        groups.setdefault(category_of_kind(kind), []).append(i)
    out = {}
    for cat in _ordered(groups):
        idx = groups[cat]
        lengths = val_data.lengths[idx].tolist()
        batches = epoch_batches(lengths, cfg.batch_tokens, seed=cfg.seed, epoch=0, max_len=cfg.max_len)
        out[cat] = [[idx[j] for j in b] for b in batches[: cfg.val_batches]]
    return {c: b for c, b in out.items() if b}


@dataclass
class ValSums:
    """One category's validation sums: loss summed over its batches; correct / count: [S] top-1
    hits and weighted tokens per TTT step."""

    loss: float
    batches: int
    correct: list[float]
    count: list[float]

    @property
    def step_acc(self) -> list[float]:
        return [c / max(n, 1.0) for c, n in zip(self.correct, self.count)]  # as correct / count.clamp_min(1)


def summarize_validation(sums: dict[str, ValSums], step: int) -> dict:
    """The validation log record: overall loss / per-step accuracy / est. tau (as before
    categories existed), the same per category, and their means over the categories
    (`mean_est_tau` is what early stopping watches)."""
    if not sums:
        raise ValueError("summarize_validation needs at least one category")
    n = sum(v.batches for v in sums.values())
    S = len(next(iter(sums.values())).correct)
    total = ValSums(sum(v.loss for v in sums.values()), n, [sum(v.correct[k] for v in sums.values()) for k in range(S)],
                    [sum(v.count[k] for v in sums.values()) for k in range(S)])
    cats = {c: {"loss": v.loss / v.batches, "step_acc": v.step_acc, "est_tau": estimated_accept_length(v.step_acc),
                "batches": v.batches} for c, v in sums.items()}
    return {
        "kind": "val", "step": step, "loss": total.loss / n, "step_acc": total.step_acc,
        "est_tau": estimated_accept_length(total.step_acc), "categories": cats,
        "mean_loss": sum(c["loss"] for c in cats.values()) / len(cats),
        "mean_est_tau": sum(c["est_tau"] for c in cats.values()) / len(cats),
    }


@dataclass
class EarlyStop:
    """Patience on a value to maximise (the mean validation est. tau over the categories): `update`
    says stop after `patience` evaluations in a row that do not beat the best by more than
    `min_delta`. patience None never stops (the best is still tracked, for the record)."""

    patience: int | None
    min_delta: float = 0.0
    best: float | None = None
    bad: int = 0

    def update(self, value: float) -> bool:
        if self.best is None or value > self.best + self.min_delta:
            self.best, self.bad = value, 0
            return False
        self.bad += 1
        return self.patience is not None and self.bad >= self.patience


def _log(path: Path | None, record: dict) -> None:
    if path is not None:
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def train_eagle3(
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
    """Train an EAGLE-3 head for `target` on `data` (`DistillData`).

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
        `TrainResult` with the trained head (float32, on the target's device).
    """
    run_setup = prepare_run(target, data, cfg, work_dir=work_dir, log_path=log_path, resume=resume, val_data=val_data)
    counts = token_counts(run_setup.train_data, target.info.vocab_size, prompt_weight=cfg.prompt_weight)
    if run_setup.state is not None:
        head = load_eagle3(run_setup.checkpoint, device="cpu", dtype=torch.float32)
        for name, have, want in (("draft_vocab_size", head.config.draft_vocab_size, cfg.draft_vocab_size),
                                 ("draft_layers", head.config.num_layers, cfg.draft_layers)):
            if have != want:
                raise ValueError(f"{run_setup.checkpoint} has {name}={have}, the config asks for {want}")
    elif cfg.init_head is not None:
        head = load_init_eagle3(target, cfg)
    else:
        d2t, t2d = build_vocab_map(counts, cfg.draft_vocab_size)
        head = build_head(target, cfg, d2t, t2d)
    head = head.to(run_setup.device).train()
    cover = coverage(counts, head.t2d.cpu())
    layers = head.config.capture_layers

    teacher_fn, unroll_fn = teacher_forward, ttt_unroll
    if cfg.compile:
        teacher_fn = torch.compile(teacher_forward)  # shapes become dynamic on the first recompile
        unroll_fn = torch.compile(ttt_unroll)
    embed = target.model.embed
    target_ids = head.target_ids()

    def run(batch, *, train: bool):
        with run_setup.autocast():
            teacher = teacher_fn(target.model, batch.tokens, layers, target_ids)
            return unroll_fn(
                head, embed, teacher.captured, batch.tokens, teacher.logits, teacher.argmax, batch.weights,
                batch.response, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                teacher_temperature=cfg.teacher_temperature,
            )

    return run_training_loop(
        run_setup, head=head, run=run, cfg=cfg, progress=progress, stop_after=stop_after, cover=cover,
        save_checkpoint=checkpoint_saver(save_eagle3),  # float32, official layout
    )


def run_training_loop(
    run_setup: "RunSetup", *, head, run, cfg: TrainConfig, progress: bool, stop_after, cover: float, save_checkpoint,
) -> "TrainResult":
    """The optimisation loop shared by every head trainer (EAGLE-3, MTP).

    `run(batch, train=...)` returns the unroll result (loss, step_loss, correct, count) of one
    batch; `save_checkpoint(work, head, state)` writes the head in its own layout plus the
    optimizer state (`checkpoint_saver`). Handles the time budget (the schedule is shortened
    to fit after timing a few steps), logging, validation, periodic checkpoints and the
    progress bar; `run_setup` (`prepare_run`) holds the data split and the resumed state.
    """
    rs = run_setup
    device, train_data, val_data, state, t_start = rs.device, rs.train_data, rs.val_data, rs.state, rs.t_start
    work, fingerprint, log_path = rs.work, rs.fingerprint, rs.log_path
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
    val_groups = validation_batches(val_data, cfg) if val_data is not None and cfg.val_batches else {}
    S = cfg.ttt_steps
    stopper = EarlyStop(cfg.early_stop_patience, cfg.early_stop_min_delta)
    plateaued, tokens_seen = False, 0
    if state is not None:
        stopper.best, stopper.bad = state.get("es_best"), state.get("es_bad", 0)
        plateaued, tokens_seen = state.get("plateaued", False), state.get("tokens", 0)

    def validate() -> dict | None:
        """Loss and per-step accuracy of every category's validation batches (no grad)."""
        if not val_groups:
            return None
        head.eval()
        sums = {}
        with torch.no_grad():
            for cat, cat_batches in val_groups.items():
                loss = torch.zeros((), device=device)
                correct, count = torch.zeros(S, device=device), torch.zeros(S, device=device)  # [S]
                for idx in cat_batches:
                    batch = collate(val_data, idx, max_len=cfg.max_len, prompt_weight=cfg.prompt_weight).to(device)
                    res = run(batch, train=False)
                    loss += res.loss.detach()
                    correct += res.correct
                    count += res.count
                sums[cat] = ValSums(float(loss), len(cat_batches), correct.tolist(), count.tolist())
        head.train()
        return summarize_validation(sums, step)

    deadline = None if cfg.max_minutes is None else t_start + 60 * cfg.max_minutes
    bar = None
    if progress:
        bar = tqdm(total=total, initial=step, desc="train", unit="step", smoothing=0.05)
    acc_loss = torch.zeros((), device=device)
    acc_step_loss, acc_correct, acc_count = (torch.zeros(S, device=device) for _ in range(3))
    acc_tokens, acc_n, t_log = 0, 0, time.perf_counter()
    last, last_val, stopped_early = {}, None, False
    probe_start, probe_from = None, step
    last_ckpt = time.perf_counter()

    def save():
        save_checkpoint(work, head, {
            "optimizer": opt.state_dict(), "step": step, "epoch": epoch, "pos": pos, "total_steps": total,
            "elapsed": elapsed_before + time.perf_counter() - t_start, "rng": torch.get_rng_state(),
            "data_fingerprint": fingerprint, "config": dataclasses.asdict(cfg),
            "es_best": stopper.best, "es_bad": stopper.bad, "plateaued": plateaued, "tokens": tokens_seen,
        })

    planned = total
    steps_this_call = 0
    while step < total and not plateaued:
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
        if cfg.fit_schedule and deadline is not None and probe_start is not None and step - probe_from in (
                3 + PROBE_STEPS, 3 + PROBE_STEPS + REFIT_STEPS):
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            timed = PROBE_STEPS if step - probe_from == 3 + PROBE_STEPS else REFIT_STEPS
            per_step = (now - probe_start) / timed
            fit = fit_steps(step, planned, per_step, deadline - now)
            if fit != total:
                print(f"[train] {per_step * 1000:.0f} ms/step over {timed} steps: the schedule of {planned} steps "
                      + (f"does not fit max_minutes={cfg.max_minutes}; {fit} steps" if fit < planned else "fits again"))
                total = fit
                if bar is not None:
                    bar.total = total
                    bar.refresh()
            probe_start = now
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
        tokens_seen += batch.num_tokens
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
                plateaued = stopper.update(val["mean_est_tau"])
                if plateaued:
                    print(f"[train] early stop at step {step}: mean validation est. tau over {len(val['categories'])} "
                          f"categories did not beat {stopper.best:.3f} for {stopper.bad} evaluations")
                    _log(log_path, {"kind": "early_stop", "step": step, "best_mean_est_tau": stopper.best,
                                    "patience": cfg.early_stop_patience})
                    break
        if time.perf_counter() - last_ckpt > 60 * cfg.ckpt_minutes:
            save()
            last_ckpt = time.perf_counter()
    if bar is not None:
        bar.close()
    save()
    head.eval()
    return TrainResult(head, step, total, elapsed_before + time.perf_counter() - t_start, cover, last, last_val, stopped_early,
                       plateaued=plateaued, tokens=tokens_seen, best_watched=stopper.best)
