"""specdec's main job, on the CPU: SmolLM2-135M-Instruct with an EAGLE-3 head.

Generates the same answers twice in one run, target-only (drafter="none", the baseline) and
speculatively (drafter="eagle3"), checks they are identical token for token (greedy), and
prints the text, the mean acceptance length and the measured speedup.

The head is specdec's trained head for SmolLM2 when it ships in
`specdec/assets/heads/smollm2-eagle3`; otherwise a RANDOM head is built, which shows the
mechanics (and the losslessness) but accepts almost nothing, so expect no speedup.

    bash scripts/demo.sh                      # linear drafting, 5 draft tokens
    bash scripts/demo.sh --tree dynamic       # EAGLE-2 dynamic tree (depth 6, top-8, 48 nodes)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import torch

from specdec import SamplingParams, SpecConfig
from specdec.cpu_threads import apply_threads
from specdec.entrypoints.decoder import SpecDecoder
from specdec.models import load_target, smollm2_gguf_path

QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a Python list comprehension is, with an example.",
]


def shipped_head() -> Path | None:
    path = Path(str(resources.files("specdec") / "assets" / "heads" / "smollm2-eagle3"))
    return path if (path / "config.json").is_file() else None


def random_head(target, folder: Path) -> Path:
    from specdec.drafters.eagle3_checkpoint import save_eagle3
    from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, init_random_

    cfg = target.config
    head_cfg = Eagle3Config(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        vocab_size=cfg.vocab_size,
        draft_vocab_size=4096,
        target_hidden_size=cfg.hidden_size,
        rope=cfg.rope,
        capture_layers=(1, cfg.num_layers // 2 - 1, cfg.num_layers - 4),
    )
    save_eagle3(init_random_(Eagle3Model(head_cfg), torch.Generator().manual_seed(0)), folder)
    return folder


def say(text: str) -> None:
    """A progress line on stderr, at once (the demo runs for minutes on a CPU)."""
    print(text, file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", choices=["linear", "dynamic"], default="linear")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    torch.manual_seed(0)
    say(f"CPU threads: {apply_threads('auto')} (the cores other work leaves idle; SpecConfig(threads=N) to choose)")

    t0 = time.perf_counter()
    say("loading SmolLM2-135M-Instruct (the first run converts the shipped GGUF once, ~30 s) ...")
    target = load_target(smollm2_gguf_path())  # converted once from the GGUF, then cached
    print(f"target: SmolLM2-135M-Instruct ({target.info.num_layers} layers) loaded in {time.perf_counter() - t0:.1f} s")
    head = shipped_head()
    if head is None:
        head = random_head(target, Path(tempfile.mkdtemp()) / "random-eagle3")
        print("head:   RANDOM EAGLE-3 head (no trained head ships yet): this shows the mechanics and that the")
        print("        output is exactly the target's; a random head accepts ~nothing, so expect no speedup.")
    else:
        print(f"head:   {head}")

    dynamic = args.tree == "dynamic"
    spec = SpecConfig(
        drafter="eagle3",
        tree=args.tree,
        max_draft_len=6 if dynamic else 5,
        topk=8 if dynamic else None,
        max_total_draft_tokens=48 if dynamic else None,
        max_batch_size=1,
        max_seq_len=1024,
    )
    base = SpecConfig(drafter="none", max_batch_size=1, max_seq_len=1024)
    decoders = {"target-only": SpecDecoder(target, base), f"eagle3 ({args.tree})": SpecDecoder.from_pretrained(target, head, spec)}
    params = SamplingParams(max_new_tokens=args.max_new_tokens)

    totals = {name: [0, 0.0] for name in decoders}  # tokens, seconds
    for question in QUESTIONS:
        prompt = target.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        print(f"\n> {question}")
        outs = {}
        for name, dec in decoders.items():
            say(f"[{name}] generating ...")
            start = time.perf_counter()
            tokens = []
            for delta in dec.stream([prompt], params):  # the answer as it is generated
                tokens += delta.token_ids
                if name != "target-only":
                    print(delta.text or "", end="", flush=True)
                if delta.finish_reason is not None:
                    outs[name] = (tokens, delta.stats)
            seconds = time.perf_counter() - start
            totals[name][0] += len(tokens)
            totals[name][1] += seconds
            say(f"{'' if name == 'target-only' else chr(10)}[{name}] {len(tokens)} tokens in {seconds:.1f} s "
                f"({len(tokens) / seconds:.1f} tok/s)")
        (base_tokens, _), (spec_tokens, spec_stats) = outs.values()
        same = base_tokens == spec_tokens
        print(
            f"[{len(spec_tokens)} tokens; identical to target-only: {same}; "
            f"mean acceptance length {spec_stats.mean_accept_length:.2f} tokens per target forward]"
        )
        if not same:
            raise SystemExit("speculative output differs from target-only output: this is a bug")

    print("\nmode                     tokens/s   speedup")
    base_rate = totals["target-only"][0] / totals["target-only"][1]
    for name, (tokens, seconds) in totals.items():
        rate = tokens / seconds
        print(f"{name:22s} {rate:9.1f}   {rate / base_rate:6.2f}x")


if __name__ == "__main__":
    main()
