"""Tensor-parallel benchmark: ms per step of a Llama-3.1-8B-shaped target at tp 1 and tp N.

The target has random weights (bf16 on CUDA), made on each rank's device tensor by tensor
from a per-name seed and loaded through the tensor-parallel loader's `WeightFiller` (each
rank keeps only its slice), so every tp size runs the same model and nothing is read
from disk. The draft head is a random EAGLE-3 head of the matching shape, replicated on
every rank. At batch 1 a random prompt of `--context` tokens (default 1024) is prefilled
and `--steps` (default 64) steps follow; ms/step is the median host wall-clock between
consecutive token hand-offs on rank 0 (the first `--skip` intervals dropped). Setups:
target-only and an EAGLE-3 dynamic tree of 60 nodes (D=6, K=10). Acceptance is ~nil with
random weights, so the figures are the cost of a step.

Each tp size is its own `torchrun --standalone --nproc-per-node T` job (this script with
`--worker`), one after the other, so the GPUs are free between them; every rank writes
its tokens and timings to a JSON file, and this process compares them: the tokens of
every rank of a job must be identical (SPMD), and those of tp N are compared with tp 1
(the all-reduce sums the ranks' partial products in another order than one GPU's matmul,
so in bf16 a near-tie can flip a greedy token; `--dtype float32`, 32 GB of weights, makes
that far less likely; the last column says where the first difference is, if any).
NCCL runs with NVLink multicast off (`specdec.distributed` sets NCCL_NVLS_ENABLE=0).

    python examples/bench_tp.py --tp 2                 # CUDA: 8B shape, tp 1 vs tp 2, context 1024
    python examples/bench_tp.py --tp 4 --dtype float32 # the closer token comparison
    python examples/bench_tp.py --quick                # CPU gloo smoke run: tiny model, tp 1 vs 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules, also under torchrun

from _bench_common import SpecDecoder, StepTimer, fmt, header, log, markdown_table, random_eagle3_head  # noqa: E402
from bench_cycle import LLAMA31_8B, QUICK_TARGET, SETUPS, head_config  # noqa: E402

from specdec import SamplingParams  # noqa: E402
from specdec.distributed import tensor_parallel_group  # noqa: E402
from specdec.models import DecoderLM, ModelConfig  # noqa: E402
from specdec.models.loader import Target, WeightFiller  # noqa: E402
from specdec.strategies import TargetInfo  # noqa: E402

BENCH_SETUPS = ("target-only", "tree-60")
SPLIT = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=2, help="the tensor-parallel size compared with tp 1 (default 2)")
    p.add_argument("--quick", action="store_true", help="CPU gloo, tiny model, context 64, 8 steps")
    p.add_argument("--context", type=int, default=None, help="prompt tokens (default 1024; quick 64)")
    p.add_argument("--steps", type=int, default=None, help="steps timed (default 64; quick 8)")
    p.add_argument("--skip", type=int, default=None, help="first step intervals dropped (default 4; quick 2)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="weights' dtype (default bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--setups", nargs="+", choices=BENCH_SETUPS, default=list(BENCH_SETUPS))
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="SpecConfig.compile")
    p.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto", help="SpecConfig.cuda_graphs")
    p.add_argument("--out", default=None, help="also write the rows as JSON to this file")
    p.add_argument("--worker", default=None, metavar="DIR", help=argparse.SUPPRESS)  # a torchrun rank: results here
    args = p.parse_args(argv)
    if args.tp < 2:
        p.error(f"--tp {args.tp}: compare tp 1 with a tp size >= 2")
    return args


# ------------------------------------------------------------------ random weights, shard by shard
def hf_tensors(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(HF name, full shape) of every tensor of an unsharded `cfg` checkpoint (fused ones split)."""
    with torch.device("meta"):
        model = DecoderLM(cfg)
    rows = model.shard.fused_rows  # tp 1: the full chunk boundaries
    out = []
    for name, p in model.named_parameters():  # tied duplicates once
        fused = next((f for f in SPLIT if f".{f}." in name), None)
        hf = name if name == "lm_head.weight" else "model." + name
        if fused is None:
            out.append((hf, tuple(p.shape)))
            continue
        b = rows[fused]
        for i, part in enumerate(SPLIT[fused]):
            out.append((hf.replace(fused, part), (b[i + 1] - b[i], *p.shape[1:])))
    return out


