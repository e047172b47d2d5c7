"""The SmolLM2 part of the GPU check: every drafter, target-only included, in bf16 and fp32.

Each setup is one `SpecDecoder` on the shipped SmolLM2-135M-Instruct (GGUF) with its shipped
heads, compiled and captured (`compile="auto"`, `cuda_graphs="auto"`), warmed up (warmup()
and one throw-away request, not timed), then generates `--new-tokens` greedy tokens for each
of `--prompts` shipped held-out prompts, one at a time (batch 1), and one seeded sampled
request through the target-only verifier. All twelve decoders live in one process.

Pass/fail: in float32 every setup's greedy tokens must equal target-only's, prompt by prompt
(bf16 is reported: tree verification and decoding round differently, so a near-tie can
flip); every setup must generate every token; nothing may be captured or compiled after the
warm-up. Writes a JSON summary (`--out`) and prints a table; exit status 1 on any failure.

    python scripts/gpu_smoke.py --out $OUT/smoke.json     # on the H200 (scripts/gpu_check.sh)
    python scripts/gpu_smoke.py --quick                   # CPU: tiny random target and heads
    python scripts/gpu_smoke.py --dtypes float32 --only tree   # target-only and the trees alone
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _bench_common import SpecDecoder, sync, warm_up  # noqa: E402
from bench_e2e import heldout_ids, random_ids, smollm2_assets, tiny_assets  # noqa: E402

from specdec import SamplingParams, SpecConfig  # noqa: E402
from specdec.models import load_target  # noqa: E402

SETUPS = {  # name -> (config, head)
    "target-only": (dict(drafter="none"), None),
    "eagle3 chain D=5": (dict(drafter="eagle3", max_draft_len=5), "eagle3"),
    "eagle3 tree D=6 K=8 N=48": (dict(drafter="eagle3", tree="dynamic", topk=8, max_draft_len=6, max_total_draft_tokens=48), "eagle3"),
    "mtp chain D=5": (dict(drafter="mtp", max_draft_len=5), "mtp"),
    "mtp tree D=4 K=4 N=12": (dict(drafter="mtp", tree="dynamic", topk=4, max_draft_len=4, max_total_draft_tokens=12), "mtp"),
    "ngram chain D=8": (dict(drafter="ngram", max_draft_len=8), None),
}


def run_setup(name, target, heads, prompts, new_tokens, max_seq_len) -> dict:
    cfg, head = SETUPS[name]
    config = SpecConfig(**cfg, verifier="target-only", max_batch_size=1, max_seq_len=max_seq_len)
    dec = SpecDecoder.from_pretrained(target, heads[head] if head else None, config)
    device = next(target.model.parameters()).device
    warm_s = warm_up(dec, prompts, [1], device)
    graphs = dec.engine.capture_count
    greedy = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    outputs, steps, seconds = [], 0, 0.0
    for prompt in prompts:
        sync(device)
        t0 = time.perf_counter()
        result = dec.generate([prompt], greedy, progress=False)[0]
        sync(device)
        seconds += time.perf_counter() - t0
        outputs.append(result.token_ids)
        steps += result.stats.steps
    sampled = dec.generate([prompts[0]], SamplingParams(max_new_tokens=new_tokens, temperature=0.7, top_p=0.9, seed=3,
                                                        ignore_eos=True), progress=False)[0].token_ids
    tokens = sum(map(len, outputs))
    return dict(name=name, outputs=outputs, tok_s=tokens / seconds, tau=(tokens - len(prompts)) / max(steps, 1),
                warmup_s=warm_s, graphs_after_warmup=graphs, graphs_after_run=dec.engine.capture_count,
                sampled_tokens=len(sampled), complete=all(len(o) == new_tokens for o in outputs) and len(sampled) == new_tokens)


def assets(quick: bool):
    """(target path, head paths): the shipped SmolLM2 and heads, or tiny random ones (--quick)."""
    return tiny_assets(Path(tempfile.mkdtemp(prefix="gpu_smoke_"))) if quick else smollm2_assets()


def prompt_ids(target, n: int, quick: bool) -> list[list[int]]:
    return random_ids(target.info.vocab_size, n) if quick else heldout_ids(target, n)


def chosen_setups(only: list[str] | None) -> list[str]:
    """target-only (every other setup is compared with it), then the setups whose name holds one
    of `only` (case-insensitive; all of them when None). A word that names none is an error."""
    if only is None:
        return list(SETUPS)
    unmatched = [w for w in only if not any(w.lower() in name.lower() for name in SETUPS)]
    if unmatched:
        raise SystemExit(f"--only {' '.join(unmatched)}: names no setup; setups: {', '.join(SETUPS)}")
    return ["target-only"] + [n for n in SETUPS if n != "target-only" and any(w.lower() in n.lower() for w in only)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU, tiny random target and heads")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--out", default=None)
    p.add_argument("--only", nargs="+", default=None, metavar="WORD",
                   help="run target-only and the setups whose name holds a WORD (e.g. tree, mtp, 'eagle3 chain')")
    args = p.parse_args()
    names = chosen_setups(args.only)
    device = "cpu" if args.quick or not torch.cuda.is_available() else "cuda"
    if device == "cpu":
        torch.set_num_threads(1)
    path, heads = assets(args.quick)
    rows, failures = [], []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        target = load_target(path, device=device, dtype=dtype)
        prompts = prompt_ids(target, args.prompts, args.quick)
        max_seq_len = max(map(len, prompts)) + args.new_tokens + 64
        base = None
        for name in names:
            try:
                row = run_setup(name, target, heads, prompts, args.new_tokens, max_seq_len)
            except Exception as err:  # noqa: BLE001 - a failed setup is a row, the others still run
                traceback.print_exc()
                row = dict(name=name, error=f"{type(err).__name__}: {err}"[:300], outputs=None)
            row["dtype"] = dtype_name
            if name == "target-only":
                base = row["outputs"]
            same = None if base is None or row["outputs"] is None else sum(a == b for a, b in zip(row["outputs"], base))
            row["identical"] = same
            problems = []
            if "error" in row:
                problems.append(row["error"])
            else:
                if not row["complete"]:
                    problems.append("fewer tokens than asked")
                if row["graphs_after_run"] != row["graphs_after_warmup"]:
                    problems.append(f"captured after warm-up ({row['graphs_after_warmup']} -> {row['graphs_after_run']})")
                if dtype_name == "float32" and same != len(prompts):
                    problems.append(f"fp32 output differs from target-only on {len(prompts) - (same or 0)} prompts")
            row["ok"] = not problems
            row["problems"] = problems
            failures += [f"{dtype_name} {name}: {x}" for x in problems]
            rows.append(row)
            print(f"ROW {dtype_name} | {name} | {'ok' if row['ok'] else 'FAIL ' + '; '.join(problems)} | "
                  f"{row.get('tok_s', 0):.0f} tok/s | tau {row.get('tau', 0):.2f} | identical {same}/{len(prompts)}", flush=True)
        del target
    header = f"SmolLM2-135M-Instruct{' (tiny stand-in)' if args.quick else ''}, {device}, batch 1, {args.prompts} held-out prompts x {args.new_tokens} greedy tokens"
    lines = [header, "", "| dtype | setup | result | tok/s | tau | identical to target-only |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['name']} | {'pass' if r['ok'] else 'FAIL'} | {r.get('tok_s', 0):.0f} | "
                     f"{r.get('tau', 0):.2f} | {r['identical']}/{args.prompts} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(table=table, failures=failures,
                                                  rows=[{k: v for k, v in r.items() if k != "outputs"} for r in rows]), indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
