"""End-to-end benchmark: specdec against transformers on SmolLM2-135M-Instruct, same prompts, same tokens.

Every setup generates exactly `--new-tokens` greedy tokens (default 128; specdec with
`ignore_eos=True`, transformers with no EOS) for the first `--num-prompts` shipped held-out
prompts (default 20), at batch 1 (latency: one prompt per call) and batch 8 (throughput: 8
prompts per call), side by side in one run:

- specdec: target-only (`drafter="none"`), eagle3 chain D=5, eagle3 dynamic tree D=6 K=8
  N=48, mtp chain D=5, ngram chain D=8 (the shipped SmolLM2 heads). Each decoder is built
  once (max_batch_size = the largest batch size; smaller batches run in its smaller
  buckets), `warmup()`ed (its seconds are reported), then timed; with `--baseline-eagle3
  FOLDER`, the eagle3 chain and tree again with that head (e.g. the head a retraining
  replaced: `git show OLD:src/specdec/assets/heads/smollm2-eagle3/...`), old and new side by side;
- transformers `generate`: eager; static cache + `torch.compile` (the documented recipe,
  warmed up before timing); prompt lookup (`prompt_lookup_num_tokens=10`, batch 1 only:
  transformers' assisted generation refuses larger batches).

tok/s = generated tokens / wall-clock seconds of the generate calls (CUDA-synced). tau =
tokens per target forward after prefill. "identical" counts prompts whose tokens equal
specdec target-only's at the same batch size (exact in float32; in bfloat16 tree-verify and
decode forwards round differently, so a few prompts may diverge).

Step cost, beside tok/s (issue 20):

- R = tau / (speedup over specdec target-only at the same batch, same run): what one step of
  the setup costs in target-only steps, as its tok/s implies (1.00 for target-only; `-` where
  there is no tau or no target-only row). A setup is faster than target-only iff tau > R.
- prefill ms/call, ms/step, step R: each timed generate call is timed again for its first
  token alone (`max_new_tokens=1`: prefill, the first draw, the request's setup); ms/step is
  the rest of the call's time over its engine steps, and step R that over target-only's: the
  step's own cost with prefill taken out (R above includes it).
- kernels/step: CUDA kernels launched per engine step, counted with torch.profiler (CUPTI
  kernel records; memcpys and memsets are not counted) over `--kernel-steps` (default 4)
  steady-state `engine.step()` calls of the row's batch size, after every setup has been
  timed (the profiler may leave CUPTI attached and slow what follows, so it never runs
  before a timed run; each specdec decoder is kept until then). With CUDA graphs a step is
  one graph launch, and CUPTI reports each kernel node of the replayed graph, so the graph's
  kernels are counted; were they missing from the trace, the step is profiled eagerly
  instead (`time_phases`) and the JSON line's "kernels_how" says so. `-` on the CPU (no
  claim is made there) and for transformers rows.

Prompt sets: by default the shipped held-out prompts (code prompts as raw text, chat prompts
through the target's chat template). `--prompts FILE` measures any other set:

- FILE.json: a JSON list; FILE.jsonl: one JSON entry per line (specdec's own
  `src/specdec/train/heldout_prompts.jsonl` reads as is);
- any other name: plain text, one raw prompt per line (blank lines skipped).

A JSON entry is a string (raw text, continued without a chat template, like the code
prompts) or an object with one of: "prompt" (a string, raw; with "chat": true it is one user
message through the chat template), "text" with "chat": true/false (the held-out file's
format), or "messages" (a list of {"role", "content"} objects, through the chat template with
the assistant's generation prompt, like the chat prompts); other keys are ignored.
`--num-prompts n` takes the file's first n (default: all of them). A missing file, invalid
JSON, an empty list or an entry of the wrong type stops the run before any model loads, with
the file and the entry named. Without a tokenizer (--quick's tiny target) a prompt's ids are
its UTF-8 bytes modulo the vocabulary.

    python examples/bench_e2e.py                                  # H200: bf16, batch 1 and 8
    python examples/bench_e2e.py --dtype float32 --out e2e.jsonl  # identical outputs must be n/n
    python examples/bench_e2e.py --setups target-only eagle3-tree --tree-shapes 7,6,42 6,6,32   # shapes side by side
    python examples/bench_e2e.py --setups target-only hf-compiled --batch-sizes 1
    python examples/bench_e2e.py --prompts my_prompts.json        # any prompt set (format below)
    python examples/bench_e2e.py --quick                          # CPU smoke run, tiny random models

Setups (`--setups`): target-only eagle3-chain eagle3-tree mtp-chain ngram-chain hf-eager
hf-compiled hf-prompt-lookup; by name only: mtp-tree (D=6 K=8 N=48), the *-combo rows, the *-gemv rows
(`small_linear=True`: `examples/bench_small_linear.py`) and, with
`--baseline-eagle3` / `--baseline-mtp FOLDER`, the *-baseline rows of another head.
"""

