"""Where a head's first draft (EAGLE-3 or MTP) misses the target's token: ranking or candidates.

Why: greedy verification accepts the first draft only when it is the target's argmax. If, where
the head misses, the target's token is still among the head's top few, the head has it and ranks
another above it (a loss aimed at the argmax, `--teacher-temperature` below 1, is the lever); if
it is far down, the head lacks it (more capacity or context is). This runs SmolLM2's greedy
answers to the per-category frozen prompts (transformers, float32, CPU) through the target and
the head's first draft depth, teacher-forced (TTT step 0 = draft depth 1, `train.ttt`), and
prints per category: how often the head's top-1 is the target's argmax, how often the argmax is
in its top 2 / 4 / 8, and how sure the target was where the head missed.

    python scripts/head_ranking.py --head src/specdec/assets/heads/smollm2-eagle3
    python scripts/head_ranking.py --head HEAD --per-category 16 --categories general-chat,code-short-header
    python scripts/head_ranking.py --drafter mtp --head src/specdec/assets/heads/smollm2-mtp

An MTP head's depth 1 is its step 0 (`MTPModel.sequence_forward`: the target's last hidden state
at t with the embedding of x_{t+1}, predicting x_{t+2}), over its draft vocabulary when its folder
has one (`draft_vocab.safetensors`, as the `mtp` plugin drafts).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.cpu_threads import apply_threads
from specdec.drafters.eagle3_checkpoint import load_eagle3
from specdec.drafters.mtp_checkpoint import check_against_target, load_draft_vocab, load_mtp
from specdec.models import load_target
from specdec.models.gguf import smollm2_gguf_path
from specdec.train.categories import CATEGORIES
from specdec.train.teacher import dense_forward
from specdec.train.ttt import ttt_unroll

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _frozen_answers import greedy_answers, load_smollm2_hf  # noqa: E402

TOP_KS = (1, 2, 4, 8)


@dataclass
class RankStats:
    """Counts over positions of one category."""

    positions: int = 0
    in_top: dict[int, int] = field(default_factory=lambda: {k: 0 for k in TOP_KS})
    misses: int = 0
    misses_target_sure: int = 0  # the target's top-1 p >= 0.5 where the head missed
    misses_head_took_target_second: int = 0  # the head's pick was the target's second token

    def add(self, head_logits: torch.Tensor, target_probs: torch.Tensor) -> None:
        """head_logits [n, V] over the target's vocabulary (-inf outside the draft vocabulary),
        target_probs [n, V]: the head's depth-1 logits and the target's distribution of the same token."""
        want = target_probs.argmax(-1)  # [n]
        order = head_logits.argsort(-1, descending=True)  # [n, V]
        rank = (order == want[:, None]).float().argmax(-1)  # [n] 0 = the head's top-1
        reachable = torch.isfinite(head_logits.gather(-1, want[:, None]))[:, 0]  # the argmax is a draft token
        self.positions += int(want.numel())
        for k in TOP_KS:
            self.in_top[k] += int(((rank < k) & reachable).sum())
        miss = ~((rank == 0) & reachable)
        top2 = target_probs.topk(2, -1)
        self.misses += int(miss.sum())
        self.misses_target_sure += int((miss & (top2.values[:, 0] >= 0.5)).sum())
        self.misses_head_took_target_second += int((miss & (order[:, 0] == top2.indices[:, 1])).sum())

    def merge(self, other: "RankStats") -> None:
        """Add another category's counts (the "all" row)."""
        self.positions += other.positions
        self.misses += other.misses
        self.misses_target_sure += other.misses_target_sure
        self.misses_head_took_target_second += other.misses_head_took_target_second
        for k in TOP_KS:
            self.in_top[k] += other.in_top[k]

    def row(self, name: str) -> str:
        n, m = max(self.positions, 1), max(self.misses, 1)
        tops = " | ".join(f"{self.in_top[k] / n:.2f}" for k in TOP_KS)
        return (f"| {name} | {self.positions} | {tops} | {self.misses_target_sure / m:.2f} | "
                f"{self.misses_head_took_target_second / m:.2f} |")


