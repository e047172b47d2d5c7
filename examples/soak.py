"""Soak test: thousands of requests of random lengths and sampling parameters through one
decoder, some cancelled mid-flight and some failing through a planted faulty plugin; at the
end nothing may still be held and every completed greedy request must equal its solo run.

Per round, a random mix of requests is submitted to the engine while it runs (continuous
batching): greedy and sampled (temperature, top-k, top-p, min-p, seeds), random prompt and
output lengths, random per-request draft budgets; a random subset is aborted after a few
steps; a faulty drafter wrapper raises on a random subset of steps and prefills. Checked at
the end: no slot, KV block or drafter state is held (free slots = max_batch_size, free
blocks = pool, no waiting request), host memory (RSS) and device memory come back to where
they started (within a tolerance for allocator caches), and every greedy request that
completed equals the same prompt run alone on a fresh decoder.

    python examples/soak.py                    # CPU, tiny random model: 2,000 requests (~5 min)
    python examples/soak.py --requests 200     # a quick run
    python examples/soak.py --device cuda      # the same on a GPU (graphs and compile on)
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from specdec import SamplingParams, SpecConfig, SpecDecoder, load_target  # noqa: E402
from specdec.drafters.eagle3_checkpoint import save_eagle3  # noqa: E402


class Planted(RuntimeError):
    pass


def faulty(fn, rng: random.Random, rate: float, what: str):
    def wrapped(*args, **kwargs):
        if rng.random() < rate:
            raise Planted(f"planted failure in {what}")
        return fn(*args, **kwargs)

    return wrapped


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return rss_mb()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-rate", type=float, default=0.01, help="chance a drafter call raises")
    p.add_argument("--cancel-rate", type=float, default=0.05, help="share of requests aborted mid-flight")
    p.add_argument("--drafter", default="eagle3", choices=["eagle3", "ngram"],
                   help="eagle3: a random head (drafts rarely accepted); ngram: prompt lookup, whose drafts the tiny "
                        "model's repetitive output accepts (KV relocation under churn)")
    args = p.parse_args()
    import os

    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "0"  # the ops' torch references (interpreted Triton is for tests)
        torch.set_num_threads(1)
    from _eagle3_heads import random_head
    from _tiny_models import make_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="soak_"))
    make_checkpoint("llama", tmp / "target", num_hidden_layers=8, seed=3)
    save_eagle3(random_head(seed=1, hidden_size=64, target_hidden_size=64, head_dim=16, capture_layers=(1, 3, 4), std=0.1),
                tmp / "head")
    target = load_target(tmp / "target", device=args.device)
    head = tmp / "head" if args.drafter == "eagle3" else None
    config = SpecConfig(drafter=args.drafter, verifier="target-only", tree="dynamic", topk=2, max_draft_len=3,
                        max_batch_size=args.max_batch_size, max_seq_len=128, kv_block_size=4, num_kv_blocks=120)
    dec = SpecDecoder.from_pretrained(target, head, config)
    dec.warmup(progress=False)
    engine, rng = dec.engine, random.Random(args.seed)
    drafter = dec.strategies.drafter
    propose_name = "propose_host" if dec.strategies.drafter_caps.runs_on_host else "propose"
    real_propose, real_prefill = getattr(drafter, propose_name), drafter.prefill
    gc.collect()
    rss0 = current_rss_mb()
    dev0 = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0
    setattr(drafter, propose_name, faulty(real_propose, rng, args.fail_rate, propose_name))
    drafter.prefill = faulty(real_prefill, rng, args.fail_rate, "prefill")

    t0 = time.perf_counter()
    submitted, cancelled, requests = 0, 0, []
    while submitted < args.requests or engine.has_work():
        while submitted < args.requests and len(engine.waiting) < 2 * args.max_batch_size:
            prompt = [rng.randrange(96) for _ in range(rng.randint(1, 40))]
            greedy = rng.random() < 0.5
            kw = {} if greedy else dict(temperature=rng.choice([0.5, 1.0, 1.5]), top_k=rng.choice([0, 5, 50]),
                                        top_p=rng.choice([1.0, 0.9]), min_p=rng.choice([0.0, 0.05]), seed=rng.randrange(1 << 30))
            params = SamplingParams(max_new_tokens=rng.randint(1, 48), ignore_eos=True,
                                    num_draft_tokens=rng.choice([None, None, 0, 2]), **kw)
            requests.append((engine.submit(prompt, params), greedy))
            submitted += 1
        engine.run_iteration()
        live = [r for r, _ in requests[-4 * args.max_batch_size:] if not r.finished]
        if live and rng.random() < args.cancel_rate:
            engine.abort(rng.choice(live))
            cancelled += 1
    seconds = time.perf_counter() - t0
    setattr(drafter, propose_name, real_propose)
    drafter.prefill = real_prefill

    reasons: dict[str, int] = {}
    for r, _ in requests:
        reasons[r.finish_reason] = reasons.get(r.finish_reason, 0) + 1
    cache = engine.runner.cache
    held = dict(free_slots=len(engine.free_slots()), slots=config.cache.max_batch_size, free_blocks=cache.num_free_blocks,
                blocks=cache.num_blocks, waiting=len(engine.waiting),
                drafter_live=int(drafter.live.sum()) if hasattr(drafter, "live") else 0)
    gc.collect()
    rss1 = current_rss_mb()
    dev1 = torch.cuda.memory_allocated() if args.device.startswith("cuda") else 0

    # every completed greedy request against its solo run on a fresh decoder
    solo = SpecDecoder.from_pretrained(target, head, config.replace(max_batch_size=1, num_kv_blocks=None))
    done = [r for r, greedy in requests if greedy and r.finish_reason == "length"]
    mismatches = sum(
        solo.generate([r.prompt], SamplingParams(max_new_tokens=r.params.max_new_tokens, ignore_eos=True,
                                                 num_draft_tokens=r.params.num_draft_tokens))[0].token_ids != r.token_ids
        for r in done
    )
    preempted = sum(r.preemptions for r, _ in requests)
    accepted = sum(sum(r.accepted_per_step) for r, _ in requests)
    steps = sum(len(r.accepted_per_step) for r, _ in requests)
    print(f"draft tokens accepted {accepted} over {steps} request-steps")
    print(f"requests {submitted} in {seconds:.1f} s, finish reasons {dict(sorted(reasons.items()))}, "
          f"aborted by the soak {cancelled}, preemptions {preempted}")
    print(f"held at the end: {held}")
    print(f"host RSS {rss0:.0f} -> {rss1:.0f} MiB; device memory {dev0 / 2**20:.1f} -> {dev1 / 2**20:.1f} MiB")
    print(f"completed greedy requests equal to their solo run: {len(done) - mismatches}/{len(done)}")
    ok = (held["free_slots"] == held["slots"] and held["free_blocks"] == held["blocks"] and held["waiting"] == 0
          and held["drafter_live"] == 0 and mismatches == 0 and rss1 - rss0 < 200 and dev1 - dev0 < 64 * 2**20)
    print("SOAK OK" if ok else "SOAK FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