from __future__ import annotations

import argparse
import gc
import importlib.resources
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from _bench_common import (JsonLines, PromptFileError, SpecDecoder, TimedRegion, encode_file_prompt, fmt, fmt_count,
                           header, implied_step_cost, kernels_per_step, log, markdown_table, read_prompt_file, sync,
                           warm_up)

from specdec import SamplingParams, SpecConfig
from specdec.errors import ConfigError
from specdec.models import load_target, smollm2_gguf_path
from specdec.policies import shapes
from specdec.train.prompts import encode_prompt, frozen_heldout_prompts


@dataclass(frozen=True)
class SpecSetup:
    name: str
    config: SpecConfig
    head: str | None  # "eagle3" / "mtp": which head folder; None: no model


SPEC_SETUPS = {
    "target-only": SpecSetup("specdec target-only", SpecConfig(drafter="none"), None),
    "eagle3-chain": SpecSetup("specdec eagle3 chain D=5", SpecConfig(drafter="eagle3", max_draft_len=5), "eagle3"),
    "eagle3-tree": SpecSetup(
        "specdec eagle3 tree D=6 K=8 N=48",
        SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=6, topk=8, max_total_draft_tokens=48),
        "eagle3",
    ),
    "mtp-chain": SpecSetup("specdec mtp chain D=5", SpecConfig(drafter="mtp", max_draft_len=5), "mtp"),
    "mtp-tree": SpecSetup(
        "specdec mtp tree D=6 K=8 N=48",
        SpecConfig(drafter="mtp", tree="dynamic", max_draft_len=6, topk=8, max_total_draft_tokens=48),
        "mtp",
    ),
    "ngram-chain": SpecSetup("specdec ngram chain D=8", SpecConfig(drafter="ngram", max_draft_len=8), None),
}
# the chain and tree again with the --baseline-eagle3 / --baseline-mtp head (e.g. the one a retrained head replaced)
BASELINE_SETUPS = {"eagle3": ("eagle3-chain-baseline", "eagle3-tree-baseline"),
                   "mtp": ("mtp-chain-baseline", "mtp-tree-baseline")}
for _drafter, _keys in BASELINE_SETUPS.items():
    for _key in _keys:
        _setup = SPEC_SETUPS[_key.removesuffix("-baseline")]
        SPEC_SETUPS[_key] = SpecSetup(f"{_setup.name}, baseline head", _setup.config, f"{_drafter}-baseline")
# the specdec setups again with the compiled pieces' combo kernels (`ExecutionConfig.combo_kernels`)
for _key in ("target-only", "eagle3-chain", "eagle3-tree"):
    _setup = SPEC_SETUPS[_key]
    SPEC_SETUPS[f"{_key}-combo"] = SpecSetup(f"{_setup.name}, combo kernels", _setup.config.replace(combo_kernels=True),
                                             _setup.head)
# and with the few-row projections through the Triton kernel (`ExecutionConfig.small_linear`)
for _key in ("target-only", "eagle3-chain", "eagle3-tree", "mtp-chain"):
    _setup = SPEC_SETUPS[_key]
    SPEC_SETUPS[f"{_key}-gemv"] = SpecSetup(f"{_setup.name}, small-linear kernel",
                                            _setup.config.replace(small_linear=True), _setup.head)
HF_SETUPS = ("hf-eager", "hf-compiled", "hf-prompt-lookup")
# Run order: the two baselines every speedup is measured against come first, so a run cut at
# its time limit has them; the table lists specdec rows, then transformers rows.
RUN_ORDER = ("target-only", "hf-compiled", "eagle3-chain", "eagle3-tree", "eagle3-chain-baseline",
             "eagle3-tree-baseline", "target-only-combo", "eagle3-chain-combo", "eagle3-tree-combo", "target-only-gemv",
             "eagle3-chain-gemv", "eagle3-tree-gemv", "mtp-chain-gemv", "mtp-chain",
             "mtp-chain-baseline", "mtp-tree", "mtp-tree-baseline", "ngram-chain", "hf-eager", "hf-prompt-lookup")
PROMPT_LOOKUP_TOKENS = 10


