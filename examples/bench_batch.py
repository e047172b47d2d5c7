"""Batch sweep: does speculation still pay when many requests share the step? And does
adaptive speculation keep it from ever costing throughput?

For each target and batch size B (`--batch-sizes`, default 1 4 16 64) three decoders with
`max_batch_size=B` each generate `--new-tokens` greedy tokens (default 64) for max(2B, 16)
prompts (`--min-requests`; at least 16 so that batch 1 times more than a fraction of a second;
continuous batching: a finished request's slot takes the next prompt), and we report
output tok/s:

- target-only (`drafter="none"`), the baseline;
- fixed: EAGLE-3 chain D=5 speculating every step;
- adaptive: the same with `SpecConfig(adaptive=True)` (a plain step per bucket beside the
  speculative one, chosen per step by expected tokens per second: each request's per-depth
  acceptance over the bucket's measured step time; see `specdec.engine.adaptive`). Per adaptive
  run it prints, per bucket and variant, the steps, the probes and the predicted vs measured
  tokens per second (step tokens / step seconds), so a wrong decision can be read off;
- adaptive-always (`--setups`, not in the table): the adaptive engine with its rule's choice
  replaced by "speculate": the fixed chain's steps in the adaptive engine (its graphs per
  variant, its bookkeeping, the rule's observations) without the rule's choice, so a gap
  between adaptive's speculative steps and fixed's splits into the rule's host work and the
  engine's (at 32cbac7 SmolLM2 batch 1: 1.917 against 1.818 ms per step, unexplained on the CPU).
- transformers (`--setups`, opt-in: it compiles once per batch size): transformers' best batched
  path on the same requests, `generate` with a static cache and its own `torch.compile` (the
  recipe and warm-up of `bench_e2e.py`'s hf-compiled row), in static batches of B; the table
  gains a column, target-only over it. SmolLM2 only: the 8B shape's random weights are made on
  the device, with no checkpoint for transformers to load.

Targets (`--targets`):
- `smollm2`: SmolLM2-135M-Instruct with the shipped EAGLE-3 head, the shipped held-out prompts;
- `8b-all` / `8b-none`: the Llama-3.1-8B shape with random bf16 weights and a random EAGLE-3
  head, with the acceptance forced: `8b-all` verifies with a (lossy, benchmark-only) rule that
  accepts every draft of the chain, the upper bound of what speculation can give; `8b-none`
  with a rule that accepts none, where speculation can only cost (adaptive must stay >= 0.98x).

    python examples/bench_batch.py                         # H200: all targets, batch 1 4 16 64
    python examples/bench_batch.py --targets smollm2 --batch-sizes 1 4
    python examples/bench_batch.py --targets smollm2 --setups target-only fixed adaptive transformers
    python examples/bench_batch.py --quick                 # CPU smoke run on tiny random models
    python examples/bench_batch.py --targets 8b-none --batch-sizes 64 --profile 25   # + one profiled run per setup
    python examples/bench_batch.py --targets 8b-none --batch-sizes 1 --setups target-only adaptive --overlap both
                                                           # each setup also with overlapped steps (notes/OVERLAP.md)

Targets (issue 22, H200): adaptive >= 0.98x target-only and >= 0.97x the better of fixed and
target-only at every batch size and target, the never-accepting head included.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import time

import torch
from _bench_common import (JsonLines, SpecDecoder, TimedRegion, fmt, header, log, markdown_table, random_eagle3_head, sync,
                           warm_up)
from _gpu_clocks import GpuClocks

from specdec import SamplingParams, SpecConfig, hookimpl
from specdec.engine.adaptive import DecisionLog
from specdec.engine.step_timing import HOST_PARTS
from specdec.registry import get_plugin_manager
from specdec.ops import verify_greedy
from specdec.types import Acceptance, TreeMeta


SETUPS = ("target-only", "fixed", "adaptive", "adaptive-always", "transformers")
TABLE_SETUPS = SETUPS[:3]  # adaptive-always is a diagnosis, printed per run only; transformers is opt-in (compile time)
OVERLAP = "+overlap"  # a setup's kind with overlapped steps (`--overlap`)


# ----------------------------------------------------------------------------- forced acceptance
class ForcedVerifier:
    """Benchmark-only, lossy: accept the whole drafted chain (`all`) or nothing (`none`); the
    bonus token is the target's argmax at the last accepted node. Chains only."""

    lossless = False
    needs_draft_probs = False
    greedy_only = True

    def __init__(self, accept_all: bool) -> None:
        self.accept_all = accept_all
        self._trees = {}  # (B, device) -> a root-only TreeMeta, made once (not inside a captured step)

    def _root_only(self, B: int, device) -> TreeMeta:
        key = (B, str(device))
        if key not in self._trees:
            self._trees[key] = TreeMeta.empty(B, 1, device)  # next_token / next_sibling -1: no children
        return self._trees[key]

    def __call__(self, tokens, tree, target_logits, sampling=None, *, uniforms=None, draft_probs=None):
        B, N = tokens.shape
        valid = (tree.retrieve_index >= 0).sum(1)  # [B] nodes in each row's chain
        length = valid - 1 if self.accept_all else torch.zeros_like(valid)  # [B]
        j = torch.arange(N, device=tokens.device)[None]
        nodes = torch.where(j <= length[:, None], j, -1)
        V = target_logits.shape[-1]
        row = target_logits.gather(1, length[:, None, None].expand(-1, 1, V))  # [B, 1, V] the bonus node's logits
        # the argmax through the library's greedy verify on a root-only tree: the kernel target-only's
        # steps use (a torch argmax over [B, N, V] cost ~27 us per step at batch 1 on the 8B shape)
        bonus = verify_greedy(tokens[:, :1], self._root_only(B, tokens.device), row).accept_tokens  # [B, 1]
        shifted = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)  # token of node j + 1 at column j
        out = torch.where(j < length[:, None], shifted, torch.where(j == length[:, None], bonus, -1))
        return Acceptance(accept_length=length, accept_nodes=nodes, accept_tokens=out)


