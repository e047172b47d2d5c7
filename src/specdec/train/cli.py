"""`python -m specdec.train ...` / `specdec train ...`: the command line of draft-head training.

Subcommands:

- ``eagle3``: the whole pipeline in one call: prompts -> the target's responses (cached in
  the work folder) -> draft vocabulary -> TTT training (resumable) -> the head in the official
  layout (bf16) with its log, curves and a TRAINING.md record -> optional evaluation.
- ``mtp``: the same pipeline for an MTP head (`mtp_trainer`, `mtp_cli`): MTP-Eagle recursion
  on the target's last hidden state, saved in the standalone specdec MTP layout.
- ``eval``: mean acceptance length and speed of a head on held-out prompts (a table).
- ``prompts``: show or write prompts of a split (the frozen evaluation set is made with it).
- ``plot``: redraw the curves PNG from a training log.

Owns argument parsing, phase timing and the output folder; the work is in the sibling modules.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

__all__ = ["main"]

OUT_FILES = ("config.json", "model.safetensors", "training_curves.png", "train_log.jsonl", "TRAINING.md", "eval.json")


def _target_path(spec: str):
    if spec.lower() == "smollm2":
        from specdec.models import smollm2_gguf_path

        return smollm2_gguf_path()
    return Path(spec).expanduser()


def _device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _dtype(spec: str) -> torch.dtype:
    dtype = getattr(torch, spec, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--dtype {spec!r} is not a torch dtype (float32, bfloat16, float16)")
    return dtype


class _Phases:
    """Prints and records the wall time of each phase."""

    def __init__(self):
        self.start = time.perf_counter()
        self.times: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kw):
        print(f"[specdec.train] {name} ...", flush=True)
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        self.times[name] = time.perf_counter() - t0
        print(f"[specdec.train] {name}: {self.times[name]:.1f} s (total {time.perf_counter() - self.start:.1f} s)", flush=True)
        return out


def _load_target(args, device):
    from specdec.models import load_target

    return load_target(_target_path(args.target), device=device, dtype=_dtype(args.dtype))


def _prompts_for_eval(args):
    from .prompts import frozen_heldout_prompts, heldout_prompts

    if args.eval_source == "frozen":
        return frozen_heldout_prompts(args.eval_prompts)
    return heldout_prompts(args.eval_prompts, args.seed)


# --------------------------------------------------------------------------- eagle3
def _data(args, target, work: Path, phases: _Phases):
    from .distill import DistillData, build_distill_data
    from .prompts import sample_prompts

    settings = dict(
        target=str(args.target), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature, seed=args.seed, roots=args.roots,
    )
    path = work / "data.pt"
    if path.is_file() and not args.regenerate:
        data = DistillData.load(path)
        if data.meta.get("settings") == settings:
            print(f"[specdec.train] reusing {path}: {len(data)} sequences, {data.meta.get('total_tokens')} tokens")
            return data
        print(f"[specdec.train] {path} was made with other settings; regenerating")
    prompts = phases.run("prompts", sample_prompts, args.num_prompts, args.seed, roots=tuple(args.roots.split(",")))
    deadline = None if args.gen_minutes is None else time.perf_counter() + 60 * args.gen_minutes
    data = phases.run(
        "generate", build_distill_data, target, prompts, max_new_tokens=args.max_new_tokens,
        batch_size=args.gen_batch_size, max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        seed=args.seed, deadline=deadline, cuda_graph=args.gen_cuda_graph != "off",
    )
    data.meta["settings"] = settings
    m = data.meta
    secs = max(m["seconds"], 1e-9)
    print(f"[specdec.train] data: {len(data)} sequences ({m['prompts_not_reached']} prompts not reached, "
          f"{m['prompts_too_long']} too long), {m['response_tokens']} response / {m['total_tokens']} total tokens, "
          f"{m['response_tokens'] / secs:.0f} generated tok/s")
    data.save(path)
    return data


def _train_config(args):
    from .trainer import TrainConfig

    layers = tuple(int(x) for x in args.capture_layers.split(",")) if args.capture_layers else None
    return TrainConfig(
        draft_vocab_size=args.draft_vocab_size, ttt_steps=args.ttt_steps, prompt_weight=args.prompt_weight,
        epochs=args.epochs, max_steps=args.steps, batch_tokens=args.batch_tokens, max_len=args.max_len, lr=args.lr,
        warmup_steps=args.warmup, seed=args.seed, max_minutes=args.max_minutes, log_every=args.log_every,
        val_every=args.val_every, fc_norm=not args.no_fc_norm, capture_layers=layers, compile=args.compile,
    )


def _head_bytes(out: Path) -> int:
    return (out / "model.safetensors").stat().st_size


def _record(out: Path, args, argv, data, cfg, result, phases: _Phases, eval_rows) -> None:
    from dataclasses import asdict

    from .evaluate import format_table

    head = result.head
    n_params = sum(p.numel() for p in head.parameters())
    dev = next(head.parameters()).device
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    lines = [
        f"# EAGLE-3 head for `{args.target}`",
        "",
        "Trained by specdec (`specdec.train`); official EAGLE-3 layout (config.json + model.safetensors, bf16).",
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
        f"- prompts: {data.meta.get('prompts_asked')} asked, drawn from this machine's Python source ({args.roots}; "
        f"train split by source file), {len(data)} answered; kinds: " + ", ".join(
            f"{k} {data.kinds.count(k)}" for k in sorted(set(data.kinds))),
        f"- responses: the target's own greedy answers (temperature {data.meta.get('temperature')}), at most "
        f"{data.meta.get('max_new_tokens')} new tokens; {data.meta.get('response_tokens')} response tokens, "
        f"{data.meta.get('total_tokens')} tokens with prompts; generated in {data.meta.get('seconds')} s",
        "",
        "## Head",
        "",
        f"- parameters: {n_params:,} ({_head_bytes(out) / 1e6:.2f} MB file); draft vocabulary "
        f"{head.config.draft_vocab_size} tokens covering {result.coverage:.1%} of the training targets",
        f"- capture layers (output convention): {head.config.capture_layers}; fc_norm: {head.config.fc_norm}",
        "",
        "## Training",
        "",
        f"- {result.steps} steps of {result.total_steps} planned, {result.seconds / 60:.1f} min"
        + (" (stopped by the time budget)" if result.stopped_early else ""),
        f"- config: `{json.dumps(asdict(cfg))}`",
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


def _cmd_eagle3(args, argv) -> int:
    from specdec.drafters.eagle3_checkpoint import save_eagle3

    from .evaluate import evaluate_head, format_table
    from .trainer import train_eagle3

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
    result = phases.run("train", train_eagle3, target, data, cfg, work_dir=work, log_path=log_path, resume=args.resume)
    save_eagle3(result.head, out, dtype=torch.bfloat16)
    print(f"[specdec.train] head: {out / 'model.safetensors'} ({_head_bytes(out) / 1e6:.2f} MB, bf16)")
    try:
        from .plot import plot_training_log

        phases.run("plot", plot_training_log, log_path, out / "training_curves.png", title=f"EAGLE-3 head for {args.target}")
    except ImportError as e:
        print(f"[specdec.train] no PNG: {e}; later: python -m specdec.train plot --log {log_path}")
    _record(out, args, argv, data, cfg, result, phases, None)  # complete before the (long) evaluation
    rows = None
    if args.eval:
        prompts = _prompts_for_eval(args)
        setups = tuple(args.eval_setups.split(","))
        rows = phases.run("eval", evaluate_head, target, out, prompts, setups=setups,
                          batch_size=args.eval_batch_size, max_new_tokens=args.eval_max_new_tokens)
        print(format_table(rows, title=f"held-out prompts ({args.eval_source}), greedy, {args.eval_max_new_tokens} new tokens"))
        (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
        _record(out, args, argv, data, cfg, result, phases, rows)
    total = time.perf_counter() - phases.start
    print(f"[specdec.train] done in {total:.1f} s; outputs in {out}: "
          + ", ".join(f for f in OUT_FILES if (out / f).exists()))
    return 0


def _cmd_mtp(args, argv) -> int:
    from .mtp_cli import cmd_mtp

    return cmd_mtp(args, argv)


# --------------------------------------------------------------------------- others
def _cmd_eval(args, argv) -> int:
    from .evaluate import HEADLESS_DRAFTERS, evaluate_head, format_table

    device = _device(args.device)
    target = _load_target(args, device)
    prompts = _prompts_for_eval(args)
    headless = args.drafter in HEADLESS_DRAFTERS
    if headless == (args.head is not None):
        raise SystemExit(f"--drafter {args.drafter} " + ("takes no --head" if headless else "needs --head"))
    head = None if headless else Path(args.head).expanduser()
    rows = evaluate_head(target, head, prompts, setups=tuple(args.eval_setups.split(",")),
                         batch_size=args.eval_batch_size, max_new_tokens=args.eval_max_new_tokens, drafter=args.drafter)
    print(format_table(rows, title=f"{args.head or args.drafter} on {len(prompts)} held-out prompts ({args.eval_source}), greedy, "
                                   f"{args.eval_max_new_tokens} new tokens, {device}"))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _cmd_prompts(args, argv) -> int:
    from .prompts import make_frozen_heldout, sample_prompts, write_prompts

    mix = None
    if args.mix:
        mix = {k: float(v) for k, v in (item.split("=") for item in args.mix.split(","))}
    if args.frozen:
        prompts = make_frozen_heldout(seed=args.seed)
    else:
        prompts = sample_prompts(args.n, args.seed, split=args.split, roots=tuple(args.roots.split(",")), mix=mix)
    if args.write:
        print(f"wrote {len(prompts)} prompts to {write_prompts(prompts, args.write)}")
        return 0
    for p in prompts:
        print(f"===== {p.kind} ({p.source}, chat={p.chat})\n{p.text}\n")
    return 0


def _cmd_plot(args, argv) -> int:
    from .plot import plot_training_log

    png = args.png or str(Path(args.log).with_name("training_curves.png"))
    print(plot_training_log(args.log, png))
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval-source", choices=("frozen", "heldout"), default="frozen",
                   help="frozen: the prompt set shipped with specdec (same on every machine); heldout: drawn here")
    p.add_argument("--eval-prompts", type=int, default=None, help="number of held-out prompts (default: all frozen)")
    p.add_argument("--eval-batch-size", type=int, default=16)
    p.add_argument("--eval-max-new-tokens", type=int, default=128)
    p.add_argument("--eval-setups", default="target,linear,tree", help="comma list of target, linear, tree")


def _pipeline_args(p: argparse.ArgumentParser) -> None:
    """The options of the training pipelines (``eagle3`` and ``mtp``; EAGLE-3-only ones are ignored by mtp)."""
    p.add_argument("--target", required=True, help="HF folder, .gguf file, or 'smollm2' (the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="output folder: the head + log, curves, TRAINING.md, eval.json")
    p.add_argument("--work", default=None, help="data + resumable checkpoint (default: <out>.work)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="target weights (generation and eval); training uses bf16 autocast on CUDA")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("data")
    g.add_argument("--num-prompts", type=int, default=4000)
    g.add_argument("--roots", default="stdlib,site", help="prompt sources: stdlib, site")
    g.add_argument("--max-new-tokens", type=int, default=192)
    g.add_argument("--max-prompt-tokens", type=int, default=384)
    g.add_argument("--gen-batch-size", type=int, default=256)
    g.add_argument("--gen-minutes", type=float, default=None, help="stop starting new generation batches after this")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy responses")
    g.add_argument("--gen-cuda-graph", choices=("auto", "off"), default="auto",
                   help="auto: replay the decode forward from a CUDA graph on CUDA (checked once, eager on failure)")
    g.add_argument("--regenerate", action="store_true", help="ignore <work>/data.pt")
    g = p.add_argument_group("training")
    g.add_argument("--draft-vocab-size", type=int, default=4096, help="eagle3 only (mtp predicts the full vocabulary)")
    g.add_argument("--ttt-steps", type=int, default=7, help="TTT steps (eagle3) / recursion depth trained (mtp)")
    g.add_argument("--prompt-weight", type=float, default=0.1)
    g.add_argument("--epochs", type=float, default=4.0)
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    g.add_argument("--batch-tokens", type=int, default=16384)
    g.add_argument("--max-len", type=int, default=1024)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--warmup", type=int, default=40)
    g.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget of the training phase")
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--val-every", type=int, default=100)
    g.add_argument("--capture-layers", default=None, help="e.g. 1,14,26 (output convention); default (1, L//2-1, L-4)")
    g.add_argument("--no-fc-norm", action="store_true", help="plain fc (no per-chunk RMSNorm before it)")
    g.add_argument("--compile", action="store_true", help="torch.compile the teacher forward and the TTT unroll")
    g.add_argument("--no-resume", dest="resume", action="store_false", help="start over even if <work>/checkpoint exists")
    g = p.add_argument_group("evaluation")
    g.add_argument("--eval", action="store_true", help="evaluate the head on held-out prompts afterwards")
    _eval_args(g)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specdec.train", description="Train and evaluate EAGLE-3 draft heads.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("eagle3", help="self-distill data, train an EAGLE-3 head with TTT, export (and evaluate) it")
    _pipeline_args(p)
    p.set_defaults(fn=_cmd_eagle3)

    p = sub.add_parser("mtp", help="the same pipeline for an MTP head (MTP-Eagle recursion on the target's last hidden state)")
    _pipeline_args(p)
    p.set_defaults(fn=_cmd_mtp)

    p = sub.add_parser("eval", help="acceptance length and speed of a head on held-out prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--head", default=None, help="EAGLE-3 (or, with --drafter mtp, MTP) checkpoint folder; none for ngram")
    p.add_argument("--drafter", choices=("eagle3", "mtp", "ngram"), default="eagle3",
                   help="the drafter of the drafted setups (ngram: model-free, no --head)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows here")
    _eval_args(p)
    p.set_defaults(fn=_cmd_eval)

    p = sub.add_parser("prompts", help="show or write prompts of a split")
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=("train", "heldout"), default="heldout")
    p.add_argument("--roots", default="stdlib,site")
    p.add_argument("--mix", default=None, help="kind weights, e.g. code=0.5,question=0.3,task=0.1,general=0.1")
    p.add_argument("--frozen", action="store_true", help="the recipe of the shipped evaluation set (make_frozen_heldout)")
    p.add_argument("--write", default=None, help="write JSON lines here instead of printing")
    p.set_defaults(fn=_cmd_prompts)

    p = sub.add_parser("plot", help="draw the curves PNG from a training log")
    p.add_argument("--log", required=True)
    p.add_argument("--png", default=None)
    p.set_defaults(fn=_cmd_plot)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m specdec.train` and `specdec train`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    return int(args.fn(args, argv) or 0)
