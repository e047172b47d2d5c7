"""Evaluation of a draft head: mean acceptance length and speed on held-out prompts.

Owns the standard setups (target-only; for a head (eagle3, mtp) linear drafting with 5 draft
tokens and a dynamic tree of depth 6, top-K 8, 48 draft nodes; for ngram a chain of 8 and a
tree of depth 8 with 4 branches), running them through `SpecDecoder`
(greedy), and the table. Acceptance length tau = tokens emitted per target forward after
prefill, summed over prompts (sum of (new tokens - 1) / sum of steps), the same quantity as
`GenerationStats.mean_accept_length`; it includes the bonus token, so target-only gives 1.
Besides tau over all prompts, code (raw text) and chat prompts, ``tau_by_category`` gives tau
per `categories.category_of` category (code-long-context, ..., multi-turn), and the table shows
one column per category present.

Where a head fails, per category: ``depth_acceptance`` holds, for each drafted setup, the
conditional acceptance p_d = P(depth d accepted | depth d - 1 accepted) over every step of the
category's prompts (`format_depth_table`; 1 - p_1 is the share of steps that accepted nothing). A
head whose p_1 is low fails at its own first prediction (capacity, data); one whose later p_d
fall fails as its drafts feed on themselves (the unroll).
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import torch

from specdec.config import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.validation import model_context_length

from .categories import CATEGORIES, category_of
from .conversation import encode_any
from .prompts import Prompt

__all__ = ["DRAFTER_SETUPS", "SETUPS", "conditional_acceptance", "evaluate_head", "format_depth_table", "format_table"]

def _standard(drafter: str) -> dict[str, tuple[str, SpecConfig]]:
    return {
        "linear": (f"{drafter} linear D=5", SpecConfig(drafter=drafter, tree="linear", max_draft_len=5)),
        "tree": (
            f"{drafter} tree D=6 K=8 N=48",
            SpecConfig(drafter=drafter, tree="dynamic", max_draft_len=6, topk=8, max_total_draft_tokens=48),
        ),
    }


TARGET_ONLY = ("target-only", SpecConfig(drafter="none"))
# Per drafter: the drafted setups. Model heads use the EAGLE-3 paper's shapes; n-gram drafting
# costs no forward, so it goes deep (D=8) with up to 4 branches (as examples/bench_acceptance_ngram.py).
DRAFTER_SETUPS = {
    "eagle3": _standard("eagle3"),
    "mtp": _standard("mtp"),
    "ngram": {
        "linear": ("ngram chain D=8", SpecConfig(drafter="ngram", tree="linear", max_draft_len=8)),
        "tree": ("ngram tree D=8 K=4", SpecConfig(drafter="ngram", tree="dynamic", max_draft_len=8, topk=4)),
    },
}
SETUPS = ("target", "linear", "tree")
HEADLESS_DRAFTERS = ("ngram",)


def conditional_acceptance(accepted: list[int], depth: int) -> list[float]:
    """p_d = P(depth d accepted | depth d - 1 accepted) for d = 1..depth over the steps' accepted
    draft counts (a step that accepted a drafts accepted depths 1..a); NaN where no step got to
    depth d - 1."""
    rates = []
    for d in range(1, depth + 1):
        reached = sum(1 for a in accepted if a >= d - 1)
        rates.append(sum(1 for a in accepted if a >= d) / reached if reached else float("nan"))
    return rates


def _depth_rows(accepted: list[list[int]], cats: list[str], depth: int) -> dict:
    """Per category (and "all"): steps and p_1..p_depth."""
    out = {}
    for cat in ["all"] + _category_order(cats):
        steps = [a for i, seq in enumerate(accepted) if cat in ("all", cats[i]) for a in seq]
        out[cat] = {"steps": len(steps), "p": conditional_acceptance(steps, depth)}
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fitting(prompts: list[Prompt], ids: list[list[int]], target, max_new_tokens: int):
    """The prompts whose tokens plus `max_new_tokens` fit the target's own context
    (`max_position_embeddings`); the rest are left out with a warning that counts them (an
    evaluation set cut from long files can hold prompts a small target cannot read)."""
    context = model_context_length(target)
    if context is None:
        return prompts, ids
    keep = [i for i, x in enumerate(ids) if len(x) + max_new_tokens <= context]
    if not keep:
        raise ValueError(
            f"no evaluation prompt fits the target's context ({context} positions) with max_new_tokens={max_new_tokens}; "
            f"the shortest has {min(len(x) for x in ids)} tokens"
        )
    if len(keep) < len(ids):
        warnings.warn(
            f"evaluation: {len(ids) - len(keep)} of {len(ids)} prompts left out: prompt + max_new_tokens={max_new_tokens} "
            f"exceeds the target's context ({context} positions)",
            stacklevel=3,
        )
    return [prompts[i] for i in keep], [ids[i] for i in keep]


def evaluate_head(
    target,
    head,
    prompts: list[Prompt],
    *,
    setups: tuple[str, ...] = ("target", "linear", "tree"),
    batch_size: int = 16,
    max_new_tokens: int = 128,
    warmup: bool = True,
    progress: bool = True,
    drafter: str = "eagle3",
    plugin_options: dict | None = None,
) -> list[dict]:
    """Run every setup on `prompts` (greedy) and measure acceptance length and speed.

    Args:
        target: a loaded `Target` (its device and dtype are used).
        head: the draft model: a checkpoint folder or a loaded head; None for a drafter
            without a model ("ngram").
        setups: members of `SETUPS`.
        drafter: the drafter the non-target setups run: a key of `DRAFTER_SETUPS`.
        plugin_options: `SpecConfig.plugin_options` of the drafted setups (e.g.
            ``{"mtp": {"draft_vocab": "full"}}``).
    Returns:
        one dict per setup: name, prompts, tau, tau_code, tau_chat, tau_by_category (category ->
        tau, `categories.category_of`), new_tokens, seconds, tokens_per_s, same_as_target (share
        of outputs equal to target-only's, when run), depth_acceptance (drafted setups: "all"
        and each category -> steps, p [p_1..p_D] conditional acceptance; None for
        target-only), batch_size, dtype.
    """
    unknown = sorted(set(setups) - set(SETUPS))
    if unknown:
        raise ValueError(f"unknown setups {unknown}; allowed: {list(SETUPS)}")
    if drafter not in DRAFTER_SETUPS:
        raise ValueError(f"drafter={drafter!r} has no evaluation setups; allowed: {sorted(DRAFTER_SETUPS)}")
    if (head is None) != (drafter in HEADLESS_DRAFTERS):
        need = "no head" if drafter in HEADLESS_DRAFTERS else "a head (checkpoint folder or model)"
        raise ValueError(f"drafter={drafter!r} needs {need}; got head={head!r}")
    if not prompts:
        raise ValueError("evaluate_head needs at least one prompt")
    device = next(target.model.parameters()).device
    ids = [encode_any(p, target.tokenizer, target.info.vocab_size) for p in prompts]
    prompts, ids = _fitting(prompts, ids, target, max_new_tokens)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    longest = max(len(x) for x in ids)
    cats = [category_of(p) for p in prompts]
    rows, reference = [], None
    for key in setups:
        name, base = TARGET_ONLY if key == "target" else DRAFTER_SETUPS[drafter][key]
        n_slots = base.shape.num_tree_slots if key != "target" else 1
        max_seq_len = -(-(longest + max_new_tokens + n_slots + 1) // 16) * 16
        config = base.replace(max_batch_size=min(batch_size, len(ids)), max_seq_len=max_seq_len, kv_block_size=16)
        if key != "target" and plugin_options:
            config = config.replace(plugin_options=plugin_options)
        draft = None if key == "target" else head
        dec = SpecDecoder.from_pretrained(target, draft, config)
        if warmup:  # Triton compilation and allocator warm-up stay out of the timing
            dec.generate([ids[0]], dataclasses.replace(sampling, max_new_tokens=min(8, max_new_tokens)))
        outputs, accepted, seconds = [], [], 0.0  # accepted: each request's draft tokens accepted per step
        for start in range(0, len(ids), config.cache.max_batch_size):
            chunk = ids[start : start + config.cache.max_batch_size]
            _sync(device)
            t0 = time.perf_counter()
            results = dec.generate(chunk, sampling)
            _sync(device)
            seconds += time.perf_counter() - t0
            outputs += [r.token_ids for r in results]
            accepted += [list(r.stats.accepted_per_step) for r in results]
            if progress:
                print(f"  [{name}] {min(start + len(chunk), len(ids))}/{len(ids)} prompts", flush=True)
        del dec

        def tau(sel) -> float:
            s = sum(len(accepted[i]) for i in sel)  # steps
            return sum(len(outputs[i]) - 1 for i in sel) / s if s else float("nan")

        everything = range(len(ids))
        row = {
            "setup": key,
            "name": name,
            "prompts": len(ids),
            "tau": tau(everything),
            "tau_code": tau([i for i in everything if not prompts[i].chat]),
            "tau_chat": tau([i for i in everything if prompts[i].chat]),
            "tau_by_category": {c: tau([i for i in everything if cats[i] == c]) for c in _category_order(cats)},
            "new_tokens": sum(len(o) for o in outputs),
            "seconds": seconds,
            "tokens_per_s": sum(len(o) for o in outputs) / seconds if seconds else float("nan"),
            "same_as_target": None,
            "depth_acceptance": None if key == "target" else _depth_rows(accepted, cats, base.shape.max_draft_len),
            "batch_size": config.cache.max_batch_size,
            "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
        }
        if key == "target":
            reference = outputs
        elif reference is not None:
            row["same_as_target"] = sum(a == b for a, b in zip(outputs, reference)) / len(ids)
        rows.append(row)
    base_speed = next((r["tokens_per_s"] for r in rows if r["setup"] == "target"), None)
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base_speed if base_speed else None
    return rows


def _category_order(cats) -> list[str]:
    """The categories present, `CATEGORIES` first in their order, then any others sorted."""
    present = set(cats)
    return [c for c in CATEGORIES if c in present] + sorted(present - set(CATEGORIES))


def format_table(rows: list[dict], *, title: str = "") -> str:
    """A Markdown table of `evaluate_head` rows: a tau column per category present (when more
    than one), and the batch size and dtype under the table when the rows carry them."""
    cats = _category_order(c for r in rows for c in r.get("tau_by_category", {}))
    cats = cats if len(cats) > 1 else []
    head = ("| setup | prompts | tau (all) | tau (code) | tau (chat) | " + "".join(f"tau ({c}) | " for c in cats)
            + "new tokens | tok/s | speedup | same as target |")
    lines = ([title, ""] if title else []) + [head, "|" + "---|" * (9 + len(cats))]

    def f(x, fmt):
        return "-" if x is None or x != x else format(x, fmt)

    for r in rows:
        per = "".join(f"{f(r.get('tau_by_category', {}).get(c), '.2f')} | " for c in cats)
        lines.append(
            f"| {r['name']} | {r['prompts']} | {f(r['tau'], '.2f')} | {f(r['tau_code'], '.2f')} | {f(r['tau_chat'], '.2f')} | "
            f"{per}{r['new_tokens']} | {f(r['tokens_per_s'], '.1f')} | {f(r['speedup'], '.2f')} | {f(r['same_as_target'], '.0%')} |"
        )
    runs = sorted({(r["batch_size"], r["dtype"]) for r in rows if "batch_size" in r and "dtype" in r})
    if runs:
        same_run = "; target-only speed measured in the same run" if any(r.get("setup") == "target" for r in rows) else ""
        lines += ["", "; ".join(f"batch size {b}, dtype {d}" for b, d in runs) + same_run]
    return "\n".join(lines)


def format_depth_table(rows: list[dict]) -> str:
    """A Markdown table of each drafted setup's conditional acceptance by depth, per category
    (rows without `depth_acceptance` are skipped; "" when none has it)."""
    drafted = [r for r in rows if r.get("depth_acceptance")]
    if not drafted:
        return ""
    depth = max(len(v["p"]) for r in drafted for v in r["depth_acceptance"].values())
    lines = ["| setup | category | steps | " + "".join(f"p{d} | " for d in range(1, depth + 1)),
             "|" + "---|" * (3 + depth)]
    for r in drafted:
        for cat, v in r["depth_acceptance"].items():
            ps = [format(p, ".2f") if p == p else "-" for p in v["p"]] + ["-"] * (depth - len(v["p"]))
            lines.append(f"| {r['name']} | {cat} | {v['steps']} | " + "".join(f"{p} | " for p in ps))
    lines += ["", "p_d = P(depth d accepted | depth d - 1 accepted) over every step of the category's prompts; "
                  "1 - p1 of its steps accepted nothing"]
    return "\n".join(lines)