def random_tensor(name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The full tensor `name`, the same on every rank and tp size: seeded by the name.

    Norm weights are ones; matrices normal(0, fan_in**-0.5) (embedding rows normal(0, 1)).
    """
    if len(shape) == 1:
        return torch.ones(shape, device=device)
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(name.encode()))
    std = 1.0 if "embed_tokens" in name else shape[1] ** -0.5
    return torch.randn(shape, generator=gen, device=device) * std  # [*shape] fp32


@torch.no_grad()
def build_target(cfg: ModelConfig, tp, device: torch.device, dtype: torch.dtype) -> Target:
    """This rank's shard of the random `cfg` model, filled by the loader's `WeightFiller`."""
    with torch.device("meta"):
        model = DecoderLM(cfg, tp=tp)  # this rank's shapes
    model.to_empty(device=device).to(dtype)
    model.tie_weights()
    filler = WeightFiller(model)
    for name, shape in hf_tensors(cfg):
        full = random_tensor(name, shape, device)
        filler.fill(name, shape, lambda index, full=full: full if index is None else full[index], "random")
        del full
    filler.check("random weights")
    model.eval().requires_grad_(False)
    info = TargetInfo(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                      model_type=cfg.model_type, eos_token_ids=(), model=model)
    return Target(model=model, info=info, tokenizer=None, hf_config=None, config=cfg, path=None)


# ------------------------------------------------------------------ one torchrun rank
def knob(value: str):
    return {"auto": "auto", "on": True, "off": False}[value]


def run_setup(key: str, target, head, prompt: list[int], args, tp_size: int, device, dtype) -> dict:
    """Build, warm up and time one setup; its tokens and ms/step."""
    _, base = SETUPS[key]
    N = base.shape.num_tree_slots
    max_seq_len = -(-(len(prompt) + args.steps + 1 + N * (1 + base.schedule.kv_lookahead_steps)) // 128) * 128
    config = base.replace(max_batch_size=1, max_seq_len=max_seq_len, compile=knob(args.compile),
                          cuda_graphs=knob(args.cuda_graphs))
    draft = head if key != "target-only" else None
    dec = SpecDecoder.from_pretrained(target, draft, config, device=device, dtype=dtype, tp_size=tp_size)
    t0 = time.perf_counter()
    dec.warmup(progress=False)
    warm = time.perf_counter() - t0
    timer = StepTimer()
    dec.engine.observers.append(timer)
    res = dec.generate([prompt], SamplingParams(max_new_tokens=args.steps + 1, ignore_eos=True))[0]
    ms, used = timer.step_ms(args.skip)
    return dict(key=key, ms=ms, intervals=used, tokens=list(res.token_ids), tau=res.stats.mean_accept_length,
                warmup_s=warm)


def worker(args) -> None:
    """One rank of a `torchrun --nproc-per-node T` job: T = WORLD_SIZE is this job's tp size."""
    tp_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    dtype = getattr(torch, args.dtype)
    if args.quick:
        torch.set_num_threads(1)  # tiny matmuls: more threads only contend
    tp, device = tensor_parallel_group(tp_size, device)
    cfg = QUICK_TARGET if args.quick else LLAMA31_8B
    t0 = time.perf_counter()
    target = build_target(cfg, tp, device, dtype)
    head = None
    if "tree-60" in args.setups:
        head = random_eagle3_head(head_config(cfg, args.quick), device=device, dtype=dtype)  # same on every rank
    built = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (args.context,), generator=gen).tolist()
    rows = [run_setup(k, target, head, prompt, args, tp_size, device, dtype) for k in args.setups]
    result = dict(tp=tp_size, rank=tp.rank, device=str(device), build_s=built, rows=rows,
                  header=header(device, dtype, "1", context=args.context, steps=args.steps))
    Path(args.worker, f"tp{tp_size}-rank{tp.rank}.json").write_text(json.dumps(result))
    tp.barrier()


