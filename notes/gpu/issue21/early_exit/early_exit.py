"""Issue 21: how late in SmolLM2-135M does its greedy next token settle, per category?

For each frozen category prompt (the first N of each category), the target answers greedily
(float32, CPU, 128 new tokens, stopping at EOS); one forward over prompt + answer then gives every
layer's hidden state at the answer's positions. Early exit at layer l: the final norm and lm_head
applied to layer l's output; its argmax is compared with the target's own next token (the final
layer's argmax). The EAGLE-3 head reads layers (1, 14, 26) (output convention); if a category's
next token is decided only after layer 26 more often than another's, features up to 26 carry
less of it there. Also printed: the target's top-1 probability (how sure it is).

    source .venv/bin/activate; python notes/gpu/issue21/early_exit/early_exit.py --per-category 8
"""
from __future__ import annotations

import argparse
import collections
import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.models.gguf import convert_gguf, smollm2_gguf_path
from specdec.train.categories import CATEGORIES, category_of, frozen_category_prompts
from specdec.train.prompts import encode_prompt

LAYERS = (14, 20, 24, 26, 27, 28)  # 0-indexed layer outputs (SmolLM2 has 30: 29 is the last, whose output
# hidden_states holds only after the final norm, i.e. the target itself)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    folder = convert_gguf(smollm2_gguf_path())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    n_layers = model.config.num_hidden_layers
    hit = collections.defaultdict(lambda: collections.Counter())  # category -> layer -> matches
    count = collections.Counter()
    sure = collections.defaultdict(list)
    for prompt in frozen_category_prompts(args.per_category):
        cat = category_of(prompt)
        ids = torch.tensor([encode_prompt(prompt, tok)])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
            full = out[:, :-1]  # positions whose next token is in the answer
            hs = model(full, output_hidden_states=True).hidden_states  # [n_layers + 1] x [1, S, d]
            first = ids.shape[1] - 1  # the position that predicts the answer's first token
            final = model.lm_head(hs[-1][0, first:])  # hs[-1] is after the final norm
            target = final.argmax(-1)
            probs = final.softmax(-1).max(-1).values
            for layer in LAYERS:
                h = model.model.norm(hs[layer + 1][0, first:])  # hs[l + 1] = layer l's output
                hit[cat][layer] += int((model.lm_head(h).argmax(-1) == target).sum())
        count[cat] += target.numel()
        sure[cat] += probs.tolist()
        print(f"{cat}: {count[cat]} positions", flush=True)
    rows = []
    print(f"\n| category | positions | top-1 p < 0.5 | " + " | ".join(f"exit {l}" for l in LAYERS) + " |")
    print("|---|---|---|" + "---|" * len(LAYERS))
    for cat in CATEGORIES:
        if not count[cat]:
            continue
        low = sum(p < 0.5 for p in sure[cat]) / count[cat]
        rates = {l: hit[cat][l] / count[cat] for l in LAYERS}
        rows.append(dict(category=cat, positions=count[cat], low_confidence=low, exit_match=rates))
        print(f"| {cat} | {count[cat]} | {low:.2f} | " + " | ".join(f"{rates[l]:.2f}" for l in LAYERS) + " |")
    print(f"\nexit l = argmax of lm_head(norm(output of layer l)) equals the target's next token "
          f"(layer {n_layers - 1} is the last; float32, greedy answers of {args.new_tokens} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
