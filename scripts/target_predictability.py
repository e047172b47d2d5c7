"""How predictable the target's own greedy answers are, per category of the frozen held-out set.

Why: a draft head's greedy acceptance is bounded by how sure the target is: where its top two
tokens are close, a head that models the distribution well still misses the argmax often.
This reads SmolLM2's greedy answers to the per-category prompts (transformers, float32, CPU)
and, at each answer position, the target's top-1 probability and its margin over the top-2.
`--exit-layers` adds a logit lens: the share of positions where the final norm and lm_head on
layer l's output (0-indexed, before the last layer) already give the target's next token, i.e.
how early in the target a category's token is settled (an EAGLE-3 head reads layers 1, 14, 26).

    python scripts/target_predictability.py                   # 8 prompts per category, 128 tokens
    python scripts/target_predictability.py --per-category 16
    python scripts/target_predictability.py --exit-layers 14,20,24,26,27,28
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from specdec.cpu_threads import apply_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _frozen_answers import greedy_answers, load_smollm2_hf  # noqa: E402


def parse_exit_layers(text: str, num_layers: int) -> list[int]:
    """`--exit-layers` -> layer indices, each in [0, num_layers - 2]: the last layer's output
    comes out of transformers only after the final norm, i.e. it is the target itself."""
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--exit-layers={text!r} must be comma-separated integers") from None
    bad = [x for x in layers if not 0 <= x < num_layers - 1]
    if bad:
        raise SystemExit(f"--exit-layers {bad} out of range; allowed: 0..{num_layers - 2}")
    return layers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy answer tokens per prompt (default 128)")
    p.add_argument("--exit-layers", default="", help="comma-separated layers for the logit lens (default: none)")
    args = p.parse_args()
    if args.new_tokens < 1:
        raise SystemExit(f"--new-tokens={args.new_tokens} must be >= 1")
    apply_threads("auto")  # a busy 2-core box: the cores not already loaded
    tok, model = load_smollm2_hf()
    last = model.config.num_hidden_layers - 1
    exits = parse_exit_layers(args.exit_layers, model.config.num_hidden_layers)
    exit_hits: dict[str, list[int]] = {}
    top1: dict[str, list[float]] = {}
    margin: dict[str, list[float]] = {}
    for c, prompt_len, seq in greedy_answers(model, tok, args.per_category, args.new_tokens):
        with torch.no_grad():
            out = model(seq, output_hidden_states=bool(exits))
            answer = slice(prompt_len - 1, seq.shape[1] - 1)  # the positions that predict the answer's tokens
            probs = out.logits[0, answer].float().softmax(-1)  # [T, V]
            nxt = probs.argmax(-1)  # [T]
            # hidden_states[l + 1] is layer l's output (the last one only after the final norm)
            hits = [int((model.lm_head(model.model.norm(out.hidden_states[l + 1][0, answer])).argmax(-1) == nxt).sum())
                    for l in exits]
        top = probs.topk(2, -1).values  # [T, 2]
        exit_hits[c] = [a + b for a, b in zip(exit_hits.get(c, [0] * len(exits)), hits)]
        top1.setdefault(c, []).extend(top[:, 0].tolist())
        margin.setdefault(c, []).extend((top[:, 0] - top[:, 1]).tolist())
    lens = "".join(f" exit {l} |" for l in exits)
    print(f"| category | answer tokens | mean top-1 p | share top-1 p < 0.5 | share top-1 - top-2 < 0.2 |{lens}")
    print("|---|---|---|---|---|" + "---|" * len(exits))
    for c in top1:
        p1, m = top1[c], margin[c]
        lens = "".join(f" {h / len(p1):.2f} |" for h in exit_hits[c])
        print(f"| {c} | {len(p1)} | {statistics.mean(p1):.3f} | {sum(x < 0.5 for x in p1) / len(p1):.3f} | "
              f"{sum(x < 0.2 for x in m) / len(m):.3f} |{lens}")
    if exits:
        print(f"exit l: share of answer positions where lm_head(norm(output of layer l)) is the target's next token "
              f"(layer {last} is the last)")


if __name__ == "__main__":
    main()
