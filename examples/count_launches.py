"""Launches per speculative step, counted on the CPU: where the kernels of a step come from.

A CUDA step's kernel count (bench_cycle's kernels/step) needs the GPU. This counts the same
thing's proxy on the CPU, phase by phase, so a change that adds or removes launches shows
before any GPU run: one step of a tiny random Llama (4 layers) with a random EAGLE-3 head,
batch 1, the default pieces mode, every op counted once as the CUDA step would launch it:

  * an aten op run outside a compiled piece: one launch (views and no-op casts excluded);
  * a compiled piece (`models.fused`, the drafter's and the tree policy's compiled glue):
    one launch (Inductor usually fuses a piece into one or two kernels);
  * a Triton kernel (run by Triton's interpreter here): one launch;
  * RoPE and the K/V write as the CUDA path runs them, one fused kernel per layer and draft
    forward (`PagedKVCache.write_rotated`).

Phases: verify (the target forward), draft.model (the head's forwards), draft.ingest,
draft.policy (the tree policy's loop), draft.compiled (compiled glue), draft (the rest of
propose) and other (tree build, verification, relocation, state advance).

    TRITON_INTERPRET=1 python examples/count_launches.py            # every setup below
    TRITON_INTERPRET=1 python examples/count_launches.py chain-5
    TRITON_INTERPRET=1 python examples/count_launches.py --json     # one JSON line per setup (tests)

Approximate by construction (a GEMM may be two kernels, a compiled piece one to several); use
it for differences, and bench_cycle.py on the GPU for the counts that are claimed.

`--kernels` counts each compiled piece as the kernels it is on the GPU instead of one launch:
every piece call of the step is recorded and compiled as the decoder compiles it, with
Inductor generating its GPU (Triton) code on the CPU (`_piece_kernels.py`, a child process
without the interpreter); the table then lists each piece's kernels per call. `--shape
smollm2` runs a SmolLM2-135M-shaped target (30 layers, random weights) with a 16384-token
draft vocabulary, the shape whose GPU counts the end-to-end logs give (target-only 316,
chain-5 495, tree N=48 567 kernels per step at 32cbac7).

    TRITON_INTERPRET=1 python examples/count_launches.py --kernels --shape smollm2 target-only chain-5
    TRITON_INTERPRET=1 python examples/count_launches.py --combo chain-5     # the pieces with combo kernels
    TRITON_INTERPRET=1 python examples/count_launches.py --names chain-5     # each piece's kernels by name
    TRITON_INTERPRET=1 python examples/count_launches.py --kernels --draft-layers 2 chain-5   # a two-layer head
    TRITON_INTERPRET=1 python examples/count_launches.py --kernels --small-linear target-only  # the few-row kernels

`--small-linear` counts the step with `ExecutionConfig.small_linear` on: its 1-8 row projections
on the few-row kernels, the norms and SwiGLU's activation fused into them (`kernels.fused_linear`).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1: the Triton kernels are counted as the interpreter runs them")

import torch  # noqa: E402
import triton.runtime.interpreter as triton_interpreter  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from _bench_common import random_eagle3_head  # noqa: E402
from bench_cycle import QUICK_TARGET, build_target, head_config  # noqa: E402
from bench_target import TINY  # noqa: E402
from specdec.models import RopeConfig  # noqa: E402
import specdec.models.linear as linear_module  # noqa: E402
from specdec import SamplingParams, SpecConfig  # noqa: E402
from specdec.entrypoints.decoder import SpecDecoder  # noqa: E402
from specdec.models import fused  # noqa: E402
from specdec.testing.kit import references_on_cpu  # noqa: E402

SETUPS = {
    "target-only": SpecConfig(drafter="none"),
    "chain-5": SpecConfig(drafter="eagle3", max_draft_len=5),
    "tree-48": SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=6, topk=8, max_total_draft_tokens=48),
    "tree-60": SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=6, topk=10, max_total_draft_tokens=60),
    # adaptive chain-5's plain steps, forced: the drafter ingests (plain) or is skipped (deferred);
    # a deferred step should launch what target-only's does, a plain one that plus the ingest
    "chain-5-plain": SpecConfig(drafter="eagle3", max_draft_len=5, adaptive=True),
    "chain-5-deferred": SpecConfig(drafter="eagle3", max_draft_len=5, adaptive=True),
    # and the bare one, of a batch whose requests draft nothing (no drafter, no captured states, no path)
    "chain-5-bare": SpecConfig(drafter="eagle3", max_draft_len=5, adaptive=True),
}
# not launches: views, metadata, the custom-op wrappers around Triton kernels (counted as kernels)
NOT_LAUNCHES = {
    "detach", "view", "_unsafe_view", "alias", "t", "transpose", "unsqueeze", "squeeze", "expand", "slice", "select",
    "permute", "split", "split_with_sizes", "as_strided", "reshape", "unbind", "chunk", "lift_fresh", "resolve_conj",
    "resolve_neg", "empty", "empty_like", "empty_strided", "to", "promote_types",
    "kv_write", "rope_kv_write", "paged_attention", "build_tree", "verify_greedy", "verify_target_only", "verify_speculative",
    "relocate_kv", "small_linear", "norm_linear", "rms_norm_linear", "swiglu_linear",
}
# SmolLM2-135M's shape (random weights): the target whose GPU kernel counts the end-to-end logs give
SMOLLM2_SHAPE = dataclasses.replace(
    TINY, vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
    head_dim=64, rope=RopeConfig(theta=100000.0), max_position_embeddings=8192, tie_word_embeddings=True,
    sliding_windows=(),
)
SHAPES = {"tiny": QUICK_TARGET, "smollm2": SMOLLM2_SHAPE}
H200_SMS = 132
DRAFTER_PIECES = ("best_children", "depth_inputs", "ingest_inputs", "ingest_outputs", "tree_of")
POLICY_PIECES = ("_rank", "_score_call", "_next_frontier", "_ranked_call", "_ranked_close", "_finish")


class LaunchCounter(TorchDispatchMode):
    """Counts launches per (phase, op); `phase` is set by the wrappers below."""

    def __init__(self) -> None:
        super().__init__()
        self.phase, self.opaque = "other", 0
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.records: list | None = None  # --kernels: (phase, label, fn, args, kwargs) of every compiled-piece call

    def record(self, label: str, fn, args, kwargs) -> None:
        """Keep a compiled piece's call (its tensors copied: the step goes on mutating some)."""
        if self.records is None or self.opaque:
            return
        copy = lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
        self.opaque += 1  # the copies are not the step's launches
        try:
            args = tuple([copy(y) for y in a] if isinstance(a, (list, tuple)) else copy(a) for a in args)
            self.records.append((self.phase, label, fn, args, {k: copy(v) for k, v in kwargs.items()}))
        finally:
            self.opaque -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.opaque and name not in NOT_LAUNCHES:
            self.counts[self.phase][name] += 1
        return func(*args, **(kwargs or {}))

    def one_launch(self, label: str) -> None:
        self.counts[self.phase][label] += 1

    def wrap(self, owner, attr: str, phase: str, *, opaque: bool = False) -> None:
        """Run `owner.attr` in `phase`; opaque: count it as one launch and nothing inside."""
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            before = self.phase
            self.phase = phase
            if opaque:
                self.record(f"compiled:{attr}", fn, args, kwargs)
                self.one_launch(f"compiled:{attr}")
                self.opaque += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase = before
                if opaque:
                    self.opaque -= 1

        object.__setattr__(owner, attr, wrapped)


