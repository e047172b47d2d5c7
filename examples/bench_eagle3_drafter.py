"""Time the EAGLE-3 drafter alone (prefill + propose) at real head sizes, and print a table.

A random head of Llama-3.1-8B's EAGLE-3 shape (d=4096, 32 heads / 8 KV heads, ffn 14336,
V=128256, Vd=32000) drafts from random captured states, so the numbers are drafting cost
only (no target). Per configuration: ms per `propose` (ingest of a 3-token accepted path +
the draft loop), and ms for a 1024-token `prefill`.

    python examples/bench_eagle3_drafter.py                 # cuda if present, bf16
    python examples/bench_eagle3_drafter.py --small --device cpu --dtype float32   # a quick smoke run
"""

from __future__ import annotations

import argparse
import time

import torch

from specdec.config import SpecConfig
from specdec.drafters.eagle3_drafter import Eagle3Drafter
from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model, init_random_
from specdec.step_state import StepState


def head(small: bool) -> Eagle3Model:
    if small:
        cfg = Eagle3Config(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                           head_dim=32, vocab_size=4096, draft_vocab_size=1024, target_hidden_size=256)
    else:
        cfg = Eagle3Config(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                           head_dim=128, vocab_size=128256, draft_vocab_size=32000, target_hidden_size=4096)
    with torch.device("meta"):
        model = Eagle3Model(cfg)
    model = model.to_empty(device="cpu")
    return init_random_(model, torch.Generator().manual_seed(0), std=0.02)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(model, embed, config: SpecConfig, device, *, samples: bool, prompt: int, iters: int):
    d = Eagle3Drafter(model, config, embed=embed, samples_drafts=samples)
    B, N = config.cache.max_batch_size, config.shape.num_tree_slots
    width = model.config.fc_in_features
    gen = torch.Generator(device=device).manual_seed(0)
    V = model.config.vocab_size

    def rand_tokens(*shape):
        return torch.randint(0, V, shape, device=device, generator=gen)

    sync(device)
    t0 = time.perf_counter()
    for slot in range(B):
        d.prefill(slot, rand_tokens(prompt), torch.randn(prompt, width, device=device, dtype=d.dtype, generator=gen))
    sync(device)
    prefill_ms = (time.perf_counter() - t0) * 1e3 / B
    committed = torch.full((B,), prompt, device=device)
    a = torch.full((B,), 2, device=device)
    inputs = StepState.for_drafting(
        root_tokens=rand_tokens(B), committed_len=committed, accept_length=torch.full((B,), -1, device=device),
        accept_tokens=rand_tokens(B, N), active=torch.ones(B, dtype=torch.bool, device=device), drafter=d,
    )
    d.propose(inputs)  # warm-up
    inputs.hidden_path = torch.randn(B, N, width, device=device, dtype=d.dtype, generator=gen)
    inputs.accept_length = a
    times = []
    for i in range(iters):
        inputs.committed_len = committed + 3 * (i + 1)
        sync(device)
        t0 = time.perf_counter()
        d.propose(inputs)
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return prefill_ms, times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--small", action="store_true", help="a tiny head (CPU smoke run)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = head(args.small).to(device=device, dtype=dtype)
    embed = torch.nn.Embedding(model.config.vocab_size, model.config.hidden_size).to(device=device, dtype=dtype)
    prompt = 128 if args.small else 1024
    rows = []
    for tree, topk, depth, total in [("linear", None, 5, None), ("dynamic", 4, 5, 16), ("dynamic", 8, 6, 48)]:
        for B in (1, 4, 8):
            for samples in (False, True):
                cfg = SpecConfig(drafter="eagle3", tree=tree, topk=topk, max_draft_len=depth, max_total_draft_tokens=total,
                                 max_batch_size=B, max_seq_len=args.max_seq_len, kv_block_size=16)
                with torch.no_grad():
                    pre, prop = bench(model, embed, cfg, device, samples=samples, prompt=prompt, iters=args.iters)
                rows.append((tree, topk or 1, depth, cfg.shape.num_tree_slots, B, "sampled" if samples else "argmax", pre, prop))
    print(f"device={device} dtype={dtype} head={'small' if args.small else 'llama3-8B-eagle3'} "
          f"max_seq_len={args.max_seq_len} prefill={prompt} tokens")
    print(f"{'tree':8} {'K':>2} {'D':>2} {'N':>3} {'B':>2} {'drafts':8} {'prefill ms':>10} {'propose ms':>10}")
    for tree, k, dd, n, b, s, pre, prop in rows:
        print(f"{tree:8} {k:>2} {dd:>2} {n:>3} {b:>2} {s:8} {pre:>10.2f} {prop:>10.2f}")


if __name__ == "__main__":
    main()
