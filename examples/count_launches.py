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

Approximate by construction (a GEMM may be two kernels, a compiled piece one to three); use
it for differences, and bench_cycle.py on the GPU for the counts that are claimed.
"""

from __future__ import annotations

import collections
import os
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("run with TRITON_INTERPRET=1: the Triton kernels are counted as the interpreter runs them")

import torch  # noqa: E402
import triton.runtime.interpreter as triton_interpreter  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from _bench_common import random_eagle3_head  # noqa: E402
from bench_cycle import QUICK_TARGET, build_target, head_config  # noqa: E402
from specdec import SamplingParams, SpecConfig  # noqa: E402
from specdec.entrypoints.decoder import SpecDecoder  # noqa: E402
from specdec.models import fused  # noqa: E402

SETUPS = {
    "target-only": SpecConfig(drafter="none"),
    "chain-5": SpecConfig(drafter="eagle3", max_draft_len=5),
    "tree-60": SpecConfig(drafter="eagle3", tree="dynamic", max_draft_len=6, topk=10, max_total_draft_tokens=60),
    # adaptive chain-5's plain steps, forced: the drafter ingests (plain) or is skipped (deferred);
    # a deferred step should launch what target-only's does, a plain one that plus the ingest
    "chain-5-plain": SpecConfig(drafter="eagle3", max_draft_len=5, adaptive=True),
    "chain-5-deferred": SpecConfig(drafter="eagle3", max_draft_len=5, adaptive=True),
}
# not launches: views, metadata, the custom-op wrappers around Triton kernels (counted as kernels)
NOT_LAUNCHES = {
    "detach", "view", "_unsafe_view", "alias", "t", "transpose", "unsqueeze", "squeeze", "expand", "slice", "select",
    "permute", "split", "split_with_sizes", "as_strided", "reshape", "unbind", "chunk", "lift_fresh", "resolve_conj",
    "resolve_neg", "empty", "empty_like", "empty_strided", "to", "promote_types",
    "kv_write", "rope_kv_write", "paged_attention", "build_tree", "verify_greedy", "verify_target_only", "verify_speculative",
    "relocate_kv",
}
DRAFTER_PIECES = ("best_children", "depth_inputs", "ingest_inputs", "ingest_outputs", "tree_of")
POLICY_PIECES = ("_rank", "_score_call", "_next_frontier", "_finish")


class LaunchCounter(TorchDispatchMode):
    """Counts launches per (phase, op); `phase` is set by the wrappers below."""

    def __init__(self) -> None:
        super().__init__()
        self.phase, self.opaque = "other", 0
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

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
        counter.one_launch(f"triton:{getattr(self.fn, '__name__', '?')}")
        counter.opaque += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.opaque -= 1

    triton_interpreter.InterpretedFunction.run = counted_run
    for name, fn in list(fused._FUNCTIONS.items()):
        def piece(*args, _fn=fn, _name=name, **kwargs):
            counter.one_launch(f"piece:{_name}")
            counter.opaque += 1
            try:
                return _fn(*args, **kwargs)
            finally:
                counter.opaque -= 1

        fused._FUNCTIONS[name] = piece


def count_step(key: str, target, head, counter: LaunchCounter) -> dict[str, collections.Counter]:
    config = SETUPS[key].replace(max_batch_size=1, max_seq_len=256, compile=False, cuda_graphs=False)
    dec = SpecDecoder.from_pretrained(target, None if key == "target-only" else head, config, device="cpu",
                                      dtype=torch.float32)
    engine = dec.engine
    pieces = fused.Pieces(fused._FUNCTIONS, compiled=False)  # the counting pieces
    target.model.attn_impl = "triton"
    # RoPE fused into the K/V write, as on CUDA ("auto" keeps it off the interpreter)
    engine.runner.cache.fuses_rope = lambda impl="auto": impl not in ("ref", "torch")
    modules = list(target.model.modules())
    drafter = engine.strategies.drafter if key != "target-only" else None
    if drafter is not None:
        drafter.attn_impl = drafter.rope_impl = "triton"
        modules += list(drafter.model.modules())
        counter.wrap(drafter, "propose", "draft")
        counter.wrap(drafter, "_ingest", "draft.ingest")
        counter.wrap(drafter.policy, "grow", "draft.policy")
        counter.wrap(drafter, "_forward", "draft.model")
        for attr in DRAFTER_PIECES:
            counter.wrap(drafter, attr, "draft.compiled", opaque=True)
        for attr in POLICY_PIECES:
            if hasattr(drafter.policy, attr):
                counter.wrap(drafter.policy, attr, "draft.compiled", opaque=True)
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
    engine.submit(list(range(1, 40)), SamplingParams(max_new_tokens=20, ignore_eos=True))
    for _ in range(3):  # prefill, then steps: the counted one is a steady-state step
        engine.run_iteration()
    counter.counts.clear()
    with counter:
        engine.step()
    return dict(counter.counts)


def main() -> None:
    import json

    torch.set_num_threads(1)
    args = sys.argv[1:]
    as_json = "--json" in args
    keys = [a for a in args if a != "--json"] or list(SETUPS)
    unknown = [k for k in keys if k not in SETUPS]
    if unknown:
        sys.exit(f"unknown setups {unknown}; allowed: {list(SETUPS)}")
    counter = LaunchCounter()
    instrument(counter)
    target = build_target(QUICK_TARGET, torch.device("cpu"), torch.float32)
    head = random_eagle3_head(head_config(QUICK_TARGET, True), device=torch.device("cpu"), dtype=torch.float32)
    for key in keys:
        counts = count_step(key, target, head, counter)
        total = sum(sum(c.values()) for c in counts.values())
        if as_json:
            print(json.dumps(dict(setup=key, total=total, phases={p: sum(c.values()) for p, c in counts.items()})))
            continue
        print(f"{key}: {total} launches per step (tiny 4-layer target, batch 1, CPU proxy)")
        for phase, c in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
            top = ", ".join(f"{op} {n}" for op, n in c.most_common(12))
            print(f"  {phase:15s} {sum(c.values()):4d}  {top}")


if __name__ == "__main__":
    main()
