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
    python scripts/head_ranking.py --head HEAD --depths 5   # + each depth's top-1 / top-2 and the chain tau of each

With --depths D the deeper drafts are ranked too, teacher-forced: depth k after the true context,
which is what a chain that reached depth k drafts (the drafts before it were the target's tokens),
so a depth's top-1 rate estimates the chain's acceptance there, and its top-2 rate what a head that
ranked the target's token first whenever it had it second would accept: a generous estimate of what
a sharper teacher can do for that head (it reorders near-misses; it adds no knowledge).

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
from specdec.train.mtp_unroll import mtp_draft_states
from specdec.train.ttt import ttt_draft_steps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _frozen_answers import greedy_answers, load_smollm2_hf  # noqa: E402
from tau_what_if import tau_from_depths  # noqa: E402

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


def _over_target_vocab(draft: torch.Tensor, target_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[n, Vd] logits of the draft vocabulary `target_ids` (None: already [n, V]) -> [n, V], -inf outside it."""
    if target_ids is None:
        return draft.float()
    full = torch.full((draft.shape[0], vocab_size), float("-inf"))
    full[:, target_ids] = draft.float()
    return full


def eagle3_depth_logits(head, target, tokens: torch.Tensor, depths: int = 1) -> tuple[list[torch.Tensor], torch.Tensor]:
    """tokens [1, T] -> (per draft depth k = 1..depths the head's logits [T - k - 1, V] over the
    target's vocabulary (-inf outside the draft vocabulary), the target's probs [T, V]): row t of
    depth k is the draft after the context x_0..x_{t+k} (teacher-forced: what a chain that reached
    depth k drafts; TTT step k - 1, `train.ttt`), predicting x_{t+k+1}, whose target distribution
    is probs row t + k (row j of probs is the target's distribution of x_{j+1})."""
    captured, last = dense_forward(target.model, tokens, head.config.capture_layers)  # [1, T, 3d], [1, T, d]
    probs = torch.softmax(target.model.lm_head(last).float(), -1)[0]  # [T, V]
    T = tokens.shape[1]
    return [_over_target_vocab(logits[0, : T - k - 2], head.target_ids(), probs.shape[-1])
            for k, logits in ttt_draft_steps(head, target.model.embed, captured, tokens, depths)], probs


def mtp_depth_logits(head, target, tokens: torch.Tensor, target_ids: torch.Tensor | None,
                     depths: int = 1) -> tuple[list[torch.Tensor], torch.Tensor]:
    """As `eagle3_depth_logits` for an MTP head (`MTPModel`, recursive: depth k reads depth k - 1's
    feedback, as `mtp_unroll` trains it and the drafter runs it), over the draft vocabulary
    `target_ids` ([Vd] int64; None: the full one)."""
    _, last = dense_forward(target.model, tokens, (len(target.model.layers) - 1,))  # [1, T, d] after the final norm
    probs = torch.softmax(target.model.lm_head(last).float(), -1)[0]  # [T, V]
    T = tokens.shape[1]
    out = []
    for k, state in mtp_draft_states(head, target.model.embed, last, tokens, depths):
        rows = head.logits(state[0, : T - k - 2], target.model.lm_head)  # [T - k - 2, V]
        out.append(_over_target_vocab(rows if target_ids is None else rows[:, target_ids], target_ids, probs.shape[-1]))
    return out, probs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head", required=True, help="a head folder for SmolLM2 (EAGLE-3, or MTP with --drafter mtp)")
    p.add_argument("--drafter", choices=("eagle3", "mtp"), default="eagle3", help="the head's kind (default eagle3)")
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    p.add_argument("--categories", default="", help="comma-separated categories (default: all)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy answer tokens per prompt (default 128)")
    p.add_argument("--depths", type=int, default=1,
                   help="draft depths to rank, 1..8 (default 1); above 1 a per-depth table follows, with the chain tau "
                        "of the teacher-forced top-1 rates and what it would be if every top-2 hit were a top-1 one")
    args = p.parse_args()
    if args.new_tokens < 1 or args.per_category < 1:
        raise SystemExit(f"--new-tokens={args.new_tokens} and --per-category={args.per_category} must be >= 1")
    if not 1 <= args.depths <= 8:
        raise SystemExit(f"--depths={args.depths} is out of range; allowed: 1..8")
    apply_threads("auto")  # a busy 2-core box: the cores not already loaded
    tok, hf = load_smollm2_hf()
    target = load_target(smollm2_gguf_path(), dtype=torch.float32)
    if args.drafter == "mtp":
        head = load_mtp(args.head).eval()
        check_against_target(head.config, target.info, source=args.head)
        target_ids = load_draft_vocab(args.head, vocab_size=target.info.vocab_size)

        def depth_logits(seq):
            return mtp_depth_logits(head, target, seq, target_ids, args.depths)
    else:
        head = load_eagle3(args.head, target=target.info).eval()

        def depth_logits(seq):
            return eagle3_depth_logits(head, target, seq, args.depths)
    known = sorted(CATEGORIES)
    wanted = [c for c in args.categories.split(",") if c] or known
    if unknown := [c for c in wanted if c not in known]:
        raise SystemExit(f"--categories {unknown} unknown; allowed: {', '.join(known)}")
    stats: dict[tuple[str, int], RankStats] = {}
    for c, prompt_len, seq in greedy_answers(hf, tok, args.per_category, args.new_tokens, set(wanted)):
        with torch.no_grad():
            per_depth, probs = depth_logits(seq)
        for k, logits in enumerate(per_depth):  # row t of depth k + 1 predicts x_{t+k+2}: the answer's rows from prompt_len - k - 2
            first = max(prompt_len - k - 2, 0)
            n = logits.shape[0]
            stats.setdefault((c, k + 1), RankStats()).add(logits[first:], probs[first + k + 1 : n + k + 1])
    print(f"{args.drafter} head {args.head}: draft depth 1, teacher-forced on the target's greedy answers "
          f"({args.per_category} frozen prompts a category, {args.new_tokens} tokens, float32, CPU)\n")
    print("| category | positions | head top-1 = target argmax | in top 2 | in top 4 | in top 8 "
          "| misses where the target's top-1 p >= 0.5 | misses where the head took the target's 2nd |")
    print("|---|---|---|---|---|---|---|---|")
    per_depth = {c: [stats.get((c, k), RankStats()) for k in range(1, args.depths + 1)] for c in wanted}  # name -> depth 1..D
    totals = [RankStats() for _ in range(args.depths)]
    for c in wanted:
        for total, s in zip(totals, per_depth[c]):
            total.merge(s)
        print(per_depth[c][0].row(c))
    print(totals[0].row("all"))
    if args.depths > 1:
        print(depth_table({**per_depth, "all": totals}))


def depth_table(per_depth: dict[str, list["RankStats"]]) -> str:
    """Per row name (a category, or "all"), each depth's teacher-forced top-1 / top-2 rates (its
    `RankStats` list, depth 1 first), and the chain tau of D = the list's length from each:
    1 + r1 + r1 r2 + ... (what a chain accepts, if its acceptance at depth k given depth k reached
    were the teacher-forced rate there)."""
    depths = len(next(iter(per_depth.values())))
    rows = [f"\n| category | {' | '.join(f'depth {k}: top-1 / top-2' for k in range(1, depths + 1))} "
            f"| chain tau D={depths} from top-1 | ... from top-2 |",
            "|---|" + "---|" * (depths + 2)]
    for name, stats in per_depth.items():
        top1 = [s.in_top[1] / max(s.positions, 1) for s in stats]
        top2 = [s.in_top[2] / max(s.positions, 1) for s in stats]
        cells = " | ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(top1, top2))
        rows.append(f"| {name} | {cells} | {tau_from_depths(top1):.2f} | {tau_from_depths(top2):.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
