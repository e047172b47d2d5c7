"""The `specdec` command: `specdec plugins`, `specdec generate ...`, `specdec train ...`.

A thin front over the library; every subcommand has a Python equivalent.
"""

from __future__ import annotations

import argparse
import sys


def _plugins(args) -> int:
    from .registry import get_plugin_manager, strategy_names

    pm = get_plugin_manager()
    for name, _ in pm.list_name_plugin():
        print(name)
    for kind, names in sorted(strategy_names(pm).items()):
        print(f"{kind}: {', '.join(sorted(names))}")
    return 0


def _generate(args) -> int:
    import torch

    from .config import SamplingParams, SpecConfig
    from .decoder import SpecDecoder

    config = SpecConfig(
        drafter=args.drafter,
        tree=args.tree,
        topk=args.topk,
        max_draft_len=args.max_draft_len,
        verifier=args.verifier,
        max_batch_size=max(1, len(args.prompt)),
        max_seq_len=args.max_seq_len,
    )
    dtype = getattr(torch, args.dtype)
    dec = SpecDecoder.from_pretrained(args.target, args.draft, config, device=args.device, dtype=dtype)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens)
    for out in dec.generate(args.prompt, params):
        print(out.text if out.text is not None else out.token_ids)
        s = out.stats
        print(f"[steps={s.steps} mean_accept_length={s.mean_accept_length:.2f} lossless={s.lossless}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "train":  # the trainer owns its own flags
        from .train import main as train_main

        return train_main(argv[1:]) or 0
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("plugins", help="list plugins and the strategy names they provide")
    sub.add_parser("train", help="train a draft head (see `specdec train --help`)")
    gen = sub.add_parser("generate", help="generate with a target (and a draft head)")
    gen.add_argument("--target", required=True, help="HF folder or .gguf file")
    gen.add_argument("--draft", default=None, help="draft head checkpoint folder")
    gen.add_argument("--drafter", default="none")
    gen.add_argument("--tree", default="linear", choices=["linear", "dynamic"])
    gen.add_argument("--topk", type=int, default=None)
    gen.add_argument("--max-draft-len", type=int, default=5)
    gen.add_argument("--verifier", default="greedy")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--max-seq-len", type=int, default=2048)
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32")
    gen.add_argument("prompt", nargs="+")
    args = parser.parse_args(argv)
    return {"plugins": _plugins, "generate": _generate}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