def add_tree_shape(text: str) -> str:
    """`--tree-shapes D,K,N`: an EAGLE-3 dynamic tree of depth D, top-K per node and N draft
    tokens as one more setup (key `eagle3-tree-D-K-N`, run after the named setups and listed
    after the specdec rows), so shapes are timed side by side with the default one. The shape
    is checked by the tree policy itself (its error names the allowed range)."""
    try:
        depth, topk, total = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--tree-shapes: {text!r} is not D,K,N (e.g. 7,6,42)") from None
    config = SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=depth, topk=topk, max_total_draft_tokens=total)
    try:
        shapes.builtin(config, samples=False)  # the tree policy's own range checks (the budget in [D, D*K])
    except ConfigError as err:
        raise SystemExit(f"--tree-shapes {text}: {err}") from None
    key = f"eagle3-tree-{depth}-{topk}-{total}"
    SPEC_SETUPS[key] = SpecSetup(f"specdec eagle3 tree D={depth} K={topk} N={total}", config, "eagle3")
    return key


def table_rank(key: str) -> int:
    """Where a setup's rows stand in the table: specdec rows in run order, then the added tree
    shapes in the order given, then transformers' rows."""
    spec = [k for k in RUN_ORDER if k in SPEC_SETUPS] + [k for k in SPEC_SETUPS if k not in RUN_ORDER]
    return (spec + list(HF_SETUPS)).index(key)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CPU, tiny random Llama + random heads, 3 prompts, 16 tokens")
    p.add_argument("--setups", nargs="+", choices=RUN_ORDER, default=None,
                   help="default: all (the eagle3-*-baseline ones only with --baseline-eagle3)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default: 1 8 (quick: 1 2)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="first n held-out prompts (default 20), or of --prompts FILE (default: all)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="measure this prompt set instead (.json list, .jsonl, or text: one prompt per line; see above)")
    p.add_argument("--kernel-steps", type=int, default=4,
                   help="steps profiled per specdec row for kernels/step, after all timing (CUDA only; 0: skip)")
    p.add_argument("--new-tokens", type=int, default=None, help="greedy tokens per prompt (default 128; quick 16)")
    p.add_argument("--hf-eager-prompts", type=int, default=5,
                   help="transformers eager at batch 1 is timed on this many prompts (slow: ~20 ms/token)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 (quick: float32)")
    p.add_argument("--device", default=None, help="default: cuda when available (quick: cpu)")
    p.add_argument("--compile", choices=["auto", "on", "off", "step"], default="auto",
                   help="SpecConfig.compile (step: the whole step as one torch.compile graph per bucket)")
    p.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto", help="SpecConfig.cuda_graphs")
    p.add_argument("--hf-compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile in hf-compiled: auto = on except --quick on CPU")
    p.add_argument("--baseline-eagle3", default=None, metavar="FOLDER",
                   help="another EAGLE-3 head for SmolLM2 (e.g. the shipped one before a retraining): its chain and "
                        "tree rows run beside the shipped head's (setups eagle3-*-baseline, on by default with it)")
    p.add_argument("--baseline-mtp", default=None, metavar="FOLDER",
                   help="another MTP head for SmolLM2: its chain and tree rows run beside the shipped head's "
                        "(setups mtp-chain-baseline, on by default with it, and mtp-tree-baseline, by name)")
    p.add_argument("--out", default=None, help="also write every row as a JSON line to this file")
    p.add_argument("--tree-shapes", nargs="+", default=[], metavar="D,K,N",
                   help="more EAGLE-3 dynamic trees (depth, top-k, draft tokens), timed after the setups named")
    args = p.parse_args()
    folders = {drafter: getattr(args, f"baseline_{drafter}") for drafter in BASELINE_SETUPS}
    if args.setups is None:
        args.setups = [k for k in RUN_ORDER if not k.endswith(("-combo", "-gemv"))  # combo rows and mtp trees: by name
                       and not k.startswith("mtp-tree") and not any(k in keys and folders[d] is None
                                                                    for d, keys in BASELINE_SETUPS.items())]
    for drafter, keys in BASELINE_SETUPS.items():
        flag, folder = f"--baseline-{drafter}", folders[drafter]
        if folder is None:
            if set(keys) & set(args.setups):
                p.error(f"setups {sorted(set(keys) & set(args.setups))} need {flag} FOLDER")
        elif args.quick:
            p.error(f"{flag} is for the SmolLM2 run; --quick builds random heads")
        elif not (Path(folder) / "config.json").is_file():
            p.error(f"{flag} {folder}: no config.json there (a {drafter} head folder)")
    args.setups = list(args.setups) + [k for k in map(add_tree_shape, args.tree_shapes) if k not in args.setups]
    return args