def instrument(counter: LaunchCounter) -> None:
    """Triton launches and `models.fused` pieces count one each (their insides not at all)."""
    run = triton_interpreter.InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        if not counter.opaque:  # inside a compiled piece the piece's own count stands (--kernels: its kernels)
            counter.one_launch(f"triton:{getattr(self.fn, '__name__', '?')}")
        counter.opaque += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.opaque -= 1

    triton_interpreter.InterpretedFunction.run = counted_run
    for name, fn in list(fused._FUNCTIONS.items()):
        def piece(*args, _fn=fn, _name=name, **kwargs):
            counter.record(f"piece:{_name}", _fn, args, kwargs)
            counter.one_launch(f"piece:{_name}")
            counter.opaque += 1
            try:
                return _fn(*args, **kwargs)
            finally:
                counter.opaque -= 1

        fused._FUNCTIONS[name] = piece


def count_step(key: str, target, head, counter: LaunchCounter, small: bool = False) -> dict[str, collections.Counter]:
    config = SETUPS[key].replace(max_batch_size=1, max_seq_len=256, compile=False, cuda_graphs=False,
                                 small_linear=small)
    dec = SpecDecoder.from_pretrained(target, None if key == "target-only" else head, config, device="cpu",
                                      dtype=torch.float32)
    engine = dec.engine
    pieces = fused.Pieces(fused._FUNCTIONS, compiled=False)  # the counting pieces
    # attention's key splits (and so its split-KV combine kernel) chosen for the H200's SMs
    engine.runner.cache.num_sms = H200_SMS
    engine._kv_len_bound = lambda b: config.cache.max_seq_len  # a captured step's key bound, not the eager one's
    modules = list(target.model.modules())
    drafter = engine.strategies.drafter if key != "target-only" else None
    if drafter is not None:
        drafter.cache.num_sms = H200_SMS
        modules += list(drafter.model.modules())
        counter.wrap(drafter, "propose", "draft")
        counter.wrap(drafter, "_ingest", "draft.ingest")
        counter.wrap(drafter.policy, "grow", "draft.policy")
        counter.wrap(drafter, "_forward", "draft.model")
        for attr in DRAFTER_PIECES:
            counter.wrap(drafter, attr, "draft.compiled", opaque=True)
        for attr in POLICY_PIECES:  # compiled pieces are functions; a policy's own method is eager glue
            if hasattr(drafter.policy, attr):
                eager = inspect.ismethod(getattr(drafter.policy, attr))
                counter.wrap(drafter.policy, attr, "draft.policy" if eager else "draft.compiled", opaque=not eager)
    for m in modules:
        if hasattr(m, "fused"):
            m.fused = pieces
    counter.wrap(engine.runner, "verify", "verify")
    for step in engine.steps.values():  # the state advance, the tree sizes: one compiled piece each
        counter.wrap(step, "advance", "other", opaque=True)
        counter.wrap(step, "append", "other", opaque=True)
        counter.wrap(step, "sizes", "other", opaque=True)
    counter.wrap(engine.runner.cache, "tree_rows", "verify", opaque=True)  # compiled with compile="auto"
    if config.schedule.adaptive:  # force the plain step due: deferred while the path allows, else ingesting
        engine.adaptive_rule.choose = lambda bucket, running, plain: False
        if key.endswith("-plain"):
            engine.defer_depth = None
    budget = 0 if key.endswith("-bare") else None  # a request that drafts nothing: the bare step
    engine.submit(list(range(1, 40)), SamplingParams(max_new_tokens=20, ignore_eos=True, num_draft_tokens=budget))
    with references_on_cpu("cpu"):  # prefill, then steps up to a steady state, on the kernels' PyTorch references
        kernel_impls(target, drafter, "auto")  # (interpreted, the Triton kernels took ~3/4 of a count's time)
        for _ in range(3):
            engine.run_iteration()
    kernel_impls(target, drafter, "triton")  # the counted step runs the Triton kernels, one launch each
    counter.counts.clear()
    if counter.records is not None:
        counter.records.clear()  # the counted step's piece calls only
    takes = linear_module.use_triton
    if small:  # the few-row kernels as CUDA runs them (off CUDA, models.linear keeps F.linear)
        linear_module.use_triton = lambda impl, x: True
    try:
        with counter:
            engine.step()
    finally:
        linear_module.use_triton = takes
    return dict(counter.counts)