class ForcedPlugin:
    @hookimpl
    def specdec_strategy_names(self):
        return {"verifier": ["accept-all", "accept-none"]}

    @hookimpl
    def specdec_verify(self, config):
        if config.verifier in ("accept-all", "accept-none"):
            return ForcedVerifier(config.verifier == "accept-all")
        return None


# ----------------------------------------------------------------------------- targets
def smollm2(device, dtype, quick: bool):
    """(target, eagle3 head path, prompts, verifier) for SmolLM2 (or a tiny stand-in with --quick)."""
    import tempfile
    from pathlib import Path

    from bench_e2e import heldout_ids, random_ids, smollm2_assets, tiny_assets

    from specdec.models import load_target

    if quick:
        path, heads = tiny_assets(Path(tempfile.mkdtemp(prefix="bench_batch_")))
        target = load_target(path, device=device, dtype=dtype)
        return target, heads["eagle3"], random_ids(target.info.vocab_size, 8), "greedy"
    path, heads = smollm2_assets()
    target = load_target(path, device=device, dtype=dtype)
    return target, heads["eagle3"], heldout_ids(target, 64), "greedy"


def eight_b(device, dtype, quick: bool, accept_all: bool):
    from bench_cycle import LLAMA_CAPTURE, QUICK_CAPTURE, QUICK_TARGET, build_target, head_config
    from bench_target import LLAMA31_8B

    cfg = QUICK_TARGET if quick else LLAMA31_8B
    target = build_target(cfg, device, dtype)
    head = random_eagle3_head(head_config(cfg, quick), device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (64 + 16 * (i % 8),), generator=gen).tolist() for i in range(128)]
    del LLAMA_CAPTURE, QUICK_CAPTURE
    return target, head, prompts, "accept-all" if accept_all else "accept-none"