def knob(value: str):
    return {"auto": "auto", "on": True, "off": False, "step": "step"}[value]


# ----------------------------------------------------------------------------- models and prompts
def smollm2_assets() -> tuple[Path, dict[str, Path]]:
    heads = importlib.resources.files("specdec") / "assets/heads"
    return smollm2_gguf_path(), {"eagle3": Path(str(heads / "smollm2-eagle3")), "mtp": Path(str(heads / "smollm2-mtp"))}


def tiny_assets(folder: Path) -> tuple[Path, dict[str, Path]]:
    """A random Llama checkpoint (saved with transformers) and random EAGLE-3 / MTP heads for it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.drafters.eagle3_checkpoint import save_eagle3
    from specdec.drafters.eagle3_model import Eagle3Config, Eagle3Model
    from specdec.drafters.eagle3_model import init_random_ as init_eagle3
    from specdec.drafters.mtp_checkpoint import save_mtp
    from specdec.drafters.mtp_model import MTPConfig, MTPModel
    from specdec.drafters.mtp_model import init_random_ as init_mtp
    from specdec.models import RopeConfig

    V, d, L = 256, 64, 6
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=V, hidden_size=d, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.08,
    )
    AutoModelForCausalLM.from_config(cfg).float().eval().save_pretrained(str(folder / "target"))
    gen = torch.Generator().manual_seed(1)
    shape = dict(hidden_size=d, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 vocab_size=V, rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0))
    eagle3 = init_eagle3(Eagle3Model(Eagle3Config(**shape, draft_vocab_size=V // 2, target_hidden_size=d,
                                                  capture_layers=(1, 3, 4))), gen, std=0.1)
    mtp = init_mtp(MTPModel(MTPConfig(**shape)), gen, std=0.1)
    return folder / "target", {"eagle3": save_eagle3(eagle3, folder / "eagle3"), "mtp": save_mtp(mtp, folder / "mtp")}


def heldout_ids(target, n: int) -> list[list[int]]:
    """The first n shipped held-out prompts (code and chat alternating), chat ones through the template."""
    return [encode_prompt(p, target.tokenizer, target.info.vocab_size) for p in frozen_heldout_prompts(n)]


def random_ids(vocab: int, n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (12 + 8 * i,), generator=gen).tolist() for i in range(n)]


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ----------------------------------------------------------------------------- specdec
def run_specdec(key, target, heads, prompts, batch_sizes, new_tokens, args, dtype, device, max_seq_len):
    """Build one decoder for `key`, warm it up, and time every batch size. Returns one row per
    batch size, and the decoder when kernels per step are to be counted after all timing (else None)."""
    setup = SPEC_SETUPS[key]
    config = setup.config.replace(
        max_batch_size=max(batch_sizes), max_seq_len=max_seq_len, compile=knob(args.compile),
        cuda_graphs=knob(args.cuda_graphs),
    )
    draft = heads[setup.head] if setup.head else None
    t0 = time.perf_counter()
    dec = SpecDecoder.from_pretrained(target, draft, config, device=device, dtype=dtype)
    log(f"[{setup.name}] built in {time.perf_counter() - t0:.1f} s; warming up (buckets {config.batch_buckets}, "
        f"max_seq_len {max_seq_len}, compile={config.execution.compile}, cuda_graphs={config.execution.cuda_graphs})")
    warm_s = warm_up(dec, prompts, batch_sizes, device)
    captured, prefill_graphs = dec.engine.capture_count, dec.engine.prefill_graph_count
    log(f"[{setup.name}] warm-up {warm_s:.1f} s (warmup() and throw-away requests, not timed), {captured} step and "
        f"{prefill_graphs} prefill CUDA graphs captured")
    sampling = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    rows = []
    for B in batch_sizes:
        outputs, steps, seconds = [], [], 0.0
        graphs_before = _dynamo_graphs()
        for chunk in chunks(prompts, B):
            with TimedRegion():  # no collector pause lands in the timing
                sync(device)
                t0 = time.perf_counter()
                results = dec.generate(chunk, sampling)
                sync(device)
                seconds += time.perf_counter() - t0
            outputs += [r.token_ids for r in results]
            steps += [r.stats.steps for r in results]
            log(f"  [{setup.name} | batch {B}] {len(outputs)}/{len(prompts)} prompts, "
                f"{sum(map(len, outputs)) / seconds:.1f} tok/s so far")
        tokens = sum(map(len, outputs))
        prefill_s = time_prefill(dec, prompts, B, device)
        engine_steps = sum(max(steps[i : i + B]) for i in range(0, len(steps), B))  # a call steps its whole batch
        rows.append(dict(
            key=key, name=setup.name, batch=B, prompts=len(prompts), new_tokens=tokens, seconds=seconds,
            tok_s=tokens / seconds, tau=sum(len(o) - 1 for o in outputs) / max(sum(steps), 1),
            warmup_s=warm_s, graphs_after_warmup=captured, graphs_after_run=dec.engine.capture_count,
            prefill_graphs=prefill_graphs,
            dynamo_graphs_during_run=_dynamo_graphs() - graphs_before, outputs=outputs, note="",
            kernels_per_step=None, kernels_how=None, prefill_s=prefill_s, calls=-(-len(prompts) // B),
            engine_steps=engine_steps, step_ms=(seconds - prefill_s) / max(engine_steps, 1) * 1e3,
        ))
    if counts_kernels(args, device):
        return rows, dec  # profiled after every setup's timing (count_kernels_after_timing)
    del dec
    free_device(device)
    return rows, None


def time_prefill(dec, prompts, B: int, device) -> float:
    """Seconds the same generate calls take for their first token alone (prefill, the first
    draw, the request's setup and teardown): what a call spends outside its steps."""
    first_only = SamplingParams(max_new_tokens=1, ignore_eos=True)
    seconds = 0.0
    for chunk in chunks(prompts, B):
        with TimedRegion():
            sync(device)
            t0 = time.perf_counter()
            dec.generate(chunk, first_only)
            sync(device)
            seconds += time.perf_counter() - t0
    return seconds


def counts_kernels(args, device) -> bool:
    return device.type == "cuda" and args.kernel_steps > 0


def free_device(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def count_kernels_after_timing(kept, prompts, new_tokens, args, out) -> None:
    """kernels/step of every kept decoder's rows (their batch sizes), once nothing is timed any more."""
    for rows, dec in kept:
        for r in rows:
            batch = [prompts[i % len(prompts)] for i in range(r["batch"])]
            table: dict = {}
            r["kernels_per_step"], r["kernels_how"] = kernels_per_step(
                dec, batch, max_new_tokens=new_tokens, steps=args.kernel_steps,
                kernel_label=f"{r['name']} batch {r['batch']}", table=table)
            out.write(dict(kind="kernels", key=r["key"], name=r["name"], batch=r["batch"],
                           kernels_per_step=r["kernels_per_step"], kernels_how=r["kernels_how"], kernels=table))
            log(f"KERNELS {r['name']} | batch {r['batch']} | {fmt_count(r['kernels_per_step'])} kernels/step "
                f"({r['kernels_how']})")


def _dynamo_graphs() -> int:
    """Graphs torch.compile has produced so far in this process (a growth while timing = a recompile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ----------------------------------------------------------------------------- transformers
class HFRunner:
    """transformers' greedy `generate` of exactly `new_tokens` tokens (no EOS), left-padded batches."""

    def __init__(self, path: Path, dtype, device, new_tokens: int, pad_id: int):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bars in the log
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
        self.model.generation_config.eos_token_id = None  # never stop early: same token count as specdec
        self.device, self.new_tokens, self.pad_id = device, new_tokens, pad_id

    def generate(self, batch: list[list[int]], **kw) -> list[list[int]]:
        T = max(map(len, batch))
        ids = torch.full((len(batch), T), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(batch), T), dtype=torch.int64)
        for b, p in enumerate(batch):  # left padding: every row's last prompt token at column T - 1
            ids[b, T - len(p) :] = torch.tensor(p)
            mask[b, T - len(p) :] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=self.new_tokens,
                do_sample=False, eos_token_id=None, pad_token_id=self.pad_id, **kw,
            )
        new = out[:, T:].tolist()
        short = [len(o) for o in new if len(o) != self.new_tokens]
        if short:
            raise RuntimeError(f"transformers generated {short} tokens, not {self.new_tokens}: it stopped early")
        return new

    def time(self, name, key, prompts, B, **kw) -> dict:
        outputs, seconds = [], 0.0
        graphs_before = _dynamo_graphs()
        for chunk in chunks(prompts, B):
            with TimedRegion():
                sync(self.device)
                t0 = time.perf_counter()
                outputs += self.generate(chunk, **kw)
                sync(self.device)
                seconds += time.perf_counter() - t0
            log(f"  [{name} | batch {B}] {len(outputs)}/{len(prompts)} prompts, "
                f"{sum(map(len, outputs)) / seconds:.1f} tok/s so far")
        tokens = sum(map(len, outputs))
        return dict(key=key, name=name, batch=B, prompts=len(prompts), new_tokens=tokens, seconds=seconds,
                    tok_s=tokens / seconds, tau=None, warmup_s=None,
                    dynamo_graphs_during_run=_dynamo_graphs() - graphs_before, outputs=outputs, note="",
                    kernels_per_step=None, kernels_how="transformers: not counted")


