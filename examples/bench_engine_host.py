"""Host time of one engine iteration with the device step stubbed out: what the engine does in
Python between two steps (KV reservation, bucket choice, hand-off bookkeeping, emitting
tokens, the watchdog) at a given batch size.

Why: between a step's hand-off and the next launch the device idles, so this time adds to
every step of every setup, target-only included; at batch 64 on SmolLM2 a whole target-only
step is ~1.7 ms on the H200. A tiny random target (one layer) serves the requests; after they
are running, `_launch` is replaced by a no-op and the hand-off holds one token per request,
so only host work is timed. Runs anywhere (CPU).

    python examples/bench_engine_host.py                    # batch 1 16 64
    python examples/bench_engine_host.py --batch-sizes 64 --iterations 60 --repeats 10
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from _bench_common import log, markdown_table

from specdec import SamplingParams, SpecConfig, SpecDecoder, load_target


def tiny_target(folder: Path):
    """A one-layer random Llama saved by transformers and loaded as specdec loads any target."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return load_target(folder)


def host_us_per_iteration(target, batch: int, iterations: int, repeats: int) -> float:
    """Best of `repeats` means over `iterations` engine iterations with `batch` running requests."""
    if iterations * repeats > 400 - 8:
        raise ValueError(f"iterations x repeats = {iterations * repeats} must stay below 392 (max_new_tokens 400)")
    dec = SpecDecoder.from_pretrained(target, None, SpecConfig(drafter="none", max_batch_size=batch, max_seq_len=512,
                                                               kv_block_size=16))
    engine = dec.engine
    for i in range(batch):
        engine.submit([1 + i % 100, 2, 3, 4], SamplingParams(max_new_tokens=400, ignore_eos=True))
    while len(engine.running()) < batch or any(r.status != "running" for r in engine.running()):
        engine.run_iteration()
    engine._launch = lambda b, variant="speculative": None  # the device step, stubbed
    engine.state.handoff[:, 0] = 0  # accept length 0: one token per request per step
    engine.state.handoff[:, 1] = 7
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iterations):
            engine.run_iteration()
        best = min(best, (time.perf_counter() - t0) / iterations)
    return 1e6 * best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args()
    if min(args.batch_sizes) < 1 or args.iterations < 1 or args.repeats < 1:
        p.error(f"--batch-sizes {args.batch_sizes}, --iterations {args.iterations} and --repeats {args.repeats} "
                "must be >= 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        target = tiny_target(Path(folder))
        rows = [[b, f"{host_us_per_iteration(target, b, args.iterations, args.repeats):.0f}"] for b in args.batch_sizes]
    log(markdown_table(["batch", "engine host us per iteration (device step stubbed, best of repeats)"], rows))


if __name__ == "__main__":
    main()
