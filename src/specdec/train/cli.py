"""`python -m specdec.train ...` / `specdec train ...`: the command line of draft-head training.

Subcommands:

- ``eagle3``: the whole pipeline in one call: prompts -> the target's responses (cached in
  the work folder) -> draft vocabulary -> TTT training (resumable) -> the head in the official
  layout (bf16) with its log, curves and a TRAINING.md record -> optional evaluation.
- ``mtp``: the same pipeline (`pipeline`) for an MTP head (`mtp_trainer`): MTP-Eagle recursion
  on the target's last hidden state, saved in the standalone specdec MTP layout.
- ``eval``: mean acceptance length and speed of a head on held-out prompts (a table).
- ``prompts``: show or write prompts of a split (the frozen evaluation set is made with it).
- ``categories``: write the per-category held-out set (``categories_heldout.jsonl``, `categories`).
- ``deepen``: an EAGLE-3 head with more draft layers that drafts what the head drafts (the new
  layers start as identities): the cost of a deeper head, timed before one is trained.
- ``plot``: redraw the curves PNG from a training log.

Owns argument parsing; the pipeline (phases, data cache, record) is `pipeline`, the work is in
the sibling modules.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .categories import frozen_category_prompts, make_categories_heldout
from .expand import target_generate
from .plot import plot_training_log
from .prompts import (
    frozen_edit_prompts,
    frozen_heldout_prompts,
    heldout_prompts,
    make_frozen_heldout,
    sample_prompts,
    write_prompts,
)

# The modules that import torch (specdec.models, trainer, pipeline, evaluate) are imported in the
# commands that use them, not here: `specdec train --help` imports no torch (tests/entrypoints/test_cli_startup.py).

__all__ = ["main"]

def _target_path(spec: str):
    if spec.lower() == "smollm2":
        from specdec.models import smollm2_gguf_path  # torch: see the note at the top

        return smollm2_gguf_path()
    return Path(spec).expanduser()


def _device(spec: str):
    import torch  # see the note at the top

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _dtype(spec: str):
    import torch  # see the note at the top

    dtype = getattr(torch, spec, None)
    if not isinstance(dtype, torch.dtype):
        raise SystemExit(f"--dtype {spec!r} is not a torch dtype (float32, bfloat16, float16)")
    return dtype


def _load_target(args, device):
    from specdec.models import load_target  # torch: see the note at the top

    return load_target(_target_path(args.target), device=device, dtype=_dtype(args.dtype))


def _prompts_for_eval(args):
    if args.eval_source == "categories":
        return frozen_category_prompts(args.eval_prompts)  # eval_prompts: per category
    if args.eval_source == "frozen":
        return frozen_heldout_prompts(args.eval_prompts)
    if args.eval_source == "edit":
        return frozen_edit_prompts(args.eval_prompts)
    return heldout_prompts(args.eval_prompts, args.seed)


def _train_config(args):
    from .trainer import TrainConfig  # torch: see the note at the top

    layers = tuple(int(x) for x in args.capture_layers.split(",")) if args.capture_layers else None
    init_head = getattr(args, "init_head", None)
    return TrainConfig(
        draft_vocab_size=args.draft_vocab_size, ttt_steps=args.ttt_steps, prompt_weight=args.prompt_weight,
        teacher_temperature=getattr(args, "teacher_temperature", TrainConfig.teacher_temperature),
        epochs=args.epochs, max_steps=args.steps, batch_tokens=args.batch_tokens, max_len=args.max_len, lr=args.lr,
        warmup_steps=args.warmup, seed=args.seed, max_minutes=args.max_minutes,
        fit_schedule=not getattr(args, "no_fit_schedule", False), log_every=args.log_every,
        val_every=args.val_every, fc_norm=not args.no_fc_norm, capture_layers=layers, compile=args.compile,
        early_stop_patience=getattr(args, "early_stop_patience", None),
        val_fraction=getattr(args, "val_fraction", TrainConfig.val_fraction),
        init_head=None if init_head is None else str(Path(init_head).expanduser()),
        mtp_loss_vocab=getattr(args, "mtp_loss_vocab", TrainConfig.mtp_loss_vocab),
        draft_layers=getattr(args, "draft_layers", TrainConfig.draft_layers),
    )


def _cmd_train(args, argv) -> int:
    from .pipeline import RECIPES, run_pipeline  # torch: see the note at the top

    if args.val_prompts < 0:
        raise SystemExit(f"--val-prompts {args.val_prompts} is negative; allowed: an int >= 0 (0: validate on a "
                         f"--val-fraction share of the training data)")
    if args.max_variants < 1:
        raise SystemExit(f"--max-variants {args.max_variants} is out of range; allowed: an int >= 1 (1: each prompt once)")
    if not args.variant_temperature > 0:
        raise SystemExit(f"--variant-temperature {args.variant_temperature} is out of range; allowed: a number > 0")
    if args.draft_layers < 1 or (args.command == "mtp" and args.draft_layers != 1):
        allowed = "1 (an MTP head is one module)" if args.command == "mtp" else "an int >= 1"
        raise SystemExit(f"--draft-layers {args.draft_layers} is out of range for {args.command}; allowed: {allowed}")
    if args.init_head is not None and not (Path(args.init_head).expanduser() / "config.json").is_file():
        raise SystemExit(f"--init-head {args.init_head}: no head there (a folder with config.json and model.safetensors)")

    return run_pipeline(RECIPES[args.command](), args, argv, load_target=_load_target, device=_device(args.device),
                        train_config=_train_config, eval_prompts=_prompts_for_eval)


# --------------------------------------------------------------------------- others
def _cmd_eval(args, argv) -> int:
    from .evaluate import HEADLESS_DRAFTERS, evaluate_head, format_depth_table, format_table  # torch: see the note at the top

    device = _device(args.device)
    target = _load_target(args, device)
    prompts = _prompts_for_eval(args)
    headless = args.drafter in HEADLESS_DRAFTERS
    if headless == (args.head is not None):
        raise SystemExit(f"--drafter {args.drafter} " + ("takes no --head" if headless else "needs --head"))
    head = None if headless else Path(args.head).expanduser()
    try:
        options = json.loads(args.plugin_options) if args.plugin_options else None
    except json.JSONDecodeError as e:
        raise SystemExit(f"--plugin-options {args.plugin_options!r} is not JSON: {e}")
    rows = evaluate_head(target, head, prompts, setups=tuple(args.eval_setups.split(",")),
                         batch_size=args.eval_batch_size, max_new_tokens=args.eval_max_new_tokens, drafter=args.drafter,
                         plugin_options=options)
    print(format_table(rows, title=f"{args.head or args.drafter} on {len(prompts)} held-out prompts ({args.eval_source}), greedy, "
                                   f"{args.eval_max_new_tokens} new tokens, {device}"))
    depth_table = format_depth_table(rows)
    if depth_table:
        print("\nAcceptance by depth (where the head fails)\n\n" + depth_table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _cmd_prompts(args, argv) -> int:
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


def _cmd_categories(args, argv) -> int:
    target = _load_target(args, _device(args.device))
    generate = target_generate(target, max_new_tokens=args.history_tokens, batch_size=args.per_category, seed=args.seed)
    prompts = make_categories_heldout(generate, args.per_category, args.seed)
    print(f"wrote {len(prompts)} prompts to {write_prompts(prompts, args.write)}")
    return 0


def _cmd_plot(args, argv) -> int:
    png = args.png or str(Path(args.log).with_name("training_curves.png"))
    print(plot_training_log(args.log, png))
    return 0


def _cmd_deepen(args, argv) -> int:
    import torch  # torch: see the note at the top

    from specdec.drafters.eagle3_checkpoint import load_eagle3, save_eagle3
    from .trainer import deepen

    head = load_eagle3(Path(args.head).expanduser(), dtype=torch.float32)
    if not head.config.num_layers < args.layers:
        raise SystemExit(f"--layers {args.layers} is out of range: {args.head} has {head.config.num_layers} draft "
                         f"layers; allowed: more than {head.config.num_layers}")
    dtype = getattr(torch, args.dtype)
    out = save_eagle3(deepen(head, args.layers, torch.Generator().manual_seed(args.seed), args.init_std),
                      Path(args.out).expanduser(), dtype=dtype)
    print(f"{out}: {args.layers} draft layers ({head.config.num_layers} from {args.head}, the rest identities), {args.dtype}")
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--eval-source", choices=("frozen", "categories", "edit", "heldout"), default="frozen",
                   help="frozen: the held-out set shipped with specdec (same on every machine); categories: the shipped "
                        "per-category set (code-long-context, code-short-header, chat-about-code, general-chat, math, "
                        "multi-turn); edit: the shipped repetitive set (repeat a given file with a rename, copy a list); "
                        "heldout: drawn here")
    p.add_argument("--eval-prompts", type=int, default=None,
                   help="number of held-out prompts (per category with --eval-source categories; default: all frozen)")
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
    g.add_argument("--data-mix", choices=("source", "diverse"), default="source",
                   help="source: prompts from Python source files only; diverse: + templated chat, math, short code "
                        "headers, self-instruct and multi-turn prompts (specdec.train.mix)")
    g.add_argument("--mix-shares", default=None,
                   help="diverse mix shares (those named are the whole mix; default "
                        "source=0.4,instruct=0.2,math=0.1,header=0.1,self_instruct=0.1,multi_turn=0.1)")
    g.add_argument("--max-variants", type=int, default=6,
                   help="with --data-mix diverse: an instruct or header prompt (a few hundred distinct ones each) may "
                        "appear this many times, its greedy answer then answers sampled at --variant-temperature, before "
                        "the rest of its share goes to source prompts; 1: each once")
    g.add_argument("--instruct-pool", choices=("base", "wide"), default="wide",
                   help="with --data-mix diverse: the instruction requests (and the self-instruct and multi-turn seeds): "
                        "wide = 11616 training requests (359 training topics, 32 ways of asking: specdec.train.wide_topics); "
                        "base = the 696 of the topics and templates the frozen evaluation set was drawn beside")
    g.add_argument("--variant-temperature", type=float, default=0.8,
                   help="sampling temperature of the repeated prompts' answers (> 0; the head still learns the "
                        "target's own next-token distribution on them)")
    g.add_argument("--val-prompts", type=int, default=256,
                   help="with --data-mix diverse: validate (per category, early stopping) on this many prompts of the mix's "
                        "HELD-OUT split (unseen topics/templates, no frozen evaluation prompt), self-distilled like the "
                        "training data and cached as <work>/val_data.pt; 0: a --val-fraction share of the training data")
    g.add_argument("--max-new-tokens", type=int, default=192)
    g.add_argument("--max-prompt-tokens", type=int, default=384)
    g.add_argument("--gen-batch-size", type=int, default=256)
    g.add_argument("--gen-minutes", type=float, default=None, help="stop starting new generation batches after this")
    g.add_argument("--prompt-minutes", type=float, default=None,
                   help="with --data-mix diverse: stop the prompts stage (the target writing self-instruct requests and "
                        "conversations) after this, keeping its replies in <work>/prompt_replies.jsonl, and exit 3: the "
                        "same command again goes on from there (default: no limit)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy responses")
    g.add_argument("--gen-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="dtype of the target that writes the responses (only that: the training labels come from the "
                        "teacher forward in --dtype, the evaluation runs in --dtype); auto: bfloat16 on CUDA, where "
                        "float32 matmuls without TF32 bound the generation, --dtype elsewhere")
    g.add_argument("--gen-cuda-graph", choices=("auto", "off"), default="auto",
                   help="auto: replay the decode forward from a CUDA graph on CUDA (checked once, eager on failure)")
    g.add_argument("--data-only", action="store_true",
                   help="stop after the data (generated or resumed, and the validation data): a call of its own, "
                        "before the calls that train")
    g.add_argument("--regenerate", action="store_true",
                   help="ignore <work>/data.pt and the responses saved so far (generation resumes otherwise)")
    g.add_argument("--reuse-data", action="store_true",
                   help="generate nothing: <work>/data.pt (and val_data.pt) must be there, made with these data flags, "
                        "else exit with the settings that differ (the train/finish calls of a run split over calls, "
                        "where a changed data flag would otherwise regenerate the data inside the training's time)")
    g.add_argument("--continue-generation", action="store_true",
                   help="answer the prompts that --gen-minutes left unanswered in <work>/data.pt (until this call's "
                        "--gen-minutes), then train from scratch on the larger data")
    g = p.add_argument_group("training")
    g.add_argument("--draft-vocab-size", type=int, default=4096,
                   help="eagle3: the head's output vocabulary; mtp: the draft_vocab.safetensors written beside the head "
                        "(the most frequent training targets; see --mtp-loss-vocab)")
    g.add_argument("--mtp-loss-vocab", choices=("full", "draft"), default="full",
                   help="mtp: the loss over the full vocabulary (default), or over the draft vocabulary only, as "
                        "EAGLE-3 trains (~V / Vd times less lm_head work per step; drafting uses that vocabulary)")
    g.add_argument("--draft-layers", type=int, default=1,
                   help="eagle3: decoder layers of the head (1: the official layout; more: speculators' layers.{i}); "
                        "with --init-head, the layers it lacks start as identities")
    g.add_argument("--ttt-steps", type=int, default=7, help="TTT steps (eagle3) / recursion depth trained (mtp)")
    g.add_argument("--prompt-weight", type=float, default=0.1)
    g.add_argument("--teacher-temperature", type=float, default=1.0,
                   help="the loss's soft target is softmax(target logits / this): 1 (default) the target's own "
                        "distribution; below 1 sharper toward its argmax, the one token greedy verification accepts; "
                        "0 the argmax alone")
    g.add_argument("--epochs", type=float, default=4.0)
    g.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    g.add_argument("--batch-tokens", type=int, default=16384)
    g.add_argument("--max-len", type=int, default=1024)
    g.add_argument("--lr", type=float, default=6e-4)
    g.add_argument("--warmup", type=int, default=40)
    g.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget of the training phase")
    g.add_argument("--no-fit-schedule", action="store_true",
                   help="keep the --steps/--epochs schedule: --max-minutes then only ends this call (checkpointed) "
                        "and the next call resumes it, so one training runs over several calls (default: the schedule "
                        "is shortened to end within --max-minutes)")
    g.add_argument("--log-every", type=int, default=10)
    g.add_argument("--val-every", type=int, default=100)
    g.add_argument("--val-fraction", type=float, default=0.02,
                   help="share of the distilled sequences held out for validation (per category in the log)")
    g.add_argument("--early-stop-patience", type=int, default=None,
                   help="stop after this many validations (every --val-every steps) without a better mean est. tau over "
                        "the validation categories (default: off, the whole schedule runs)")
    g.add_argument("--capture-layers", default=None, help="e.g. 1,14,26 (output convention); default (1, L//2-1, L-4)")
    g.add_argument("--init-head", default=None, metavar="FOLDER",
                   help="start from this head's weights and draft vocabulary (a fresh optimizer and schedule; "
                        "the settings must match it): training goes on across machines and sessions, on new data "
                        "(another --seed gives other prompts); a checkpoint in --work to resume comes first")
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
    p.set_defaults(fn=_cmd_train)

    p = sub.add_parser("mtp", help="the same pipeline for an MTP head (MTP-Eagle recursion on the target's last hidden state)")
    _pipeline_args(p)
    p.set_defaults(fn=_cmd_train)

    p = sub.add_parser("eval", help="acceptance length and speed of a head on held-out prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--head", default=None, help="EAGLE-3 (or, with --drafter mtp, MTP) checkpoint folder; none for ngram")
    p.add_argument("--drafter", choices=("eagle3", "mtp", "ngram"), default="eagle3",
                   help="the drafter of the drafted setups (ngram: model-free, no --head)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--plugin-options", default=None,
                   help='SpecConfig.plugin_options of the drafted setups, as JSON, e.g. \'{"mtp": {"draft_vocab": "full"}}\'')
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

    p = sub.add_parser("categories", help="write the per-category held-out set (multi-turn histories by the target)")
    p.add_argument("--target", required=True, help="the target that answers the earlier turns ('smollm2' for the shipped set)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-category", type=int, default=16)
    p.add_argument("--history-tokens", type=int, default=96, help="max new tokens of each earlier answer")
    p.add_argument("--write", required=True, help="the jsonl to write (the shipped one: src/specdec/train/categories_heldout.jsonl)")
    p.set_defaults(fn=_cmd_categories)

    p = sub.add_parser("deepen", help="an EAGLE-3 head with more draft layers that drafts what it drafts (the new "
                                      "layers start as identities): to time a deeper head before training one")
    p.add_argument("--head", required=True, help="EAGLE-3 checkpoint folder")
    p.add_argument("--layers", type=int, required=True, help="draft layers of the new head (more than the head's)")
    p.add_argument("--out", required=True, help="folder to write (config.json + model.safetensors)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--seed", type=int, default=0, help="draws the new layers' q/k/v and gate/up weights")
    p.add_argument("--init-std", type=float, default=0.02)
    p.set_defaults(fn=_cmd_deepen)

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
