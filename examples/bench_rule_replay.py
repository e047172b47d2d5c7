"""The adaptive rule's decisions replayed on recorded acceptance with H200 step times: tok/s of
adaptive against always speculating, never speculating and target-only, per batch size.

Why: on the GPU a decision's worth is buried in a whole run (prefill, admission, noise) and
device time is scarce; the rule itself is host code. This replays it (`specdec.engine.
adaptive_replay`) over a continuous-batching run whose step times are the ones measured on the
H200 (per variant and batch bucket, `PRESETS`, from `notes/gpu/issue22/bench_*_32cbac7.log`)
and whose accepted lengths come from traces: each request's accepted length per step of an
always-speculating EAGLE-3 chain D=5 on SmolLM2 (`--record`, fp32 on the CPU, greedy, 128
tokens, shipped in `examples/data/`: the 20 held-out prompts and 8 per category), or zeros
for a head that is never right (8b-none). The rule first serves a short warm-up pass of the
same requests (8 tokens each, like `bench_batch.py`'s warm-up), then the timed pass. Each
step runs in the smallest measured bucket (1, 4, 16, 64) that holds the running requests, so a
run's tail, when fewer requests are left than the batch, costs a smaller batch's step (the
engine's captured graphs come in more sizes: 1, 2, 4, ...; the replay has times for four).
`--one-bucket` prices every step at the batch's bucket instead (the replay before 2026-12-05).
What this leaves out: prefill and admission, and the acceptance of a step right after a plain
one (a trace entry is consumed per speculative step).

    python examples/bench_rule_replay.py                          # every preset, the shipped traces
    python examples/bench_rule_replay.py --record examples/data/acceptance_smollm2_e3_heldout.jsonl --prompts heldout:20
    python examples/bench_rule_replay.py --record examples/data/acceptance_smollm2_e3_categories.jsonl --prompts categories:8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from pathlib import Path

from _bench_common import log, markdown_table

from specdec.engine import adaptive
from specdec.engine.adaptive_replay import StepTimes, replay, replay_warm

DATA = Path(__file__).parent / "data"
TRACES = {"smollm2": [DATA / "acceptance_smollm2_e3_heldout.jsonl", DATA / "acceptance_smollm2_e3_categories.jsonl"]}
# H200, bf16, at 32cbac7 (notes/gpu/issue22/bench_smollm2_32cbac7.log, bench_8b_none_*32cbac7.log): ms per
# step of the adaptive engine's speculative, ingesting plain and deferred steps, and of target-only's step.
# Entries marked * were not run in that bucket (the adaptive run chose them too rarely): the nearest measure.
MS = {
    ("smollm2", 1): (1.917, 1.330, 1.087, 0.994),
    ("smollm2", 4): (2.174, 1.330, 1.073, 1.033),  # plain*: batch 1's
    ("smollm2", 16): (2.780, 1.309, 1.309, 1.322),  # deferred*: its plain
    ("smollm2", 64): (3.935, 1.957, 1.957, 1.664),  # deferred*: its plain (5 partial-batch steps ran)
    ("8b-none", 1): (6.892, 5.080, 4.820, 4.754),
    ("8b-none", 4): (8.002, 5.199, 4.907, 4.851),
    ("8b-none", 16): (9.247, 5.714, 5.389, 5.330),
    ("8b-none", 64): (15.253, 6.838, 6.241, 6.341),
}
PRESETS = {key: StepTimes(*(ms / 1e3 for ms in v)) for key, v in MS.items()}


def bucket_times(target: str, batch: int, one_bucket: bool) -> StepTimes | dict[int, StepTimes]:
    """The step times a replay at `batch` runs on: every measured bucket up to the batch's (a
    run's tail steps in smaller ones), or the batch's alone."""
    if one_bucket:
        return PRESETS[(target, batch)]
    return {b: t for (name, b), t in PRESETS.items() if name == target and b <= batch}


def load_traces(paths: list[Path]) -> list[list[int]]:
    traces = []
    for path in paths:
        with open(path) as f:
            traces += [json.loads(line)["accepted"] for line in f if line.strip()]
    return traces


def record(out: Path, prompts: str, new_tokens: int) -> None:
    """Accepted lengths per step of always-speculating EAGLE-3 chain D=5 on SmolLM2, fp32, CPU."""
    import importlib.resources

    import torch

    from specdec import SamplingParams, SpecConfig
    from specdec.entrypoints.decoder import SpecDecoder
    from specdec.models.gguf import smollm2_gguf_path
    from specdec.train.categories import frozen_category_prompts
    from specdec.train.prompts import encode_prompt, frozen_heldout_prompts

    kind, _, n = prompts.partition(":")
    if kind not in ("heldout", "categories") or not n.isdigit():
        raise SystemExit(f"--prompts {prompts!r}: expected heldout:N or categories:N (N per category)")
    chosen = frozen_heldout_prompts(int(n)) if kind == "heldout" else frozen_category_prompts(int(n))
    head = Path(str(importlib.resources.files("specdec") / "assets/heads/smollm2-eagle3"))
    config = SpecConfig(drafter="eagle3", max_draft_len=5, max_batch_size=4, max_seq_len=1024)
    dec = SpecDecoder.from_pretrained(smollm2_gguf_path(), head, config, device="cpu", dtype=torch.float32)
    ids = [encode_prompt(p, dec.target.tokenizer, dec.target.info.vocab_size) for p in chosen]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(out, "w") as f:
        for i in range(0, len(ids), 4):
            results = dec.generate(ids[i : i + 4], SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
            for p, r in zip(chosen[i : i + 4], results):
                f.write(json.dumps({"chat": p.chat, "accepted": r.stats.accepted_per_step}) + "\n")
            log(f"{min(i + 4, len(ids))} / {len(ids)} prompts, {time.perf_counter() - t0:.0f} s")


@contextlib.contextmanager
def rule_before():
    """The rule as it was at 32cbac7 (the last H200 sweep): no exploration budget (probes at the
    doubling schedule alone), one pseudo-observation of the pool per request, no ageing."""
    saved = {k: getattr(adaptive, k) for k in ("EXPLORE_SHARE", "PRIOR_WEIGHT", "FADED")}
    adaptive.EXPLORE_SHARE, adaptive.PRIOR_WEIGHT, adaptive.FADED = math.inf, 1.0, math.inf
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(adaptive, k, v)


def compare(traces: list[list[int]], times: StepTimes, batch: int, new_tokens: int, requests: int) -> dict:
    """tok/s of each policy on the same requests; adaptive after a short warm-up pass (8 tokens
    per request, as `bench_batch.py`'s decoders serve before they are timed)."""
    kw = dict(batch=batch, new_tokens=new_tokens, requests=requests)
    runs = {p: replay(traces, times, policy=p, **kw) for p in ("always", "never", "no-drafter")}
    runs["adaptive"] = replay_warm(traces, times, **kw)
    with rule_before():
        runs["before"] = replay_warm(traces, times, **kw)
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", type=Path, metavar="OUT", help="record a trace file instead (needs the SmolLM2 GGUF)")
    p.add_argument("--prompts", default="heldout:20", help="for --record: heldout:N or categories:N (per category)")
    p.add_argument("--new-tokens", type=int, default=None, help="per request (default: 128 smollm2, 64 8b-none)")
    p.add_argument("--one-bucket", action="store_true",
                   help="price every step at the batch's bucket (a run's tail included), as the replay did before")
    args = p.parse_args()
    if args.record:
        record(args.record, args.prompts, args.new_tokens or 128)
        return
    smollm2 = load_traces(TRACES["smollm2"])
    rows = []
    for target, batch in PRESETS:
        times = bucket_times(target, batch, args.one_bucket)
        traces = smollm2 if target == "smollm2" else [[0] * 256]
        new_tokens = args.new_tokens or (128 if target == "smollm2" else 64)
        requests = max(len(traces), 2 * batch, 16)
        runs = compare(traces, times, batch, new_tokens, requests)
        rate = {k: r.tokens_per_second for k, r in runs.items()}
        a = runs["adaptive"]
        best = max(rate["always"], rate["no-drafter"])
        # against the best fixed choice on the engine's own steps: what the decisions are worth
        fixed_best = max(rate["always"], rate["never"])
        rows.append([target, batch, f"{rate['no-drafter']:.0f}", f"{rate['always']:.0f}", f"{rate['adaptive']:.0f}",
                     f"{rate['adaptive'] / rate['no-drafter']:.3f}x", f"{rate['adaptive'] / best:.3f}x",
                     f"**{rate['adaptive'] / fixed_best:.3f}x**", f"{rate['before'] / fixed_best:.3f}x",
                     f"{a.steps['speculative']} : {a.steps['bare']} + {a.steps['deferred']} + {a.steps['plain']} ({a.probes})"])
    log(markdown_table(["target", "batch", "target-only tok/s", "fixed tok/s", "adaptive tok/s",
                        "adaptive vs target-only", "adaptive vs best", "decisions: adaptive vs best fixed choice",
                        "the same, rule at 32cbac7", "adaptive steps spec : bare + deferred + plain (probes)"], rows))
    log("best fixed choice: always speculate, or never (the adaptive engine's own plain and deferred steps); "
        "target-only's step is the cheaper one the target-only engine runs")


if __name__ == "__main__":
    main()
