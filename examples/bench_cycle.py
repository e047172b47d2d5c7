"""Cycle-cost benchmark: ms per speculative step of a Llama-3.1-8B-shaped target through `SpecDecoder`.

The target (`bench_target.LLAMA31_8B`) has random bf16 weights made directly on the GPU and
the draft head is a random EAGLE-3 head of the matching shape (hidden 4096, 32/8 heads,
head_dim 128, draft vocabulary 32000, capture layers (1, 15, 28)), so nothing is read from
disk and acceptance is ~nil (tau ~1): the figures are the cost of a step, not its yield.
At batch 1, for every context (`--contexts`, default 1024 4096) a random prompt of that many
tokens is prefilled and `--steps` (default 64) steps follow; ms/step is the median host
wall-clock between consecutive steps' token hand-offs (an engine observer; the first
`--skip` intervals are dropped). Setups: target-only, eagle3 chain 3, chain 5 and a dynamic
tree of 60 nodes (D=6, K=10). Each setup gets one decoder (max_seq_len holds the largest
context; attention splits keys by each row's real length, so one CUDA graph serves every
context), `warmup()`ed before its first context; `--decoder-per-context` builds one per
context instead, sized to it.

R = step ms / target-only step ms at the same context (the cycle cost of speculation; the
same R as bench_e2e's tau / speedup, measured here directly: a step of tau tokens in ms runs
tau * target-only ms / ms times target-only's tok/s). kernels/step: CUDA kernels launched per
step (`_bench_common.kernels_per_step`: torch.profiler CUPTI kernel records over
`--kernel-steps` (default 4) steady-state `engine.step()` calls at the row's context, memcpys
and memsets excluded; with CUDA graphs each replayed graph's kernel nodes are counted, and
were they missing from the trace the step is profiled eagerly and the JSON line's
"kernels_how" says so). They are counted after every setup has been timed (the profiler may
leave CUPTI attached and slow what follows), so each decoder is kept until then; `-` on the
CPU (--quick), where nothing is claimed.
Bandwidth: a target-only step must read every weight once (the input embedding table
excepted: one row per token is read) and the context's KV (2 * layers * kv_heads *
head_dim * context * bytes); that over the step time, against the device-to-device copy
bandwidth measured in the same run (a large `copy_`, read + write bytes, median of several).

    python examples/bench_cycle.py                      # H200: contexts 1024 4096, 64 steps
    python examples/bench_cycle.py --setups target-only chain-3 --contexts 1024
    python examples/bench_cycle.py --quick              # CPU smoke run: tiny shape, contexts 32 64, 8 steps
    python examples/bench_cycle.py --compile auto step  # pieces vs the whole step as one compiled graph
    python examples/bench_cycle.py --compile auto combo # the pieces with Inductor's combo kernels too
    python examples/bench_cycle.py --compile auto gemv  # and with the few-row projections' Triton kernel

With several `--compile` values every setup runs under each, side by side in one run, and R
is taken against the first value's target-only step.

With --out, a "row" JSON line is written as each row is timed, then a "kernels" line per row
(key, name, context, kernels_per_step, kernels_how, and kernels: every kernel name -> [device ms,
launches] per step) once the kernels are counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time

import torch
from _bench_common import (JsonLines, SpecDecoder, StepTimer, TimedRegion, fmt, fmt_count, header, kernels_per_step,
                           log, markdown_table, random_eagle3_head, sync, warm_up)
from bench_target import LLAMA31_8B, TINY

from specdec import SamplingParams, SpecConfig
from specdec.drafters.eagle3_model import Eagle3Config
from specdec.models import DecoderLM, ModelConfig
from specdec.models.loader import Target
from specdec.strategies import TargetInfo

SETUPS = {
    "target-only": ("target-only", SpecConfig(drafter="none")),
    "chain-3": ("eagle3 chain 3", SpecConfig(drafter="eagle3", max_draft_len=3)),
    "chain-5": ("eagle3 chain 5", SpecConfig(drafter="eagle3", max_draft_len=5)),
    "tree-60": (
        "eagle3 tree N=60 (D=6 K=10)",
        SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=6, topk=10, max_total_draft_tokens=60),
    ),
}
QUICK_TARGET = dataclasses.replace(TINY, num_layers=4, sliding_windows=())  # EAGLE-3: 3 distinct capture layers
QUICK_CAPTURE = (1, 2, 3)
LLAMA_CAPTURE = (1, 15, 28)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", action="store_true", help="print each setup's top CUDA kernels (first context)")
    p.add_argument("--quick", action="store_true", help="CPU, tiny shape, contexts 32 64, 8 steps")
    p.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS))
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="prompt tokens (default 1024 4096)")
    p.add_argument("--steps", type=int, default=None, help="steps timed per context (default 64; quick 8)")
    p.add_argument("--skip", type=int, default=None, help="first step intervals dropped (default 4; quick 2)")
    p.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (default 1024 MiB; quick 64)")
    p.add_argument("--compile", choices=["auto", "on", "off", "step", "combo", "gemv"], nargs="+", default=["auto"],
                   help="SpecConfig.compile; several values time every setup under each, side by side, R against "
                        "the first value's target-only (step: the whole step as one torch.compile graph per bucket; "
                        "combo: the pieces with combo_kernels=True; gemv: with small_linear=True, the few-row "
                        "projections through the Triton kernel)")
    p.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto", help="SpecConfig.cuda_graphs")
    p.add_argument("--decoder-per-context", action="store_true",
                   help="build (and warm up) a decoder per context, sized to it (default: one per setup)")
    p.add_argument("--kernel-steps", type=int, default=4,
                   help="steps profiled per row for kernels/step, after all timing (CUDA only; 0: skip)")
    p.add_argument("--out", default=None, help="also write every row as a JSON line to this file")
    return p.parse_args()


def knob(value: str):
    return {"auto": "auto", "on": True, "off": False, "step": "step", "combo": "auto", "gemv": "auto"}[value]


def copy_bandwidth(device: torch.device, mib: int, iters: int = 10) -> float:
    """Device-to-device `copy_` bandwidth in GB/s (bytes read + bytes written), median of `iters`."""
    n = mib << 20
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(device)
    seconds = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            seconds.append(time.perf_counter() - t0)
    del src, dst
    return 2 * n / statistics.median(seconds) / 1e9


def build_target(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> Target:
    """`DecoderLM` with random weights made on `device` (as bench_target.py), wrapped as a tokenizer-less Target."""
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DecoderLM(cfg).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(default)
    info = TargetInfo(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size,
                      model_type=cfg.model_type, eos_token_ids=(), model=model)
    return Target(model=model, info=info, tokenizer=None, hf_config=None, config=cfg, path=None)


def head_config(cfg: ModelConfig, quick: bool) -> Eagle3Config:
    """An EAGLE-3 head shaped for `cfg` (the published Llama-3.1-8B head's shape on the full model)."""
    return Eagle3Config(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
        draft_vocab_size=cfg.vocab_size // 2 if quick else 32000, target_hidden_size=cfg.hidden_size,
        rms_norm_eps=cfg.rms_norm_eps, rope=cfg.rope, max_position_embeddings=cfg.max_position_embeddings,
        capture_layers=QUICK_CAPTURE if quick else LLAMA_CAPTURE,
    )


def weight_bytes(model: torch.nn.Module, cfg: ModelConfig) -> int:
    """Bytes of every parameter read by one decode step: all of them (tied ones once) but the input embedding."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() skips tied duplicates
    embed = model.embed_tokens.weight
    return total if cfg.tie_word_embeddings else total - embed.numel() * embed.element_size()


def build_decoder(key, name, base: SpecConfig, target, head, longest: int, steps: int, args, device, dtype, warm_prompts,
                  compile_mode: str = "auto"):
    """A batch-1 decoder whose max_seq_len holds `longest` prompt tokens and `steps` steps, warmed up
    (`warm_up`: compile, capture, and throw-away requests on `warm_prompts`)."""
    N = base.shape.num_tree_slots
    max_seq_len = -(-(longest + steps + 1 + N * (1 + base.schedule.kv_lookahead_steps)) // 128) * 128
    config = base.replace(max_batch_size=1, max_seq_len=max_seq_len, compile=knob(compile_mode),
                          cuda_graphs=knob(args.cuda_graphs), combo_kernels=compile_mode == "combo",
                          small_linear=compile_mode == "gemv")
    t0 = time.perf_counter()
    draft = head if key != "target-only" else None
    dec = SpecDecoder.from_pretrained(target, draft, config, device=device, dtype=dtype)
    log(f"[{name}] built in {time.perf_counter() - t0:.1f} s; warming up (max_seq_len {max_seq_len}, "
        f"compile={config.execution.compile}, cuda_graphs={config.execution.cuda_graphs})")
    warm_s = warm_up(dec, warm_prompts, [1], device)
    timer = StepTimer()
    dec.engine.observers.append(timer)
    built = dict(warmup_s=warm_s, max_seq_len=max_seq_len, graphs_after_warmup=dec.engine.capture_count)
    return dec, timer, built


def time_steps(dec, timer: StepTimer, prompt: list[int], steps: int, skip: int) -> dict:
    """Prefill `prompt`, run `steps` steps (the prefill emits the first token) and time them."""
    timer.reset()
    with TimedRegion():  # no collector pause lands between two step stamps
        result = dec.generate([prompt], SamplingParams(max_new_tokens=steps + 1, ignore_eos=True))[0]
    ms, used = timer.step_ms(skip)
    return dict(context=len(prompt), ms=ms, intervals=used, steps=result.stats.steps,
                tau=result.stats.mean_accept_length, graphs_after_run=dec.engine.capture_count)


def profile_steps(dec, prompt: list[int], name: str, steps: int = 6, rows: int = 14) -> None:
    """Kernel time of a few steps by CUDA kernel (torch.profiler; graph replays included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dec.generate([prompt], SamplingParams(max_new_tokens=steps + 1, ignore_eos=True))
        sync(torch.device("cuda"))
    events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    total = sum(getattr(e, "self_device_time_total", 0) for e in events)
    log(f"PROFILE {name}: {len(events)} kernel kinds, {total / 1e3 / steps:.3f} ms of kernel time per step "
        f"(prefill included in the total)")
    top = sorted(events, key=lambda e: -getattr(e, "self_device_time_total", 0))[:rows]
    for e in top:
        t = getattr(e, "self_device_time_total", 0)
        log(f"PROFILE   {t / 1e3 / steps:8.3f} ms/step {e.count / steps:7.1f} calls/step  {e.key[:90]}")


def free(device: torch.device) -> None:
    gc.collect()  # the dropped decoder's KV cache and CUDA graph pool
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    args = parse_args()
    quick = args.quick
    device = torch.device("cuda" if torch.cuda.is_available() and not quick else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    contexts = args.contexts or ([32, 64] if quick else [1024, 4096])
    steps = args.steps or (8 if quick else 64)
    skip = args.skip if args.skip is not None else (2 if quick else 4)
    cfg = QUICK_TARGET if quick else LLAMA31_8B
    if quick:
        torch.set_num_threads(1)  # tiny matmuls: more threads only contend on a shared box
    setups = [k for k in SETUPS if k in args.setups]

    copy_gbs = copy_bandwidth(device, args.copy_mib or (64 if quick else 1024))
    log(f"copy bandwidth (device-to-device copy_, read + write): {copy_gbs:.3g} GB/s")
    t0 = time.perf_counter()
    target = build_target(cfg, device, dtype)
    needs_head = any(SETUPS[k][1].drafter == "eagle3" for k in setups)
    head = random_eagle3_head(head_config(cfg, quick), device=device, dtype=dtype) if needs_head else None
    w_bytes = weight_bytes(target.model, cfg)
    shape = "tiny Llama" if quick else "Llama-3.1-8B shape"
    log(f"target: {shape}, {cfg.num_layers} layers, d {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads, "
        f"vocab {cfg.vocab_size}, random {str(dtype).removeprefix('torch.')} weights on {device} "
        f"({w_bytes / 1e9:.2f} GB read per step without the embedding table; {time.perf_counter() - t0:.1f} s)")
    head_line = header(device, dtype, "1", target=shape + " (random weights)", steps=steps, contexts=contexts)
    log(head_line)
    out = JsonLines(args.out, dict(header=head_line, quick=quick, copy_gbs=copy_gbs, weight_bytes=w_bytes))

    gen = torch.Generator().manual_seed(0)
    prompts = {c: torch.randint(0, cfg.vocab_size, (c,), generator=gen).tolist() for c in contexts}
    rows, notes = [], []
    count_kernels = device.type == "cuda" and args.kernel_steps > 0
    kept = []  # (row, decoder): kernels per step are counted once nothing is timed any more
    modes = list(dict.fromkeys(args.compile))
    order = [(mode, key) for mode in modes for key in setups]
    for mode, key in order:
        name, base = SETUPS[key]
        if len(modes) > 1:
            name = f"{name} [compile {mode}]"
        dec = None
        for ctx in contexts:
            if dec is None:  # one decoder for every context, or one per context (--decoder-per-context)
                longest = ctx if args.decoder_per_context else max(contexts)
                warm = [prompts[c] for c in contexts if c <= longest]
                dec, timer, built = build_decoder(key, name, base, target, head, longest, steps, args, device, dtype, warm,
                                                  compile_mode=mode)
            row = dict(key=key, name=name, compile=mode, **built, **time_steps(dec, timer, prompts[ctx], steps, skip),
                       kernels_per_step=None, kernels_how=None if count_kernels else "not counted")
            if count_kernels:
                kept.append((row, dec))
            if args.profile and ctx == contexts[0] and device.type == "cuda":
                profile_steps(dec, prompts[ctx], name)
            if args.decoder_per_context:
                dec = None
                free(device)
            base_row = row if (key, mode) == ("target-only", modes[0]) else next(
                (r for r in rows if r["key"] == "target-only" and r["compile"] == modes[0] and r["context"] == ctx),
                None)  # the first mode's target-only: R 1.00
            row["R"] = row["ms"] / base_row["ms"] if base_row else None
            if key == "target-only":
                kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * torch.finfo(dtype).bits // 8
                row |= dict(bytes=w_bytes + kv, kv_bytes=kv, gbs=(w_bytes + kv) / (row["ms"] / 1e3) / 1e9)
                row["copy_fraction"] = row["gbs"] / copy_gbs
            rows.append(row)
            out.write(row | {"kind": "row"})
            log(f"ROW context {ctx} | {name} | {row['ms']:.3f} ms/step (median of {row['intervals']}) | "
                f"R {fmt(row['R'])} | tau {row['tau']:.2f} | warmup {row['warmup_s']:.1f} s | "
                f"CUDA graphs {row['graphs_after_warmup']} -> {row['graphs_after_run']}")
        dec = None
        free(device)

    if kept:
        log(f"counting kernels per step ({args.kernel_steps} steps per row; after all timing: the profiler may slow "
            "what follows it)")
        for row, dec in kept:
            table: dict = {}
            row["kernels_per_step"], row["kernels_how"] = kernels_per_step(
                dec, [prompts[row["context"]]], max_new_tokens=steps + 1, steps=args.kernel_steps,
                kernel_label=f"{row['name']} context {row['context']}", table=table)
            out.write(dict(kind="kernels", key=row["key"], name=row["name"], context=row["context"],
                           kernels_per_step=row["kernels_per_step"], kernels_how=row["kernels_how"], kernels=table))
            log(f"KERNELS context {row['context']} | {row['name']} | {fmt_count(row['kernels_per_step'])} kernels/step "
                f"({row['kernels_how']})")
        kept.clear()
        dec = None
        free(device)

    cells = [[r["context"], r["name"], fmt(r["ms"], ".3f"), fmt_count(r["kernels_per_step"]), fmt(r["R"]), fmt(r["tau"])]
             for r in sorted(rows, key=lambda r: (r["context"], order.index((r["compile"], r["key"]))))]
    print()
    log(head_line)
    print()
    log(markdown_table(["context", "setup", "ms/step", "kernels/step", "R", "tau"], cells))
    print()
    for r in (r for r in rows if r["key"] == "target-only"):
        log(f"- {r['name']} at context {r['context']}: {r['gbs']:.3g} GB/s ({r['bytes'] / 1e9:.3g} GB: weights "
            f"{w_bytes / 1e9:.3g} + KV {r['kv_bytes'] / 1e9:.3g}, in {r['ms']:.3f} ms) = "
            f"{100 * r['copy_fraction']:.0f}% of the measured copy bandwidth {copy_gbs:.3g} GB/s")
    warmups = dict.fromkeys(f"{r['name']} (max_seq_len {r['max_seq_len']}) {r['warmup_s']:.1f}" for r in rows)
    notes.append("warm-up seconds (warmup() and throw-away requests, not timed): " + ", ".join(warmups))
    grew = [f"{r['name']} @ {r['context']}" for r in rows if r["graphs_after_run"] != r["graphs_after_warmup"]]
    notes.append("CUDA graphs captured after warmup: " + (", ".join(grew) if grew else "none"))
    notes.append("random weights and head: tau ~1 (drafts are rejected), so R is the pure cost of a speculative step")
    if count_kernels:
        hows = sorted({r["kernels_how"] for r in rows if r.get("kernels_how")})
        notes.append("kernels/step: CUDA kernels per step (torch.profiler kernel records, memcpy and memset excluded), "
                     "profiled after all timing; how: " + ("; ".join(hows) or "-"))
    else:
        notes.append("kernels/step: counted on CUDA only (`-` here" + (", --kernel-steps 0" if args.kernel_steps <= 0
                                                                         else "") + ")")
    if quick:
        notes.append("--quick: tiny shape on CPU; the figures only show the script runs")
    for n in notes:
        log(f"- {n}")
    out.write({"kind": "notes", "notes": notes, "copy_gbs": copy_gbs})
    out.close()


if __name__ == "__main__":
    main()
