"""Draft-vocabulary coverage per category: the share of the target's greedy response tokens on the
frozen per-category prompts that each EAGLE-3 head's draft vocabulary holds. A token outside it
can never be drafted, so never accepted: with coverage c a chain's tau is at most 1 + c + ... + c^D.

    python scripts/draft_vocab_coverage.py HEAD [HEAD ...] [--per-category 8] [--device cpu]

(SmolLM2, float32, 128 new tokens, batch 16; ~3 minutes for 8 prompts per category on 2 CPU cores.)
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from specdec.drafters.eagle3_checkpoint import load_eagle3
from specdec.models import load_target
from specdec.train.categories import category_of, frozen_category_prompts
from specdec.train.cli import _target_path
from specdec.train.conversation import encode_any
from specdec.train.distill import generate_responses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", nargs="+", help="EAGLE-3 head folders")
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.per_category < 1:
        ap.error(f"--per-category {args.per_category} is out of range; allowed: an int >= 1")
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    target = load_target(_target_path("smollm2"), device=args.device, dtype=torch.float32)
    prompts = frozen_category_prompts(args.per_category)
    enc = [encode_any(p, target.tokenizer, target.info.vocab_size) for p in prompts]
    responses = generate_responses(target.model, enc, max_new_tokens=args.max_new_tokens, batch_size=16,
                                   eos_token_ids=tuple(target.info.eos_token_ids), progress=False)
    vocabs = {Path(h).name: set(load_eagle3(h, dtype=torch.float32).target_ids().tolist()) for h in args.heads}
    by_cat: dict[str, list[int]] = defaultdict(list)
    for p, r in zip(prompts, responses):
        by_cat[category_of(p)] += r
    by_cat["all"] = [t for toks in list(by_cat.values()) for t in toks]
    print("| category | response tokens | " + " | ".join(f"in {name} ({len(v)})" for name, v in vocabs.items()) + " |")
    print("|---|---|" + "---|" * len(vocabs))
    for cat, toks in by_cat.items():
        print(f"| {cat} | {len(toks)} | " + " | ".join(f"{sum(t in v for t in toks) / len(toks):.1%}" for v in vocabs.values()) + " |")


if __name__ == "__main__":
    main()