def run_hf(key, runner: HFRunner, prompts, batch_sizes, args, compile_on: bool) -> tuple[list[dict], list[str]]:
    """Rows of one transformers setup, and the notes its table needs."""
    rows, notes = [], []
    if key == "hf-eager":
        for B in batch_sizes:
            sub = prompts[: args.hf_eager_prompts] if B == 1 else prompts
            name = "transformers eager" + (f" (first {len(sub)} prompts)" if len(sub) < len(prompts) else "")
            rows.append(runner.time(name, key, sub, B))
    elif key == "hf-prompt-lookup":
        name = f"transformers prompt lookup ({PROMPT_LOOKUP_TOKENS})"
        for B in batch_sizes:
            if B != 1:
                notes.append(f"{name}: batch 1 only (transformers' assisted generation refuses batch {B}).")
                continue
            rows.append(runner.time(name, key, prompts, B, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS))
    else:  # hf-compiled: the documented recipe, per batch size warmed up before timing
        model = runner.model
        model.generation_config.cache_implementation = "static"
        if compile_on:
            # transformers' own recipe: with a static cache, `generate` compiles the forward itself
            # (fullgraph, mode="reduce-overhead": CUDA graphs) and marks each CUDA-graph step; a
            # hand-wrapped `model.forward = torch.compile(...)` fails inside generate ("accessing
            # tensor output of CUDAGraphs that has been overwritten", seen on the H200)
            from transformers import CompileConfig

            model.generation_config.compile_config = CompileConfig(fullgraph=True, mode="reduce-overhead")
            name = "transformers static cache + torch.compile"
        else:
            model.generation_config.disable_compile = True
            name = "transformers static cache (torch.compile skipped on CPU)"
            notes.append(f"{name}: --quick on CPU skips the compile; the speedup column compares with this row.")
        by_len = sorted(prompts, key=len)
        for B in batch_sizes:
            # Every batch size the timed calls will see (a last, smaller chunk too): the longest
            # prompts first (they size the static cache), then the shortest (a second prompt length).
            sizes = sorted({len(c) for c in chunks(prompts, B)}, reverse=True)
            warm = [w for n in sizes for w in (by_len[-n:], by_len[:n])]
            t0 = time.perf_counter()
            for batch in warm:
                runner.generate(batch)
            sync(runner.device)
            log(f"[{name}] batch {B}: warmup on {len(warm)} generate calls (longest and shortest prompts, "
                f"batch {sizes}) {time.perf_counter() - t0:.1f} s")
            row = runner.time(name, key, prompts, B)
            row["warmup_s"] = time.perf_counter() - t0 - row["seconds"]
            rows.append(row)
        notes.append(
            f"{name}: `generation_config.cache_implementation=\"static\"`"
            + (", generate's automatic compile (`CompileConfig(fullgraph=True, mode=\"reduce-overhead\")`)"
               if compile_on else "")
            + "; warmed up before timing, for each batch size a timed call sees, on two generate calls (the longest "
            "prompts, then the shortest), so compilation and the dynamic-shape recompile stay out of the timing; "
            "torch.compile graphs "
            "made while timing: " + ", ".join(f"batch {r['batch']}: {r['dynamo_graphs_during_run']}" for r in rows)
            + "."
        )
    return rows, notes