def head_depth1_logits(head, target, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [1, T] -> (head logits [T - 2, V] over the target's vocabulary, target probs
    [T - 2, V]): row t is draft depth 1 after the context x_0..x_{t+1}, predicting x_{t+2}."""
    layers = head.config.capture_layers
    captured, last = dense_forward(target.model, tokens, layers)  # [1, T, 3d], [1, T, d]
    probs = torch.softmax(target.model.lm_head(last).float(), -1)[0, 1:-1]  # [T - 2, V] of x_{t+2}
    seen = []
    hook = head.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    T = tokens.shape[1]
    try:
        vd = head.target_ids().shape[0]
        ttt_unroll(head, target.model.embed, captured, tokens, torch.zeros(1, T, vd), torch.zeros(1, T, dtype=torch.int64),
                   torch.ones(1, T), torch.ones(1, T, dtype=torch.bool), steps=1)
    finally:
        hook.remove()
    draft = seen[0][0, : T - 2].float()  # [T - 2, Vd]
    full = torch.full((T - 2, probs.shape[-1]), float("-inf"))
    full[:, head.target_ids()] = draft
    return full, probs


def mtp_depth1_logits(head, target, tokens: torch.Tensor, target_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """As `head_depth1_logits` for an MTP head (`MTPModel`): tokens [1, T] -> (head logits [T - 2, V],
    -inf outside the draft vocabulary `target_ids` ([Vd] int64, None: the full one), target probs [T - 2, V])."""
    _, last = dense_forward(target.model, tokens, (len(target.model.layers) - 1,))  # [1, T, d] after the final norm
    probs = torch.softmax(target.model.lm_head(last).float(), -1)[0, 1:-1]  # [T - 2, V] of x_{t+2}
    T = tokens.shape[1]
    _, logits = head.sequence_forward(last[:, :-1], target.model.embed(tokens[:, 1:]), head=target.model.lm_head)  # [1, T - 1, V]
    full = logits[0, : T - 2].float()
    if target_ids is not None:
        outside = torch.ones(full.shape[-1], dtype=torch.bool)
        outside[target_ids] = False
        full = full.masked_fill(outside, float("-inf"))
    return full, probs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head", required=True, help="a head folder for SmolLM2 (EAGLE-3, or MTP with --drafter mtp)")
    p.add_argument("--drafter", choices=("eagle3", "mtp"), default="eagle3", help="the head's kind (default eagle3)")
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    p.add_argument("--categories", default="", help="comma-separated categories (default: all)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy answer tokens per prompt (default 128)")
    args = p.parse_args()
    if args.new_tokens < 1 or args.per_category < 1:
        raise SystemExit(f"--new-tokens={args.new_tokens} and --per-category={args.per_category} must be >= 1")
    apply_threads("auto")  # a busy 2-core box: the cores not already loaded
    tok, hf = load_smollm2_hf()
    target = load_target(smollm2_gguf_path(), dtype=torch.float32)
    if args.drafter == "mtp":
        head = load_mtp(args.head).eval()
        check_against_target(head.config, target.info, source=args.head)
        target_ids = load_draft_vocab(args.head, vocab_size=target.info.vocab_size)

        def depth1(seq):
            return mtp_depth1_logits(head, target, seq, target_ids)
    else:
        head = load_eagle3(args.head, target=target.info).eval()

        def depth1(seq):
            return head_depth1_logits(head, target, seq)
    known = sorted(CATEGORIES)
    wanted = [c for c in args.categories.split(",") if c] or known
    if unknown := [c for c in wanted if c not in known]:
        raise SystemExit(f"--categories {unknown} unknown; allowed: {', '.join(known)}")
    stats: dict[str, RankStats] = {}
    for c, prompt_len, seq in greedy_answers(hf, tok, args.per_category, args.new_tokens, set(wanted)):
        with torch.no_grad():
            logits, probs = depth1(seq)
        answer = slice(prompt_len - 2, None)  # rows predicting the answer's tokens (row t predicts x_{t+2})
        stats.setdefault(c, RankStats()).add(logits[answer], probs[answer])
    print(f"{args.drafter} head {args.head}: draft depth 1, teacher-forced on the target's greedy answers "
          f"({args.per_category} frozen prompts a category, {args.new_tokens} tokens, float32, CPU)\n")
    print("| category | positions | head top-1 = target argmax | in top 2 | in top 4 | in top 8 "
          "| misses where the target's top-1 p >= 0.5 | misses where the head took the target's 2nd |")
    print("|---|---|---|---|---|---|---|---|")
    total = RankStats()
    for c in wanted:
        s = stats.get(c, RankStats())
        print(s.row(c))
        total.merge(s)
    print(total.row("all"))


if __name__ == "__main__":
    main()