# ------------------------------------------------------------------ the driver
def worker_argv(args, tp_size: int, out_dir: str) -> list[str]:
    """The torchrun command of one tp size's job."""
    flags = ["--context", str(args.context), "--steps", str(args.steps), "--skip", str(args.skip),
             "--dtype", args.dtype, "--compile", args.compile, "--cuda-graphs", args.cuda_graphs,
             "--setups", *args.setups, "--worker", out_dir] + (["--quick"] if args.quick else [])
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp_size}",
            __file__, *flags]


def run_job(args, tp_size: int, out_dir: str) -> list[dict]:
    """Run one tp size's torchrun job; every rank's result, rank order."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    t0 = time.perf_counter()
    log(f"tp {tp_size}: torchrun --nproc-per-node {tp_size} ...")
    done = subprocess.run(worker_argv(args, tp_size, out_dir), env=env)
    if done.returncode:
        raise SystemExit(f"the tp {tp_size} job failed (exit {done.returncode}); its ranks' output is above")
    ranks = [json.loads(Path(out_dir, f"tp{tp_size}-rank{r}.json").read_text()) for r in range(tp_size)]
    log(f"tp {tp_size}: done in {time.perf_counter() - t0:.1f} s (random weights built in {ranks[0]['build_s']:.1f} s)")
    return ranks


def same_tokens(a: list[int], b: list[int]) -> str:
    """'yes', or where the two token lists first differ."""
    if a == b:
        return "yes"
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"no (first difference at token {i} of {len(a)})"


def report(args, one: list[dict], many: list[dict]) -> list[dict]:
    """Print the table; the rows (also written to --out)."""
    T = args.tp
    for job in (one, many):  # SPMD: every rank of a job generated the same tokens
        for r in job[1:]:
            for a, b in zip(job[0]["rows"], r["rows"]):
                if a["tokens"] != b["tokens"]:
                    raise SystemExit(f"tp {r['tp']}: rank {r['rank']}'s {a['key']} tokens differ from rank 0's")
    rows = []
    for a, b in zip(one[0]["rows"], many[0]["rows"]):
        rows.append(dict(setup=SETUPS[a["key"]][0], ms_tp1=a["ms"], ms_tpN=b["ms"], speedup=a["ms"] / b["ms"],
                         tau=b["tau"], equal=same_tokens(a["tokens"], b["tokens"]), intervals=b["intervals"]))
    print()
    log(one[0]["header"] + f" · tp 1 vs tp {T} · {many[0]['device']} x{T}")
    print()
    cells = [[r["setup"], fmt(r["ms_tp1"], ".3f"), fmt(r["ms_tpN"], ".3f"), fmt(r["speedup"], suffix="x"),
              fmt(r["tau"]), r["equal"]] for r in rows]
    log(markdown_table(["setup", "tp 1 ms/step", f"tp {T} ms/step", f"speed-up tp {T} vs tp 1", "tau",
                        f"tokens tp {T} == tp 1"], cells))
    print()
    log(f"- ms/step: median of {rows[0]['intervals']} step intervals on rank 0 (batch 1, context {args.context})")
    log(f"- tokens identical on every rank of each job (checked); tp {T} vs tp 1 in the last column")
    target = next((r for r in rows if r["setup"] == SETUPS["target-only"][0]), None)
    if target and not args.quick:
        verdict = "meets" if target["speedup"] >= 1.5 else "misses"
        log(f"- target-only speed-up {target['speedup']:.2f}x {verdict} the 1.5x bar (aim 1.7x)")
    if args.quick:
        log("- --quick: tiny model on CPU gloo ranks; the figures only show the script runs")
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.quick
    args.context = args.context or (64 if args.quick else 1024)
    args.steps = args.steps or (8 if args.quick else 64)
    args.skip = args.skip if args.skip is not None else (2 if args.quick else 4)
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    if args.worker:
        return worker(args)
    if not cuda and not args.quick:
        raise SystemExit("no CUDA device: the 8B shape needs GPUs; use --quick for the CPU smoke run")
    if cuda and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs; this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="bench_tp-") as out_dir:
        one = run_job(args, 1, out_dir)
        many = run_job(args, args.tp, out_dir)
    rows = report(args, one, many)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(args=vars(args), rows=rows), indent=1))


if __name__ == "__main__":
    main()
