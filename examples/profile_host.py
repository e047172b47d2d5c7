"""Where a generate call's wall time goes on the host: cProfile over steady-state generate
calls of one setup, beside the same calls' wall time and the engine's step count.

A speculative step on SmolLM2 spends ~2 ms outside its kernels (bench_e2e: tree R 2.9 where
the kernel time says ~1.5); this names the Python functions that take it. Same setups and
prompts as `bench_e2e.py` (the shipped held-out prompts, the shipped heads, bf16).

    python examples/profile_host.py --setups target-only eagle3-tree --num-prompts 5
    python examples/profile_host.py --quick    # CPU, tiny random models
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import torch
from _bench_common import SpecDecoder, log, sync, warm_up
from bench_e2e import SPEC_SETUPS, heldout_ids, random_ids, smollm2_assets, tiny_assets

from specdec import SamplingParams
from specdec.models import load_target


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", nargs="+", choices=list(SPEC_SETUPS), default=["target-only", "eagle3-tree"])
    p.add_argument("--num-prompts", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=30, help="functions listed per setup")
    p.add_argument("--quick", action="store_true", help="CPU, tiny random Llama + random heads")
    args = p.parse_args()
    quick = args.quick
    device = torch.device("cpu" if quick or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if quick else torch.bfloat16
    if quick:
        torch.set_num_threads(1)
        tmp = tempfile.TemporaryDirectory(prefix="profile_host_")
        target_path, heads = tiny_assets(Path(tmp.name))
    else:
        target_path, heads = smollm2_assets()
    target = load_target(target_path, device=device, dtype=dtype)
    n = args.num_prompts
    prompts = random_ids(target.info.vocab_size, n) if quick else heldout_ids(target, n)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
    for key in args.setups:
        setup = SPEC_SETUPS[key]
        config = setup.config.replace(max_batch_size=1, max_seq_len=2048)
        dec = SpecDecoder.from_pretrained(target, heads[setup.head] if setup.head else None, config,
                                          device=device, dtype=dtype)
        warm_up(dec, prompts, [1], device)
        steps, tokens = 0, 0
        sync(device)
        t0 = time.perf_counter()
        for ids in prompts:
            r = dec.generate([ids], sampling)[0]
            steps += r.stats.steps
            tokens += len(r.token_ids)
        sync(device)
        wall = time.perf_counter() - t0
        prof = cProfile.Profile()
        sync(device)
        t1 = time.perf_counter()
        prof.enable()
        for ids in prompts:
            dec.generate([ids], sampling)
        sync(device)
        prof.disable()
        prof_wall = time.perf_counter() - t1
        log(f"== {setup.name}: {tokens} tokens in {wall * 1e3:.1f} ms = {tokens / wall:.1f} tok/s, {steps} steps, "
            f"{wall / steps * 1e3:.3f} ms/step (profiled: {prof_wall * 1e3:.1f} ms)")
        for order in ("tottime", "cumulative"):
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out)
            stats.sort_stats(order).print_stats(args.top)
            log(f"-- {setup.name}: by {order} (ms per step = s * 1000 / {steps})")
            log("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-6000:])
        del dec


if __name__ == "__main__":
    main()
