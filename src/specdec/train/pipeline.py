"""The training pipeline behind `python -m specdec.train eagle3|mtp`, one code path for every
head kind: load the target -> self-distilled data (cached in the work folder) -> training
(resumable) -> the head in bf16 with its log, curves and a TRAINING.md record -> optional
evaluation on held-out prompts.

Owns the phase timing, the data cache check, the run and the record. What differs between
head kinds (trainer, saver, drafter name, what the record says of the head) is a `HeadRecipe`;
`RECIPES` holds the built-in ones.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from specdec.drafters.eagle3_checkpoint import save_eagle3
from specdec.drafters.mtp_checkpoint import save_draft_vocab, save_mtp

from . import prompts as prompt_sources  # `prompt_sources.sample_prompts`: looked up when called (tests replace it)
from .categories import frozen_category_prompts
from .conversation import build_mix_distill_data
from .distill import DistillData, build_distill_data
from .evaluate import evaluate_head, format_depth_table, format_table
from .expand import target_generate
from .mix import MixConfig, normalize, sample_mix
from .mtp_trainer import mtp_draft_vocab, train_mtp
from .plot import plot_training_log
from .prompts import frozen_heldout_prompts, read_prompts, write_prompts
from .reply_cache import PromptsUnfinished, ReplyCache, cached_generate
from .trainer import _ordered, category_of_kind, train_eagle3

__all__ = ["OUT_FILES", "HeadRecipe", "Phases", "RECIPES", "estimate_vs_measured", "heldout_val_prompts", "load_or_make_data",
           "load_or_make_val_data", "run_pipeline", "validation_table"]

EXIT_PROMPTS_UNFINISHED = 3  # the prompts stage met --prompt-minutes: run the same command again
REPLY_CHUNK_BATCHES = 4  # the prompts stage saves the target's replies every this many generation batches
VAL_SEED_OFFSET = 1009  # the held-out validation prompts' draw: not the seed of any frozen set's draw

OUT_FILES = (
    "config.json", "model.safetensors", "draft_vocab.safetensors", "training_curves.png", "train_log.jsonl",
    "TRAINING.md", "eval.json",
)


class Phases:
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


@dataclass(frozen=True)
class HeadRecipe:
    """One head kind. train(target, data, cfg, work_dir=, log_path=, resume=) -> `TrainResult`;
    save(head, folder, dtype=) writes config.json + model.safetensors; head_lines(result)
    -> the record's "Head" bullet lines; config_note is printed before the training config;
    extras(folder, target, data, cfg) -> more record lines, after writing any extra files."""

    drafter: str
    title: str
    layout: str
    train: Callable
    save: Callable
    head_lines: Callable
    config_note: str = "config"
    extras: Callable | None = None


def _eagle3_recipe() -> HeadRecipe:
    def head_lines(result):
        c = result.head.config
        return [
            f"draft vocabulary {c.draft_vocab_size} tokens covering {result.coverage:.1%} of the training targets",
            f"capture layers (output convention): {c.capture_layers}; fc_norm: {c.fc_norm}; draft layers: {c.num_layers}",
        ]

    return HeadRecipe("eagle3", "EAGLE-3 head", "official EAGLE-3 layout (config.json + model.safetensors, bf16)",
                      train_eagle3, save_eagle3, head_lines)


def _mtp_recipe() -> HeadRecipe:
    def head_lines(result):
        return [f"config: `{json.dumps(asdict(result.head.config), default=str)}`"]

    def draft_vocab(out: Path, target, data, cfg) -> list[str]:
        """draft_vocab.safetensors: the cfg.draft_vocab_size most frequent training targets
        (`mtp_draft_vocab`: the vocabulary a "draft" loss trained on)."""
        vocab = mtp_draft_vocab(target, data, cfg)
        if vocab is None:
            return ["draft vocabulary: none (drafting covers the whole vocabulary)"]
        target_ids, cover = vocab
        save_draft_vocab(out, target_ids)
        trained = "the loss covered it too" if cfg.mtp_loss_vocab == "draft" else "the loss covered the full vocabulary"
        return [f"draft vocabulary (draft_vocab.safetensors): {cfg.draft_vocab_size} tokens covering "
                f"{cover:.1%} of the training targets; drafting is restricted to it; {trained}"]

    return HeadRecipe(
        "mtp", "MTP head",
        "standalone specdec MTP layout (config.json + model.safetensors, bf16); MTP-Eagle recursion on the target's "
        "last hidden state, logits through the target's lm_head",
        train_mtp, save_mtp, head_lines,
        config_note="config (ttt_steps = recursion depth; fc_norm / capture_layers unused; draft_vocab_size: the "
                    "draft vocabulary written beside the head; mtp_loss_vocab: the loss over it or the full vocabulary)",
        extras=draft_vocab,
    )


RECIPES: dict[str, Callable[[], HeadRecipe]] = {"eagle3": _eagle3_recipe, "mtp": _mtp_recipe}


def _mix_config(args):
    """The `mix.MixConfig` of ``--data-mix diverse``: ``--mix-shares`` (the named shares are the
    whole mix, others 0; none given: `MixConfig`'s defaults) and ``--roots``; the frozen
    evaluation sets' texts are excluded from training."""
    shares = {}
    if getattr(args, "mix_shares", None):
        try:
            shares = {k.strip(): float(v) for k, v in (item.split("=") for item in args.mix_shares.split(","))}
        except ValueError:
            raise SystemExit(f"--mix-shares {args.mix_shares!r} is not a list of name=number")
    fields = {"source", "instruct", "math", "header", "self_instruct", "multi_turn"}
    if set(shares) - fields:
        raise SystemExit(f"--mix-shares names {sorted(set(shares) - fields)}; allowed: {sorted(fields)}")
    if shares:  # the named shares are the whole mix
        shares = {f: shares.get(f, 0.0) for f in fields}
    frozen = frozen_category_prompts() + frozen_heldout_prompts()
    return MixConfig(**shares, roots=tuple(args.roots.split(",")),
                     max_variants=getattr(args, "max_variants", MixConfig.max_variants),
                     instruct_pool=getattr(args, "instruct_pool", MixConfig.instruct_pool),
                     exclude_texts=frozenset(normalize(p.text) for p in frozen))


def _diverse_prompts(args, target, *, n: int | None = None, split: str = "train", cache: ReplyCache | None = None,
                     deadline: float | None = None):
    """The diverse mix's prompts of `split`; with `cache`, the target's replies (self-instruct,
    conversations) are kept there as they come and the stage stops at `deadline`
    (`PromptsUnfinished`), to resume in the next call."""
    kw = {"max_new_tokens": args.max_new_tokens, "batch_size": args.gen_batch_size, "cuda_graph": args.gen_cuda_graph != "off"}
    generate = target_generate(target, seed=args.seed, **kw)
    if split == "train":  # self-instruct tries past its angles sample (greedy they would repeat)
        sample = target_generate(target, temperature=getattr(args, "variant_temperature", 0.8), seed=args.seed + 1, **kw)
        if cache is not None:  # the cache holds one set of data settings (`_reply_cache`): the labels name the generator only
            chunk = REPLY_CHUNK_BATCHES * args.gen_batch_size
            generate = cached_generate(generate, cache, "greedy", chunk=chunk, deadline=deadline)
            sample = cached_generate(sample, cache, "sampled", chunk=chunk, deadline=deadline)
        return sample_mix(args.num_prompts, args.seed, config=_mix_config(args), generate=generate, sample=sample)
    config = replace(_mix_config(args), max_variants=1)  # validation: greedy answers to distinct prompts only
    prompts = sample_mix(n, args.seed + VAL_SEED_OFFSET, split=split, config=config, generate=generate)
    # sample_mix tops up with source-file prompts without looking at exclude_texts; the frozen
    # evaluation sets are cut from the held-out split, so filter them out here
    return [p for p in prompts if normalize(p.text) not in config.exclude_texts]


def heldout_val_prompts(args, target) -> list:
    """The ``--val-prompts`` prompts of the diverse mix's HELD-OUT split (unseen topics, templates,
    follow-ups and source files; never a prompt of the frozen evaluation sets), same shares."""
    return _diverse_prompts(args, target, n=args.val_prompts, split="heldout")


def _data_settings(args) -> dict:
    settings = dict(
        target=str(args.target), num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature, seed=args.seed, roots=args.roots,
    )
    if getattr(args, "data_mix", "source") == "diverse":  # only then, so caches made before the flag existed stay valid
        settings.update(data_mix="diverse", mix_shares=getattr(args, "mix_shares", None),
                        max_variants=getattr(args, "max_variants", MixConfig.max_variants),
                        variant_temperature=getattr(args, "variant_temperature", None),
                        instruct_pool=getattr(args, "instruct_pool", MixConfig.instruct_pool))
    return settings


def _check_reuse_data(args) -> None:
    """``--reuse-data`` with ``--regenerate`` asks for two opposite things: refuse before anything is removed."""
    if getattr(args, "reuse_data", False) and args.regenerate:
        raise SystemExit("--reuse-data and --regenerate contradict each other: pass one")


def _refuse_to_generate(args, path: Path, cached: dict | None, settings: dict) -> None:
    """``--reuse-data``: the data must come from <work>, made with these settings (`cached`: the
    settings it was made with, None: not there); exit naming what differs."""
    if not getattr(args, "reuse_data", False):
        return
    if cached is None:
        raise SystemExit(f"--reuse-data: {path} is not there; make it first with the same data flags (--data-only)")
    differ = [f"{k}: made with {cached.get(k)!r}, asked {settings.get(k)!r}"
              for k in sorted(set(cached) | set(settings)) if cached.get(k) != settings.get(k)]
    raise SystemExit(f"--reuse-data: {path} was made with other data settings ({'; '.join(differ)}); pass the flags "
                     f"it was made with, or drop --reuse-data to make it again")


def load_or_make_val_data(args, target, work: Path, phases: Phases, generation_target: Callable | None = None):
    """The held-out validation data (``--data-mix diverse`` with ``--val-prompts N > 0``):
    <work>/val_data.pt when made with the same settings, else `heldout_val_prompts` (also written
    to <work>/val_prompts.jsonl) -> the target's responses with the training data's settings.
    None without the diverse mix or with ``--val-prompts 0`` (validation on a share of the training data).
    generation_target() gives the target that generates (default `target`; `GenerationTarget`)."""
    n = getattr(args, "val_prompts", 0) or 0
    if getattr(args, "data_mix", "source") != "diverse" or n == 0:
        return None
    _check_reuse_data(args)
    settings = dict(_data_settings(args), val_prompts=n, val_split="heldout", val_seed_offset=VAL_SEED_OFFSET)
    path = work / "val_data.pt"
    if path.is_file() and not args.regenerate:
        data = DistillData.load(path)
        if data.meta.get("settings") == settings:
            print(f"[specdec.train] reusing {path}: {len(data)} held-out validation sequences")
            return data
        _refuse_to_generate(args, path, data.meta.get("settings") or {}, settings)
        print(f"[specdec.train] {path} was made with other settings; regenerating")
    _refuse_to_generate(args, path, None, settings)
    gen = generation_target() if generation_target is not None else target
    prompts = phases.run("validation prompts (held-out split of the diverse mix)", heldout_val_prompts, args, gen)
    write_prompts(prompts, work / "val_prompts.jsonl")
    data = phases.run(
        "generate validation", build_mix_distill_data, gen, prompts, max_new_tokens=args.max_new_tokens,
        batch_size=args.gen_batch_size, max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        seed=args.seed, cuda_graph=args.gen_cuda_graph != "off",
    )
    if len(data) == 0:
        raise SystemExit(f"--val-prompts {n}: none of the {len(prompts)} held-out prompts gave a validation sequence "
                         f"(too long for --max-prompt-tokens {args.max_prompt_tokens}?); pass --val-prompts 0")
    data.meta["settings"] = settings
    print(f"[specdec.train] validation data (held-out split): {len(data)} sequences, "
          f"{data.meta['response_tokens']} response tokens")
    data.save(path)
    return data


def load_or_make_data(args, target, work: Path, phases: Phases, generation_target: Callable | None = None):
    """<work>/data.pt when it was made with the same settings, else prompts -> the target's responses.

    Generation resumes: the prompts are kept in <work>/prompts.jsonl and the responses so far in
    <work>/responses.pt, so a call killed mid-generation (time limit, lost machine) continues where
    it stopped, and ``--continue-generation`` answers the prompts a ``--gen-minutes`` deadline left
    unanswered in a finished data.pt (its training checkpoint, made on less data, is set aside).
    ``--regenerate`` starts over. generation_target() gives the target that generates (default
    `target`; `GenerationTarget` loads it in ``--gen-dtype`` only when something is generated).
    """
    settings = _data_settings(args)
    diverse = getattr(args, "data_mix", "source") == "diverse"
    path, responses = work / "data.pt", work / "responses.pt"
    _check_reuse_data(args)
    if args.regenerate:
        responses.unlink(missing_ok=True)
    elif path.is_file():
        data = DistillData.load(path)
        more = getattr(args, "continue_generation", False) and data.meta.get("prompts_not_reached", 0) > 0
        if data.meta.get("settings") == settings and not more:
            print(f"[specdec.train] reusing {path}: {len(data)} sequences, {data.meta.get('total_tokens')} tokens")
            return data
        if more and data.meta.get("settings") == settings:
            if getattr(args, "reuse_data", False):
                raise SystemExit("--reuse-data and --continue-generation contradict each other: pass one")
            _set_aside_checkpoint(work, "the data grows")
        else:
            _refuse_to_generate(args, path, data.meta.get("settings") or {}, settings)
            print(f"[specdec.train] {path} was made with other settings; regenerating")
    else:
        _refuse_to_generate(args, path, None, settings)
    build = build_mix_distill_data if diverse else build_distill_data  # the first is multi-turn aware
    gen = generation_target() if generation_target is not None else target
    prompts = _cached_prompts(args, gen, work, phases, settings, diverse)
    deadline = None if args.gen_minutes is None else time.perf_counter() + 60 * args.gen_minutes
    data = phases.run(
        "generate", build, gen, prompts, max_new_tokens=args.max_new_tokens,
        batch_size=args.gen_batch_size, max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        variant_temperature=getattr(args, "variant_temperature", 0.8), seed=args.seed, deadline=deadline,
        cuda_graph=args.gen_cuda_graph != "off", resume_path=responses,
    )
    data.meta["settings"] = settings
    data.meta["gen_dtype"] = _dtype_name(gen)
    m = data.meta
    secs, new = max(m["seconds"], 1e-9), m["new_response_tokens"]
    print(f"[specdec.train] data: {len(data)} sequences ({m['prompts_not_reached']} prompts not reached, "
          f"{m['prompts_too_long']} too long, {m['resumed']} answered by an earlier call), {m['response_tokens']} "
          f"response / {m['total_tokens']} total tokens; this call wrote {new} response tokens in {secs:.0f} s, "
          f"{new / secs:.0f} tok/s")
    data.save(path)
    return data


def _cached_prompts(args, target, work: Path, phases: Phases, settings: dict, diverse: bool) -> list:
    """The training prompts: <work>/prompts.jsonl when made with the same settings, else new ones
    (the diverse mix's self-instruct and multi-turn prompts take the target minutes to write:
    `--prompt-minutes` splits that over calls, `_reply_cache`)."""
    path, meta = work / "prompts.jsonl", work / "prompts.settings.json"
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == settings:
        prompts = read_prompts(path)
        print(f"[specdec.train] reusing {path}: {len(prompts)} prompts")
        return prompts
    if diverse:
        replies = _reply_cache(work, settings)
        minutes = getattr(args, "prompt_minutes", None)
        deadline = None if minutes is None else time.perf_counter() + 60 * minutes
        if len(replies):
            print(f"[specdec.train] resuming the prompts: {len(replies)} replies of the target in {replies.path}")
        try:
            prompts = phases.run("prompts (diverse mix)", _diverse_prompts, args, target, cache=replies, deadline=deadline)
        except PromptsUnfinished as e:
            print(f"[specdec.train] the prompts stage stopped at --prompt-minutes {minutes}: {e}. Run the same command "
                  f"again: it goes on from there (exit {EXIT_PROMPTS_UNFINISHED})", flush=True)
            raise SystemExit(EXIT_PROMPTS_UNFINISHED) from None
    else:
        prompts = phases.run("prompts", prompt_sources.sample_prompts, args.num_prompts, args.seed, roots=tuple(args.roots.split(",")))
    write_prompts(prompts, path)
    meta.write_text(json.dumps(settings, sort_keys=True))
    return prompts


def _reply_cache(work: Path, settings: dict) -> ReplyCache:
    """<work>/prompt_replies.jsonl, the prompts stage's replies so far; emptied when it was made
    with other data settings (another target, seed or mix writes other replies)."""
    path, meta = work / "prompt_replies.jsonl", work / "prompt_replies.settings.json"
    if not (meta.is_file() and json.loads(meta.read_text()) == settings):
        path.unlink(missing_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps(settings, sort_keys=True))
    return ReplyCache(path)


def _set_aside_checkpoint(work: Path, why: str) -> None:
    """Move <work>/checkpoint to checkpoint.stale (a resumed training would refuse the new data)."""
    ckpt = work / "checkpoint"
    if ckpt.exists():
        stale = work / "checkpoint.stale"
        shutil.rmtree(stale, ignore_errors=True)
        ckpt.rename(stale)
        print(f"[specdec.train] {why}: the training checkpoint made on the old data moved to {stale}; training starts over")


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None or x != x else format(x, fmt)


def validation_table(last_val: dict | None) -> list[str]:
    """Markdown lines: the last validation's loss, step-0 accuracy and est. tau per category."""
    cats = (last_val or {}).get("categories")
    if not cats:
        return []
    lines = ["| category | val batches | loss | acc (TTT step 0) | est. tau (chain, 5 drafts) |", "|---|---|---|---|---|"]
    for c, v in cats.items():
        lines.append(f"| {c} | {v['batches']} | {_num(v['loss'], '.3f')} | {_num(v['step_acc'][0], '.3f')} | {_num(v['est_tau'])} |")
    lines.append(f"| mean over categories | - | {_num(last_val['mean_loss'], '.3f')} | - | {_num(last_val['mean_est_tau'])} |")
    return lines


def estimate_vs_measured(last_val: dict | None, eval_rows: list[dict] | None) -> list[str]:
    """Markdown lines: per category, the training estimate (chain, 5 drafts, from the last
    validation) beside the tau each drafted evaluation setup measured, and measured minus
    estimated for the chain setup (the estimate's counterpart); "-" where a side lacks the
    category. Empty without an evaluation or a validation."""
    drafted = [r for r in eval_rows or [] if r.get("setup") != "target"]
    if not drafted or not last_val:
        return []
    est = {c: v["est_tau"] for c, v in last_val.get("categories", {}).items()}
    measured = [r.get("tau_by_category", {}) for r in drafted]
    cats = _ordered(list(est) + [c for m in measured for c in m])  # the evaluation table's order
    chain = next((i for i, r in enumerate(drafted) if r.get("setup") == "linear"), None)
    head = "| category | est. tau (training) | " + "".join(f"measured tau ({r['name']}) | " for r in drafted)
    head += "measured - estimated (chain) |" if chain is not None else ""
    lines = [head, "|" + "---|" * (2 + len(drafted) + (chain is not None))]
    rows = [(c, est.get(c), [m.get(c) for m in measured]) for c in cats]
    rows.append(("all", last_val.get("est_tau"), [r.get("tau") for r in drafted]))
    for c, e, ms in rows:
        line = f"| {c} | {_num(e)} | " + "".join(f"{_num(m)} | " for m in ms)
        if chain is not None:
            m = ms[chain]
            line += f"{_num(m - e if m is not None and e is not None else None, '+.2f')} |"
        lines.append(line)
    return lines


def _validation_line(data, val_data, cfg) -> str:
    """The record's line naming the validation set the log and early stopping used."""
    if val_data is None:
        return (f"- validation set: a seeded {cfg.val_fraction:.1%} share of the training data (training topics and "
                f"templates; the rest trains)")
    cats = [category_of_kind(k) for k in val_data.kinds]
    return (f"- validation set: {len(val_data)} sequences self-distilled the same way from "
            f"{val_data.meta.get('prompts_asked')} prompts of the diverse mix's HELD-OUT split (unseen topics, templates, "
            f"follow-ups and source files; no prompt of the frozen evaluation sets; `--val-prompts`), "
            f"{val_data.meta.get('response_tokens')} response tokens; categories: "
            + ", ".join(f"{c} {cats.count(c)}" for c in sorted(set(cats))) + "; every training sequence trains")


def _write_record(recipe: HeadRecipe, out: Path, args, argv, data, cfg, result, phases: Phases, eval_rows,
                  extra_lines: list[str], val_data=None) -> None:
    head = result.head
    n_params = sum(p.numel() for p in head.parameters())
    dev = next(head.parameters()).device
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    size = (out / "model.safetensors").stat().st_size
    kinds = ", ".join(f"{k} {data.kinds.count(k)}" for k in sorted(set(data.kinds)))
    cats = [category_of_kind(k) for k in data.kinds]
    categories = ", ".join(f"{c} {cats.count(c)}" for c in sorted(set(cats)))
    lines = [
        f"# {recipe.title} for `{args.target}`",
        "",
        f"Trained by specdec (`specdec.train {recipe.drafter}`); {recipe.layout}.",
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
        f"train split by source file)"
        + (" and the diverse templated / self-instruct / multi-turn mix (specdec.train.mix, shares "
           f"{getattr(args, 'mix_shares', None) or 'default'}, instruction pool "
           f"{getattr(args, 'instruct_pool', MixConfig.instruct_pool)}; held-out topics and templates never trained on)"
           if getattr(args, "data_mix", "source") == "diverse" else "")
        + f", {len(data)} answered; kinds: {kinds}",
        f"- categories (as in the evaluation table): {categories}",
        f"- responses: the target's own answers (temperature {data.meta.get('temperature')}; "
        f"{data.meta.get('variants', 0)} prompts were repeats answered by sampling at temperature "
        f"{data.meta.get('variant_temperature', '-')}), at most "
        f"{data.meta.get('max_new_tokens')} new tokens; {data.meta.get('response_tokens')} response tokens, "
        f"{data.meta.get('total_tokens')} tokens with prompts; generated in {data.meta.get('seconds')} s"
        + (f" by this call ({data.meta['resumed']} answers from an earlier call)" if data.meta.get("resumed") else ""),
        _validation_line(data, val_data, cfg),
        "",
        "## Head",
        "",
        f"- parameters: {n_params:,} ({size / 1e6:.2f} MB file)",
        *(f"- {line}" for line in recipe.head_lines(result) + extra_lines),
        "",
        "## Training",
        "",
        f"- {result.steps} steps of {result.total_steps} planned, {result.seconds / 60:.1f} min"
        + (" (stopped by the time budget)" if result.stopped_early else "")
        + (f" (early stop: no better mean validation est. tau for {cfg.early_stop_patience} evaluations)"
           if result.plateaued else ""),
        f"- {result.tokens:,} training tokens seen (unpadded, prompts included)"
        + (f"; best mean validation est. tau over the categories {result.best_watched:.2f}"
           if result.best_watched is not None else ""),
        f"- {recipe.config_note}: `{json.dumps(asdict(cfg))}`",
        f"- last train record: `{json.dumps(result.last)}`",
        f"- last validation record: `{json.dumps(result.last_val)}`",
        "",
        "## Phase times (s)",
        "",
        ", ".join(f"{k} {v:.1f}" for k, v in phases.times.items()),
        "",
    ]
    val_lines = validation_table(result.last_val)
    if val_lines:
        lines += ["## Validation per category (last evaluation during training)", "", *val_lines, ""]
    if eval_rows:
        lines += ["## Evaluation (held-out prompts, greedy)", "", format_table(eval_rows), ""]
        depth_table = format_depth_table(eval_rows)
        if depth_table:
            lines += ["## Acceptance by depth (held-out prompts, greedy)", "", depth_table, ""]
        compare = estimate_vs_measured(result.last_val, eval_rows)
        if compare:
            lines += ["## Estimated tau (training) vs measured tau (evaluation)", "",
                      "The estimate is 1 + sum_k prod_{j<=k} acc_j over 5 drafts from the validation's per-step accuracy "
                      + ("(validation sequences come from the held-out split of the diverse mix, not the frozen evaluation "
                         "prompts)." if val_data is not None else
                         "(validation sequences come from the training distribution; the evaluation prompts are held out)."),
                      "", *compare, ""]
    (out / "TRAINING.md").write_text("\n".join(lines), encoding="utf-8")


class GenerationTarget:
    """The target that self-distils: `target` itself, or (``--gen-dtype`` other than the target's
    dtype, e.g. bfloat16 on CUDA, where float32 matmuls without TF32 bound the generation) a
    second copy loaded in that dtype on first use and released once the data exists. Only the
    responses come from it; the training labels are the teacher forward's, of `target`."""

    def __init__(self, args, target, load_target: Callable, device: torch.device, phases: Phases):
        self.target, self.phases, self.device, self.load_target = target, phases, device, load_target
        self.args = args
        self.dtype = generation_dtype(getattr(args, "gen_dtype", "auto"), getattr(args, "dtype", "float32"), device)
        self._loaded = None

    def __call__(self):
        if _dtype_name(self.target) == self.dtype:
            return self.target
        if self._loaded is None:
            args = argparse.Namespace(**{**vars(self.args), "dtype": self.dtype})
            self._loaded = self.phases.run(f"load target ({self.dtype}, generation)", self.load_target, args, self.device)
        return self._loaded

    def release(self) -> None:
        self._loaded = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


GEN_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _dtype_name(target) -> str:
    """A loaded target's weight dtype as ``--dtype`` spells it ("bfloat16")."""
    return str(next(target.model.parameters()).dtype).removeprefix("torch.")


def generation_dtype(gen_dtype: str, dtype: str, device: torch.device) -> str:
    """``--gen-dtype`` resolved: auto is bfloat16 on CUDA and the target's ``--dtype`` elsewhere
    (a CPU has no fast bfloat16 matmul)."""
    if gen_dtype not in GEN_DTYPES:
        raise ValueError(f"gen_dtype={gen_dtype!r}; allowed: {list(GEN_DTYPES)}")
    if gen_dtype != "auto":
        return gen_dtype
    return "bfloat16" if device.type == "cuda" else dtype


def run_pipeline(recipe: HeadRecipe, args, argv, *, load_target, device, train_config, eval_prompts) -> int:
    """Data -> training (resumable) -> bf16 head + log, curves, TRAINING.md -> optional eval.

    Args:
        args: the parsed pipeline flags (`cli._pipeline_args`); argv: the command line, recorded.
        load_target(args, device), train_config(args), eval_prompts(args): the command line's
            readers of its own flags.
    """
    phases = Phases()
    out = Path(args.out).expanduser()
    work = Path(args.work).expanduser() if args.work else out.with_name(out.name + ".work")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # keep float32 generation exact; training uses bf16 autocast
    target = phases.run("load target", load_target, args, device)
    generation_target = GenerationTarget(args, target, load_target, device, phases)
    data = load_or_make_data(args, target, work, phases, generation_target)
    val_data = load_or_make_val_data(args, target, work, phases, generation_target)
    generation_target.release()
    if getattr(args, "data_only", False):
        print(f"[specdec.train] --data-only: {len(data)} sequences in {work / 'data.pt'}"
              + (f", {len(val_data)} validation sequences" if val_data is not None else "") + "; no training")
        return 0
    cfg = train_config(args)
    if val_data is not None:  # every training sequence trains (as the trainers do with val_data=), and the record says so
        cfg = replace(cfg, val_fraction=0.0)
    log_path = out / "train_log.jsonl"
    if not args.resume or not (work / "checkpoint").exists():
        log_path.unlink(missing_ok=True)
    result = phases.run("train", recipe.train, target, data, cfg, work_dir=work, log_path=log_path, resume=args.resume,
                        val_data=val_data)
    recipe.save(result.head, out, dtype=torch.bfloat16)
    extra_lines = recipe.extras(out, target, data, cfg) if recipe.extras is not None else []
    size = (out / "model.safetensors").stat().st_size
    print(f"[specdec.train] head: {out / 'model.safetensors'} ({size / 1e6:.2f} MB, bf16)")
    try:  # matplotlib is optional: plot_training_log raises ImportError without it
        phases.run("plot", plot_training_log, log_path, out / "training_curves.png", title=f"{recipe.title} for {args.target}")
    except ImportError as e:
        print(f"[specdec.train] no PNG: {e}; later: python -m specdec.train plot --log {log_path}")
    _write_record(recipe, out, args, argv, data, cfg, result, phases, None, extra_lines, val_data)  # complete before the (long) evaluation
    if args.eval:
        prompts = eval_prompts(args)
        setups = tuple(args.eval_setups.split(","))
        rows = phases.run("eval", evaluate_head, target, out, prompts, setups=setups, batch_size=args.eval_batch_size,
                          max_new_tokens=args.eval_max_new_tokens, drafter=recipe.drafter)
        print(format_table(rows, title=f"held-out prompts ({args.eval_source}), greedy, {args.eval_max_new_tokens} new tokens"))
        print(format_depth_table(rows))
        (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
        _write_record(recipe, out, args, argv, data, cfg, result, phases, rows, extra_lines, val_data)
    total = time.perf_counter() - phases.start
    print(f"[specdec.train] done in {total:.1f} s; outputs in {out}: "
          + ", ".join(f for f in OUT_FILES if (out / f).exists()))
    return 0