def kernel_impls(target, drafter, impl: str) -> None:
    """The attention (target and head) and RoPE on `impl`: "triton" as the CUDA step runs them, RoPE
    fused into the K/V write ("auto" keeps that kernel off the interpreter), or "auto" (with
    `references_on_cpu`: the PyTorch references)."""
    target.model.attn_impl = target.model.rope_impl = impl
    if drafter is not None:
        drafter.attn_impl = drafter.rope_impl = impl


def piece_kernels(records: list, combo: bool = False, options: tuple[str, ...] = ()) -> list[dict]:
    """Each recorded piece call's GPU kernels (`_piece_kernels.py` in a child process without the
    interpreter): dicts of kernels (None when no code was generated) and names."""
    rows = []
    for _, _, fn, args, kwargs in records:
        signature = (fn.__module__, fn.__qualname__, tuple(
            (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a) for a in args))
        rows.append((fn.__module__, fn.__qualname__, args, kwargs, repr(signature)))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "records.pt"
        torch.save(rows, path)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = [sys.executable, str(Path(__file__).with_name("_piece_kernels.py")), str(path)] + (["--combo"] if combo else [])
        child += list(options)
        run = subprocess.run(child,
                             env=env, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        sys.exit(f"_piece_kernels.py failed:\n{run.stderr[-3000:]}")
    return [json.loads(line) for line in run.stdout.strip().splitlines()]


def as_kernels(counts: dict, records: list, kernels: list[dict]) -> dict[str, collections.Counter]:
    """The proxy counts with each compiled piece's one launch replaced by its GPU kernels (a piece
    whose code could not be generated keeps its one)."""
    out = {phase: collections.Counter(c) for phase, c in counts.items()}
    for (phase, label, *_), k in zip(records, kernels):
        if k["kernels"] is not None:
            out[phase][label] += k["kernels"] - 1
    return out


def main() -> None:
    torch.set_num_threads(1)
    args = sys.argv[1:]
    as_json = "--json" in args
    names_mode = "--names" in args  # with --kernels: each piece's kernel names
    combo = "--combo" in args  # with --kernels: the pieces compiled with Inductor's combo kernels
    kernels_mode = "--kernels" in args or names_mode or combo
    shape = "tiny"
    if "--shape" in args:
        i = args.index("--shape")
        shape = args[i + 1] if i + 1 < len(args) else ""
        if shape not in SHAPES:
            sys.exit(f"--shape {shape!r} is unknown; allowed: {list(SHAPES)}")
        del args[i : i + 2]
    draft_layers = 1
    if "--draft-layers" in args:
        i = args.index("--draft-layers")
        value = args[i + 1] if i + 1 < len(args) else ""
        if not value.isdigit() or int(value) < 1:
            sys.exit(f"--draft-layers {value!r} is out of range; allowed: an int >= 1")
        draft_layers = int(value)
        del args[i : i + 2]
    options = tuple(a for a in args if "=" in a)  # NAME=VALUE: Inductor options for the pieces (with --kernels)
    kernels_mode = kernels_mode or bool(options)
    small = "--small-linear" in args
    flags = ("--json", "--kernels", "--names", "--combo", "--small-linear")
    keys = [a for a in args if a not in flags and "=" not in a] or list(SETUPS)
    unknown = [k for k in keys if k not in SETUPS]
    if unknown:
        sys.exit(f"unknown setups {unknown}; allowed: {list(SETUPS)}")
    counter = LaunchCounter()
    instrument(counter)
    cfg = SHAPES[shape]
    target = build_target(cfg, torch.device("cpu"), torch.float32)
    head_cfg = head_config(cfg, True)
    if shape == "smollm2":  # the shipped head's draft vocabulary
        head_cfg = dataclasses.replace(head_cfg, draft_vocab_size=16384, capture_layers=(1, 14, 26))
    head_cfg = dataclasses.replace(head_cfg, num_layers=draft_layers)
    head = random_eagle3_head(head_cfg, device=torch.device("cpu"), dtype=torch.float32)
    unit = "GPU kernels (compiled pieces as Inductor generates them)" if kernels_mode else "launches"
    if combo:
        unit = "GPU kernels (compiled pieces as Inductor generates them, with combo kernels)"
    for key in keys:
        counter.records = [] if kernels_mode else None
        counts = count_step(key, target, head, counter, small)
        if kernels_mode:
            per_call = piece_kernels(counter.records, combo, options)
            counts = as_kernels(counts, counter.records, per_call)
        total = sum(sum(c.values()) for c in counts.values())
        if as_json:
            print(json.dumps(dict(setup=key, total=total, phases={p: sum(c.values()) for p, c in counts.items()})))
            continue
        layers = ("" if draft_layers == 1 else f", {draft_layers} draft layers") + (", small_linear" if small else "")
        print(f"{key}: {total} {unit} per step ({shape} target{layers}, batch 1, CPU proxy)")
        for phase, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
            top = ", ".join(f"{op} {n}" for op, n in c.most_common(14))
            print(f"  {phase:15s} {sum(c.values()):4d}  {top}")
        if kernels_mode:
            pieces = collections.defaultdict(list)
            for (_, label, *_), k in zip(counter.records, per_call):
                pieces[label].append(k["kernels"])
            print("  kernels per call: " + ", ".join(f"{label} {sorted(set(ks), key=str)}" for label, ks in pieces.items()))
            if names_mode:
                shown = set()
                for (_, label, *_), k in zip(counter.records, per_call):
                    seen = (label, tuple(k["names"] or ()))
                    if seen not in shown:  # each distinct kernel list of a piece once
                        shown.add(seen)
                        print(f"    {label}: {k['names']}")


if __name__ == "__main__":
    main()