# ----------------------------------------------------------------------------- runs
class PhaseClock:
    """Host seconds spent in one engine method (wrapped on the instance, unwrapped by `stop`)."""

    def __init__(self, engine, method: str) -> None:
        self.engine, self.method, self.seconds = engine, method, 0.0
        inner = getattr(engine, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(engine, method, timed)

    def stop(self) -> None:
        delattr(self.engine, self.method)


class ForwardCounter:
    """Prompt forwards of the target runner and the drafter during a run, the chunk tokens
    they carried and their seconds (device synced before and after each: a prompt forward is
    long, so the syncs cost little) (wrapped on the instances, unwrapped by `stop`): how a
    run's prefill time splits into target forwards, head forwards and the host work around
    them, so decoders that prefill the same prompts can be compared."""

    def __init__(self, engine, device) -> None:
        self.device = device
        self.counts = {"target": [0, 0, 0.0], "draft": [0, 0, 0.0]}  # role -> [forwards, tokens, seconds]
        # role -> (chunks, longest chunk) -> [forwards, seconds]: whether setups that prefill the
        # same prompts differ in how they group them or in what one group's forward costs
        self.shapes = {"target": {}, "draft": {}}
        self._depth = {"target": 0, "draft": 0}
        self._wrapped = []
        drafter = engine.strategies.drafter
        for role, owner in (("target", engine.runner), ("draft", drafter if hasattr(drafter, "model") else None)):
            for method, many in (("prefill", False), ("prefill_many", True)):
                if owner is not None and hasattr(owner, method):  # a drafter without a model runs no forward
                    self._wrap(owner, method, role, many)

    def _wrap(self, owner, method: str, role: str, many: bool) -> None:
        inner = getattr(owner, method)
        count = self.counts[role]
        shapes = self.shapes[role]
        depth = self._depth
        device = self.device

        def counted(slots, chunks, *args, **kwargs):
            outermost = not depth[role]  # `prefill` may go through `prefill_many`
            if outermost:
                count[0] += 1
                count[1] += sum(len(c) for c in chunks) if many else len(chunks)
                shape = (len(chunks), max(len(c) for c in chunks)) if many else (1, len(chunks))
                sync(device)
                t0 = time.perf_counter()
            depth[role] += 1
            try:
                return inner(slots, chunks, *args, **kwargs)
            finally:
                depth[role] -= 1
                if outermost:
                    sync(device)
                    count[2] += time.perf_counter() - t0
                    entry = shapes.setdefault(shape, [0, 0.0])
                    entry[0] += 1
                    entry[1] += time.perf_counter() - t0

        setattr(owner, method, counted)
        self._wrapped.append((owner, method))

    def stop(self) -> dict:
        for owner, method in self._wrapped:
            delattr(owner, method)
        out = {f"{role}_{what}": n for role, (f, t, s) in self.counts.items()
               for what, n in (("forwards", f), ("tokens", t), ("forward_s", s))}
        for role, shapes in self.shapes.items():
            out[f"{role}_shapes"] = [dict(chunks=c, longest=n, forwards=f, ms_per_forward=1e3 * s / f)
                                     for (c, n), (f, s) in sorted(shapes.items())]
        return out


def timed_run(dec, batch, params, device) -> dict:
    """One timed `generate` of `batch` on a warm decoder: tok/s, tau, and its time split into
    steps / prefill (admission) / other."""
    engine = dec.engine
    prefill = PhaseClock(engine, "_advance_prefills")  # host time admitting prompts (ends in a sync per prompt)
    forwards = ForwardCounter(engine, device)
    steps_before = engine.step_times.seconds
    beside_before = engine.step_times.beside_prefill
    buckets_before = {k: list(v) for k, v in engine.step_times.by_bucket.items()}
    running_before = dict(engine.step_times.running_by_bucket)
    host_before = {k: list(v) for k, v in engine.step_times.host_split.items()}
    with GpuClocks() as clocks, TimedRegion() as region:  # the SM clock it ran at (nvidia-smi, if there)
        sync(device)
        t0 = time.perf_counter()
        results = dec.generate(batch, params, progress=False)
        sync(device)
        seconds = time.perf_counter() - t0
    prefill.stop()
    prefill_forwards = forwards.stop()
    step_s = engine.step_times.seconds - steps_before
    buckets = []  # this run's steps per (bucket, variant): steps, ms/step, the tokens they made per second
    for (bucket, variant), (n, sec, tok) in sorted(engine.step_times.by_bucket.items()):
        n0, sec0, tok0 = buckets_before.get((bucket, variant), (0, 0.0, 0))
        if n > n0:
            split = engine.step_times.host_split.get((bucket, variant), [0.0] * len(HOST_PARTS))
            split0 = host_before.get((bucket, variant), [0.0] * len(HOST_PARTS))
            buckets.append(dict(bucket=bucket, variant=variant, steps=n - n0, ms_per_step=1e3 * (sec - sec0) / (n - n0),
                                tok_s=(tok - tok0) / (sec - sec0),
                                running=(engine.step_times.running_by_bucket.get((bucket, variant), 0)
                                         - running_before.get((bucket, variant), 0)) / (n - n0),
                                host_us={part: 1e6 * (a - a0) / (n - n0) for part, a, a0 in zip(HOST_PARTS, split, split0)}))
    tokens = sum(len(r.token_ids) for r in results)
    steps = sum(r.stats.steps for r in results)
    return dict(tok_s=tokens / seconds, seconds=seconds, tokens=tokens,
                tau=sum(len(r.token_ids) - 1 for r in results) / max(steps, 1),
                step_s=step_s, prefill_s=prefill.seconds, other_s=seconds - step_s - prefill.seconds,
                # overlapped steps with a prefill in their window (charged without it; no sample for the rule)
                beside_prefill=engine.step_times.beside_prefill - beside_before,
                decode_tok_s=(tokens - len(results)) / step_s if step_s else float("nan"),  # tokens the steps made
                gc_ms=region.gc_ms, gc_collections=region.collections, buckets=buckets, gpu=clocks.summary(),
                **prefill_forwards)


def profile_run(dec, batch, params, device, kind: str, rows: int) -> None:
    """`generate` of `batch` under torch.profiler, then under cProfile (after the timed runs,
    so they are not perturbed): the `rows` ops with the most host time and, on CUDA, the most
    device time, then the `rows` Python functions with the most own time, each with its calls,
    so a run's prefill and steps can be read op by op and the engine's host work function by
    function."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        dec.generate(batch, params, progress=False)
        sync(device)
    events = prof.key_averages()
    log(f"  {kind}: profiled run, ops by self host time:\n" + events.table(sort_by="self_cpu_time_total", row_limit=rows))
    if device.type == "cuda":
        log(f"  {kind}: profiled run, ops by self device time:\n" + events.table(sort_by="self_cuda_time_total", row_limit=rows))
    # the Python side (the engine's host work between forwards and steps), in a run of its own
    import cProfile
    import io
    import pstats

    python = cProfile.Profile()
    python.enable()
    dec.generate(batch, params, progress=False)
    sync(device)
    python.disable()
    text = io.StringIO()
    pstats.Stats(python, stream=text).sort_stats("tottime").print_stats(rows)
    log(f"  {kind}: profiled run, Python functions by own time (cProfile):\n" + text.getvalue())


def run(target, head, prompts, B, new_tokens, kind, verifier, args):
    """Output tok/s of one decoder kind at batch B on max(2B, --min-requests) prompts (warm-up not
    timed): the median of --repeats timed runs on the same warm decoder."""
    kind, overlap = kind.removesuffix(OVERLAP), kind.endswith(OVERLAP)  # "fixed+overlap": overlapped steps
    base = SpecConfig(max_batch_size=B, max_seq_len=args.max_seq_len, compile=args.compile, cuda_graphs=args.cuda_graphs,
                      overlap=overlap)
    if kind == "target-only":
        config, draft = base.replace(drafter="none"), None
    else:
        config = base.replace(drafter="eagle3", max_draft_len=5, verifier=verifier, adaptive=kind.startswith("adaptive"))
        draft = head
    pm = get_plugin_manager()
    pm.register(ForcedPlugin())
    dec = SpecDecoder.from_pretrained(target, draft, config, pm=pm)
    batch = [prompts[i % len(prompts)] for i in range(max(2 * B, args.min_requests))]
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    device = next(target.model.parameters()).device
    warm_s = warm_up(dec, batch, [B], device)  # every setup, the baseline included, warm before timing
    rule = dec.engine.adaptive_rule
    if kind == "adaptive-always":  # the rule's choice replaced (after warm-up, which timed every variant)
        rule.choose = lambda bucket, running, plain=None: True
    decision_log = DecisionLog()
    if rule is not None:  # count the timed runs' decisions only (the estimates stay warm)
        rule.decisions, rule.probes, rule.admissions = {True: 0, False: 0}, 0, {True: 0, False: 0}
        dec.add_observer(decision_log)
    runs = [timed_run(dec, batch, params, device) for _ in range(args.repeats)]
    if args.profile:  # one more run, untimed, under the profiler: where host and device time go
        profile_run(dec, batch, params, device, kind, args.profile)
    med = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]  # the median run (its own breakdown)
    decisions = None if rule is None else dict(speculative=rule.decisions[True], plain=rule.decisions[False], probes=rule.probes,
                                               # requests admitted with / without their drafter (a head that pays nowhere)
                                               admitted_drafting=rule.admissions[True], admitted_undrafted=rule.admissions[False])
    kind = kind + (OVERLAP if overlap else "")
    row = dict(kind=kind, batch=B, **med, warmup_s=warm_s, repeats=len(runs),
               tok_s_runs=[r["tok_s"] for r in runs],
               decisions=decisions, costs=None if rule is None else rule.costs.table(),
               decision_summary=decision_log.summary() if rule is not None else None)
    spread = f"runs {min(row['tok_s_runs']):.0f}-{max(row['tok_s_runs']):.0f} tok/s" if len(runs) > 1 else ""
    log(f"  {kind}: median of {len(runs)}: {med['seconds']:.2f} s = steps {med['step_s']:.2f} + prefill "
        f"{med['prefill_s']:.2f} + other {med['other_s']:.2f}; decode {med['decode_tok_s']:.0f} tok/s; gc "
        f"{med['gc_collections']} collections, {med['gc_ms']:.1f} ms; {spread}"
        + (f"; {med['beside_prefill']} overlapped steps had a prefill in their window (not charged to them)"
           if med.get("beside_prefill") else ""))
    label = (lambda d: f"{d['bucket']} {d['variant']}") if rule is not None else (lambda d: f"{d['bucket']}")
    log(f"  {kind}: steps per bucket: " + "; ".join(
        f"{label(d)} x{d['steps']} {d['ms_per_step']:.3f} ms {d['tok_s']:.0f} tok/s {d['running']:.1f} running"
        for d in med["buckets"]))
    log(f"  {kind}: a step's host timeline per bucket, us (" + " / ".join(HOST_PARTS) + "): " + "; ".join(
        f"{label(d)} " + " / ".join(f"{d['host_us'][part]:.0f}" for part in HOST_PARTS) for d in med["buckets"]))
    host = med["prefill_s"] - med["target_forward_s"] - med["draft_forward_s"]
    log(f"  {kind}: prompt forwards: target {med['target_forwards']} ({med['target_tokens']} tokens, "
        f"{med['target_forward_s']:.3f} s), draft head {med['draft_forwards']} ({med['draft_tokens']} tokens, "
        f"{med['draft_forward_s']:.3f} s); prefill host work around them {host:.3f} s")
    log(f"  {kind}: target prompt forwards by chunks x longest chunk: " + "; ".join(
        f"{d['chunks']}x{d['longest']} x{d['forwards']} {d['ms_per_forward']:.2f} ms" for d in med["target_shapes"]))
    if med["gpu"] is not None:
        g = med["gpu"]
        log(f"  {kind}: GPU during the run: SM clock median {g['sm_mhz_median']:.0f} MHz (lowest {g['sm_mhz_min']:.0f}), "
            f"power median {g['power_w_median']:.0f} W (highest {g['power_w_max']:.0f}), {g['samples']} samples")
    for d in row["decision_summary"] or []:
        log(f"  adaptive bucket {d['bucket']:>3} {d['variant']:<11} steps {d['steps']:>4} (probes {d['probes']:>3}) "
            f"predicted {d['predicted_tok_s']:8.1f} tok/s, measured {d['measured_tok_s']:8.1f} tok/s (step tokens / step seconds)")
    del dec
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


_HF_RUNNERS: dict = {}  # target path -> bench_e2e.HFRunner: one transformers model per target, compiled per batch size


def run_transformers(target, prompts, B, new_tokens, args) -> dict:
    """transformers' best batched path on the same requests: `generate` with a static cache and
    its own `torch.compile` (bench_e2e's `hf-compiled` recipe, warmed per batch size first), in
    static batches of B (transformers' `generate` has no continuous batching: a batch runs until
    its every request is done, here all the same length)."""
    from bench_e2e import HFRunner, run_hf

    device = next(target.model.parameters()).device
    dtype = next(target.model.parameters()).dtype
    runner = _HF_RUNNERS.get(str(target.path))
    if runner is None:
        pad_id = target.tokenizer.pad_token_id if target.tokenizer is not None else None
        runner = _HF_RUNNERS[str(target.path)] = HFRunner(target.path, dtype, device, new_tokens,
                                                          0 if pad_id is None else pad_id)
    batch = [prompts[i % len(prompts)] for i in range(max(2 * B, args.min_requests))]
    compile_on = args.compile is not False and device.type == "cuda"
    (row,), notes = run_hf("hf-compiled", runner, batch, [B], args, compile_on)
    for note in notes:
        log(f"  transformers: {note}")
    return dict(kind="transformers", batch=B, tok_s=row["tok_s"], seconds=row["seconds"], tokens=row["new_tokens"],
                tau=1.0, decode_tok_s=None, warmup_s=row["warmup_s"], repeats=1, tok_s_runs=[row["tok_s"]],
                decisions=None, costs=None, decision_summary=None, name=row["name"],
                compiled_during_run=row["dynamo_graphs_during_run"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU, tiny random models, batch 1 2, 8 new tokens")
    p.add_argument("--targets", nargs="+", default=["smollm2", "8b-all", "8b-none"],
                   choices=["smollm2", "8b-all", "8b-none"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--min-requests", type=int, default=None, help="requests per batch size at least (default 16; --quick 2)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per setup and batch size; the median run is reported (a batch-4 run of SmolLM2 "
                        "takes ~0.3 s on the H200, where one run's noise moved the ratios by 10-20%%)")
    p.add_argument("--compile", default="auto")
    p.add_argument("--cuda-graphs", default="auto")
    p.add_argument("--out", default=None, help="JSON lines of every row")
    p.add_argument("--setups", nargs="+", choices=SETUPS, default=list(TABLE_SETUPS),
                   help="which setups to run (default the table's three: target-only fixed adaptive)")
    p.add_argument("--overlap", choices=("off", "on", "both"), default="off",
                   help="overlapped steps (launch the next step before reading the last hand-off, notes/OVERLAP.md): "
                        "off, on for every setup, or both (each setup also with '+overlap', side by side; ratios "
                        "against target-only without it)")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="after the timed runs, one more under torch.profiler per setup: print its ROWS ops with the most "
                        "host (and device) time (0: none)")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats} is out of range; allowed: an int >= 1")
    if args.profile < 0:
        p.error(f"--profile {args.profile} is out of range; allowed: an int >= 0 (0: no profiled run)")
    for name in ("compile", "cuda_graphs"):
        value = getattr(args, name)
        setattr(args, name, {"on": True, "off": False, "true": True, "false": False}.get(value, value))
    quick = args.quick
    device = torch.device("cuda" if torch.cuda.is_available() and not quick else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = args.batch_sizes or ([1, 2] if quick else [1, 4, 16, 64])
    new_tokens = args.new_tokens or (8 if quick else 64)
    if args.min_requests is None:
        args.min_requests = 2 if quick else 16
    if quick:
        torch.set_num_threads(1)
    head_line = header(device, dtype, " / ".join(map(str, sizes)), new_tokens=new_tokens)
    log(head_line)
    out = JsonLines(args.out, dict(header=head_line, quick=quick))
    rows = []
    for name in args.targets:
        if name == "smollm2":
            target, head, prompts, verifier = smollm2(device, dtype, quick)
        else:
            target, head, prompts, verifier = eight_b(device, dtype, quick, accept_all=name == "8b-all")
        for B in sizes:
            found = {}
            kinds = tuple(k for k in SETUPS if k in args.setups)
            kinds = {"off": kinds, "on": tuple(k + OVERLAP for k in kinds), "both": kinds + tuple(k + OVERLAP for k in kinds)}[args.overlap]
            for kind in kinds:
                if kind == "transformers" + OVERLAP:
                    log(f"  transformers: no row for {name} with overlap (transformers has no such mode)")
                    continue
                if kind == "transformers":
                    if target.path is None:
                        log(f"  transformers: no row for {name} (random weights made on the device: no checkpoint "
                            "for transformers to load)")
                        continue
                    row = run_transformers(target, prompts, B, new_tokens, args) | dict(target=name)
                else:
                    row = run(target, head, prompts, B, new_tokens, kind, verifier, args) | dict(target=name)
                kind = row["kind"]
                found[kind] = row
                base = found.get("target-only", found.get("target-only" + OVERLAP))
                row["vs_target_only"] = row["tok_s"] / base["tok_s"] if base else float("nan")
                rows.append(row)
                out.write(row | {"kind_row": "row"})
                log(f"ROW {name} | batch {B} | {kind} | {row['tok_s']:.1f} tok/s | {row['vs_target_only']:.2f}x | "
                    f"tau {row['tau']:.2f} | decisions {row['decisions']}")
        del target
        gc.collect()
    cells = []
    with_hf = any(x["kind"] == "transformers" for x in rows)  # a column of target-only vs transformers
    for name in args.targets:
        for B in sizes:
            r = {x["kind"]: x for x in rows if x["target"] == name and x["batch"] == B}
            if args.overlap == "on":  # the table: the setups without overlap, or all of them with it
                r = {k.removesuffix(OVERLAP): x for k, x in r.items()}
            if not all(k in r for k in ("target-only", "fixed", "adaptive")):
                continue
            best = max(r["target-only"]["tok_s"], r["fixed"]["tok_s"])
            d = r["adaptive"]["decisions"]
            dec_base = r["target-only"]["decode_tok_s"]
            dec_best = max(dec_base, r["fixed"]["decode_tok_s"])
            cells.append([name, B, fmt(r["target-only"]["tok_s"], ".0f"), fmt(r["fixed"]["tok_s"], ".0f"),
                          fmt(r["fixed"]["vs_target_only"], suffix="x"), fmt(r["adaptive"]["tok_s"], ".0f"),
                          fmt(r["adaptive"]["vs_target_only"], suffix="x"), fmt(r["adaptive"]["tok_s"] / best, suffix="x"),
                          fmt(r["fixed"]["decode_tok_s"] / dec_base, suffix="x"),
                          fmt(r["adaptive"]["decode_tok_s"] / dec_base, suffix="x"),
                          fmt(r["adaptive"]["decode_tok_s"] / dec_best, suffix="x"),
                          fmt(r["adaptive"]["tau"]), f"{d['speculative']} : {d['plain']} ({d['probes']})",
                          " / ".join(fmt(r[k]["step_s"] / r[k]["seconds"], ".0%") for k in ("target-only", "fixed", "adaptive"))]
                         + ([fmt(r["target-only"]["tok_s"] / r["transformers"]["tok_s"], suffix="x")
                             if "transformers" in r else "-"] if with_hf else []))
    print()
    log(head_line)
    print()
    log(markdown_table(["target", "batch", "target-only tok/s", "fixed tok/s", "fixed vs target-only",
                        "adaptive tok/s", "adaptive vs target-only", "adaptive vs best of both",
                        "decode: fixed vs target-only", "decode: adaptive vs target-only", "decode: adaptive vs best",
                        "adaptive tau", "adaptive steps speculative : plain (probes)",
                        "time in steps (target-only / fixed / adaptive)"]
                       + (["target-only vs transformers"] if with_hf else []), cells))
    if with_hf:
        log("transformers: " + next(x["name"] for x in rows if x["kind"] == "transformers")
            + ", in static batches of B (`run_transformers`)")
    log("\ntok/s: output tokens over the whole run (prefill, admission and steps); decode: the tokens the "
        "steps made over the time in steps (what adaptive decides), from engine.step_times.")
    out.close()


if __name__ == "__main__":
    main()