# ----------------------------------------------------------------------------- report
def fill_comparisons(rows: list[dict]) -> None:
    """Speedups over specdec target-only and transformers compiled, R (the step cost in target-only
    steps: tau / speedup over target-only), and outputs identical to target-only."""
    for r in rows:
        base = next((x for x in rows if x["key"] == "target-only" and x["batch"] == r["batch"]), None)
        hf = next((x for x in rows if x["key"] == "hf-compiled" and x["batch"] == r["batch"]), None)
        r["speedup_vs_target_only"] = r["tok_s"] / base["tok_s"] if base else None
        r["speedup_vs_hf_compiled"] = r["tok_s"] / hf["tok_s"] if hf else None
        r["R"] = implied_step_cost(r["tau"], r["speedup_vs_target_only"])
        r["step_R"] = r["step_ms"] / base["step_ms"] if base and r.get("step_ms") and base.get("step_ms") else None
        r["identical"] = None
        if base is not None:  # r may cover the first few prompts only (transformers eager)
            r["identical"] = sum(a == b for a, b in zip(r["outputs"], base["outputs"]))


def table(rows: list[dict]) -> str:
    cols = ["setup", "batch", "tok/s", "kernels/step", "R", "tau", "prefill ms/call", "ms/step", "step R",
            "vs specdec target-only", "vs transformers compiled", "identical to target-only"]
    order = sorted(rows, key=lambda r: (r["batch"], table_rank(r["key"])))
    cells = [[
        r["name"], r["batch"], fmt(r["tok_s"], ".1f"), fmt_count(r.get("kernels_per_step")), fmt(r.get("R")),
        fmt(r["tau"]), fmt(r["prefill_s"] / r["calls"] * 1e3 if r.get("prefill_s") is not None else None, ".1f"),
        fmt(r.get("step_ms"), ".3f"), fmt(r.get("step_R")),
        fmt(r["speedup_vs_target_only"], ".2f", suffix="x"), fmt(r["speedup_vs_hf_compiled"], ".2f", suffix="x"),
        "-" if r["identical"] is None else f"{r['identical']}/{len(r['outputs'])} prompts",
    ] for r in order]
    return markdown_table(cols, cells)


