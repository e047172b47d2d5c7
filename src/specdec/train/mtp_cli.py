"""`python -m specdec.train mtp ...`: the EAGLE-3 pipeline of `cli` (same data, budget, logs,
curves, evaluation options) for an MTP head.

Owns `cmd_mtp` and the MTP head's TRAINING.md record. The head is written with `save_mtp`
(standalone specdec layout, bf16), loadable by the ``mtp`` plugin:
``SpecDecoder.from_pretrained(target, OUT, SpecConfig(drafter="mtp", ...))``; evaluation runs
the ``mtp`` drafter (chain D=5, tree D=6 K=8 N=48).
"""

from __future__ import annotations

import json
import platform
import shlex
import time
from dataclasses import asdict
from pathlib import Path

import torch

__all__ = ["cmd_mtp"]


def _record(out: Path, args, argv, data, cfg, result, phases, eval_rows) -> None:
    from .evaluate import format_table

    head = result.head
    n_params = sum(p.numel() for p in head.parameters())
    dev = next(head.parameters()).device
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    size = (out / "model.safetensors").stat().st_size
    lines = [
        f"# MTP head for `{args.target}`",
        "",
        "Trained by specdec (`specdec.train mtp`); standalone specdec MTP layout (config.json + model.safetensors, "
        "bf16); MTP-Eagle recursion on the target's last hidden state, logits through the target's lm_head.",
        "",
        "## Command",
        "",
        "```",
        "python -m specdec.train " + shlex.join(argv),
        "```",
        "",
        f"Machine: {machine}; torch {torch.__version__}; Python {platform.python_version()}.",
        "",
        "## Data (self-distillation)",
        "",
        f"- {len(data)} sequences; {data.meta.get('response_tokens')} response tokens, "
        f"{data.meta.get('total_tokens')} tokens with prompts (temperature {data.meta.get('temperature')}, "
        f"at most {data.meta.get('max_new_tokens')} new tokens; sources {args.roots})",
        "",
        "## Head",
        "",
        f"- parameters: {n_params:,} ({size / 1e6:.2f} MB file); config: `{json.dumps(asdict(head.config), default=str)}`",
        "",
        "## Training",
        "",
        f"- {result.steps} steps of {result.total_steps} planned, {result.seconds / 60:.1f} min"
        + (" (stopped by the time budget)" if result.stopped_early else ""),
        f"- config (ttt_steps = recursion depth; draft_vocab_size / fc_norm / capture_layers unused): "
        f"`{json.dumps(asdict(cfg))}`",
        f"- last train record: `{json.dumps(result.last)}`",
        f"- last validation record: `{json.dumps(result.last_val)}`",
        "",
        "## Phase times (s)",
        "",
        ", ".join(f"{k} {v:.1f}" for k, v in phases.times.items()),
        "",
    ]
    if eval_rows:
        lines += ["## Evaluation (held-out prompts, greedy)", "", format_table(eval_rows), ""]
    (out / "TRAINING.md").write_text("\n".join(lines), encoding="utf-8")


def cmd_mtp(args, argv) -> int:
    """Data -> MTP training (resumable) -> bf16 head + log, curves, TRAINING.md -> optional eval."""
    from specdec.drafters.mtp_checkpoint import save_mtp

    from .cli import OUT_FILES, _data, _device, _load_target, _Phases, _prompts_for_eval, _train_config
    from .evaluate import evaluate_head, format_table
    from .mtp_trainer import train_mtp

    phases = _Phases()
    device = _device(args.device)
    out = Path(args.out).expanduser()
    work = Path(args.work).expanduser() if args.work else out.with_name(out.name + ".work")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # keep float32 generation exact; training uses bf16 autocast
    target = phases.run("load target", _load_target, args, device)
    data = _data(args, target, work, phases)
    cfg = _train_config(args)
    log_path = out / "train_log.jsonl"
    if not args.resume or not (work / "checkpoint").exists():
        log_path.unlink(missing_ok=True)
    result = phases.run("train", train_mtp, target, data, cfg, work_dir=work, log_path=log_path, resume=args.resume)
    save_mtp(result.head, out, dtype=torch.bfloat16)
    size = (out / "model.safetensors").stat().st_size
    print(f"[specdec.train] head: {out / 'model.safetensors'} ({size / 1e6:.2f} MB, bf16)")
    try:
        from .plot import plot_training_log

        phases.run("plot", plot_training_log, log_path, out / "training_curves.png", title=f"MTP head for {args.target}")
    except ImportError as e:
        print(f"[specdec.train] no PNG: {e}; later: python -m specdec.train plot --log {log_path}")
    _record(out, args, argv, data, cfg, result, phases, None)  # complete before the (long) evaluation
    if args.eval:
        prompts = _prompts_for_eval(args)
        setups = tuple(args.eval_setups.split(","))
        rows = phases.run("eval", evaluate_head, target, out, prompts, setups=setups, batch_size=args.eval_batch_size,
                          max_new_tokens=args.eval_max_new_tokens, drafter="mtp")
        print(format_table(rows, title=f"held-out prompts ({args.eval_source}), greedy, {args.eval_max_new_tokens} new tokens"))
        (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
        _record(out, args, argv, data, cfg, result, phases, rows)
    total = time.perf_counter() - phases.start
    print(f"[specdec.train] done in {total:.1f} s; outputs in {out}: "
          + ", ".join(f for f in OUT_FILES if (out / f).exists()))
    return 0
