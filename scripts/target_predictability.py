"""How predictable the target's own greedy answers are, per category of the frozen held-out set.

Why: a draft head's greedy acceptance is bounded by how sure the target is: where its top two
tokens are close, a head that models the distribution well still misses the argmax often.
This reads SmolLM2's greedy answers to the per-category prompts (transformers, float32, CPU)
and, at each answer position, the target's top-1 probability and its margin over the top-2.

    python scripts/target_predictability.py                   # 8 prompts per category, 128 tokens
    python scripts/target_predictability.py --per-category 16
"""

from __future__ import annotations

import argparse
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.cpu_threads import apply_threads
from specdec.models.gguf import convert_gguf, smollm2_gguf_path
from specdec.train.categories import category_of, frozen_category_prompts
from specdec.train.evaluate import encode_any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    p.add_argument("--new-tokens", type=int, default=128, help="greedy answer tokens per prompt (default 128)")
    args = p.parse_args()
    if args.new_tokens < 1:
        raise SystemExit(f"--new-tokens={args.new_tokens} must be >= 1")
    apply_threads("auto")  # a busy 2-core box: the cores not already loaded
    folder = convert_gguf(smollm2_gguf_path())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    context = model.config.max_position_embeddings
    top1: dict[str, list[float]] = {}
    margin: dict[str, list[float]] = {}
    for prompt in frozen_category_prompts(args.per_category):
        ids = encode_any(prompt, tok, model.config.vocab_size)
        if len(ids) + args.new_tokens > context:
            continue  # as the evaluation does: the prompt and its answer must fit the target's context
        with torch.no_grad():
            seq = model.generate(torch.tensor([ids]), max_new_tokens=args.new_tokens, do_sample=False)
            probs = model(seq).logits[0, len(ids) - 1 : seq.shape[1] - 1].float().softmax(-1)  # [T, V]
        top = probs.topk(2, -1).values  # [T, 2]
        c = category_of(prompt)
        top1.setdefault(c, []).extend(top[:, 0].tolist())
        margin.setdefault(c, []).extend((top[:, 0] - top[:, 1]).tolist())
    print("| category | answer tokens | mean top-1 p | share top-1 p < 0.5 | share top-1 - top-2 < 0.2 |")
    print("|---|---|---|---|---|")
    for c in top1:
        p1, m = top1[c], margin[c]
        print(f"| {c} | {len(p1)} | {statistics.mean(p1):.3f} | {sum(x < 0.5 for x in p1) / len(p1):.3f} | "
              f"{sum(x < 0.2 for x in m) / len(m):.3f} |")


if __name__ == "__main__":
    main()