def main() -> None:
    args = parse_args()
    quick = args.quick
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not quick else "cpu"))
    dtype = getattr(torch, args.dtype or ("float32" if quick else "bfloat16"))
    batch_sizes = args.batch_sizes or ([1, 2] if quick else [1, 8])
    file_prompts = None
    if args.prompts:  # read and checked before any model loads
        try:
            file_prompts = read_prompt_file(args.prompts)
        except PromptFileError as err:
            raise SystemExit(f"bench_e2e.py --prompts: {err}") from None
        if args.num_prompts is not None and not 1 <= args.num_prompts <= len(file_prompts):
            raise SystemExit(f"bench_e2e.py: --num-prompts {args.num_prompts}, but prompt file {args.prompts!r} "
                             f"holds {len(file_prompts)} prompts; allowed: 1..{len(file_prompts)}")
        file_prompts = file_prompts[: args.num_prompts]
    n_prompts = len(file_prompts) if file_prompts else args.num_prompts or (3 if quick else 20)
    new_tokens = args.new_tokens or (16 if quick else 128)
    if quick:
        torch.set_num_threads(1)  # tiny matmuls: more threads only contend on a shared box
    hf_compile = args.hf_compile == "on" or (args.hf_compile == "auto" and not (quick and device.type == "cpu"))
    setups = [k for k in RUN_ORDER if k in args.setups] + [k for k in args.setups if k not in RUN_ORDER]

    tmp = tempfile.TemporaryDirectory(prefix="bench_e2e_")
    target_path, heads = tiny_assets(Path(tmp.name)) if quick else smollm2_assets()
    for drafter in BASELINE_SETUPS:
        if (folder := getattr(args, f"baseline_{drafter}")) is not None:
            heads[f"{drafter}-baseline"] = Path(folder)
    t0 = time.perf_counter()
    target = load_target(target_path, device=device, dtype=dtype)
    if file_prompts:
        try:
            prompts = [encode_file_prompt(p, target.tokenizer, target.info.vocab_size,
                                          where=f"prompt file {args.prompts!r}, prompt {i}: ")
                       for i, p in enumerate(file_prompts)]
        except PromptFileError as err:
            raise SystemExit(f"bench_e2e.py --prompts: {err}") from None
        chat = sum(p.is_chat for p in file_prompts)
        prompt_set = f"{args.prompts} ({len(prompts) - chat} raw, {chat} chat)"
    elif quick:
        prompts, prompt_set = random_ids(target.info.vocab_size, n_prompts), "random ids"
    else:
        prompts, prompt_set = heldout_ids(target, n_prompts), "shipped held-out"
    lengths = sorted(map(len, prompts))
    what = "tiny random Llama + random heads" if quick else "SmolLM2-135M-Instruct + shipped heads"
    log(f"target: {what}, {target.info.num_layers} layers, loaded in {time.perf_counter() - t0:.1f} s; "
        f"{len(prompts)} prompts ({prompt_set}) of {lengths[0]}..{lengths[-1]} tokens, {new_tokens} new tokens each")
    head_line = header(device, dtype, " / ".join(map(str, batch_sizes)), prompts=len(prompts), new_tokens=new_tokens,
                       prompt_set=prompt_set)
    log(head_line)
    out = JsonLines(args.out, dict(header=head_line, quick=quick, batch_sizes=batch_sizes, new_tokens=new_tokens))

    widest = max(SPEC_SETUPS[k].config.shape.num_tree_slots for k in setups if k in SPEC_SETUPS) if any(
        k in SPEC_SETUPS for k in setups) else 1
    max_seq_len = -(-(lengths[-1] + new_tokens + widest + 1) // 128) * 128
    pad_id = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    pad_id = pad_id if pad_id is not None else 0
    rows, notes, runner, kept = [], [], None, []
    for key in setups:
        try:
            if key in SPEC_SETUPS:
                new, dec = run_specdec(key, target, heads, prompts, batch_sizes, new_tokens, args, dtype, device,
                                       max_seq_len)
                if dec is not None:
                    kept.append((new, dec))
            else:
                if runner is None:
                    runner = HFRunner(target.path, dtype, device, new_tokens, pad_id)
                new, extra = run_hf(key, runner, prompts, batch_sizes, args, hf_compile)
                notes += extra
        except Exception as err:  # one broken setup must not cost the others' rows
            log(f"SETUP {key} FAILED: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
            notes.append(f"{key}: failed ({type(err).__name__}: {str(err).splitlines()[0][:200]})")
            new = []
        if key == "hf-compiled":  # later transformers setups get a fresh, uncompiled model
            runner = None
        for r in new:
            rows.append(r)
            fill_comparisons(rows)
            out.write({k: v for k, v in r.items() if k != "outputs"} | {"kind": "row"})
            log(f"ROW {r['name']} | batch {r['batch']} | {r['tok_s']:.1f} tok/s | R {fmt(r['R'])} | tau {fmt(r['tau'])} "
                f"| vs target-only {fmt(r['speedup_vs_target_only'])} | vs hf compiled {fmt(r['speedup_vs_hf_compiled'])}")
    if kept:
        runner = None  # transformers' model is not needed any more
        log(f"counting kernels per step ({args.kernel_steps} steps per row; after all timing: the profiler may slow "
            "what follows it)")
        count_kernels_after_timing(kept, prompts, new_tokens, args, out)
        kept.clear()
        free_device(device)

    spec_rows = [r for r in rows if r["key"] in SPEC_SETUPS]
    if spec_rows:
        grew = [f"{r['name']} (batch {r['batch']}): {r['graphs_after_warmup']} -> {r['graphs_after_run']}"
                for r in spec_rows if r["graphs_after_run"] != r["graphs_after_warmup"]]
        recompiled = [f"{r['name']} (batch {r['batch']}): {r['dynamo_graphs_during_run']}"
                      for r in spec_rows if r["dynamo_graphs_during_run"]]
        warm = {r["name"]: (r["warmup_s"], r.get("prefill_graphs", 0)) for r in spec_rows}
        notes.insert(0, "specdec `warmup()` seconds (prefill graphs captured): "
                     + ", ".join(f"{n} {s:.1f} ({g})" for n, (s, g) in warm.items()) + ".")
        notes.insert(1, "CUDA graphs captured after warmup: " + ("none" if not grew else "; ".join(grew))
                     + "; torch.compile graphs made while timing: " + ("; ".join(recompiled) or "none") + ".")
    if device.type == "cuda" and args.kernel_steps > 0:
        hows = sorted({r["kernels_how"] for r in spec_rows if r.get("kernels_how")})
        notes.append("kernels/step: CUDA kernels per engine step (torch.profiler kernel records, memcpy and memset "
                     "excluded), profiled after all timing at the row's batch size; how: " + ("; ".join(hows) or "-")
                     + ".")
    else:
        notes.append("kernels/step: counted on CUDA only (`-` here" + (", --kernel-steps 0" if args.kernel_steps <= 0
                                                                         else "") + ").")
    notes.append("R = tau / speedup over specdec target-only (same batch): a step's cost in target-only steps as "
                 "tok/s implies it (prefill and the host's share included); speculation gains iff tau > R.")
    notes.append("prefill ms/call: the same generate calls timed for their first token alone (prefill, first draw, "
                 "request setup); ms/step = (call seconds - that) / engine steps; step R = ms/step over target-only's: "
                 "the step's own cost, prefill excluded.")
    notes.append(
        "identical: prompts whose new tokens equal specdec target-only's at the same batch size"
        + (" (float32: every specdec row must be n/n)." if dtype == torch.float32 else
           ". In bfloat16 tree-verify and decode forwards round differently (different kernels and reduction "
           "orders), so greedy argmax ties can break differently and a few prompts may diverge; run --dtype float32 "
           "for the exact check.")
    )
    if quick:
        notes.append("--quick: tiny random models on CPU, random prompt ids; the figures only show the script runs.")
    print()
    log(head_line)
    print()
    log(table(rows))
    print()
    for n in notes:
        log(f"- {n}")
    out.write({"kind": "notes", "notes": notes})
    out.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
