"""Launches per step do not creep back: `examples/count_launches.py` counts, on the CPU, the
launches a CUDA step would make (aten ops outside compiled pieces, compiled pieces, Triton
kernels; tiny 4-layer target, random EAGLE-3 head, batch 1). The bounds are this commit's
counts plus a small margin; a change that adds eager glue to the step (an op per draft depth
is 5 launches for a chain of 5) fails here before any GPU run. Lower a bound when a change
removes launches."""

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# counted: 74 / 204 / 223 at 3f95bf1 (458 for chain-5 before the draft glue was compiled); 74 / 187 / 206
# once a verify's captured layers were concatenated instead of written to the buffer and gathered back,
# 74 / 180 / 199 with the drafted tree's assembly compiled, 74 / 172 / 196 with the tree policies'
# constants made once, 74 / 167 / 191 with the draft head's too and its ingest writing the state in
# place; adaptive chain-5's forced plain steps 94 (ingesting) / 70 (deferred: no drafter, no relocation).
# Since then the cache's row arithmetic counts one launch (compiled with compile="auto", as on the GPU; it
# was counted op by op, 13 per verify): 62 / 155 / 179 / 82 / 58 at that commit, then 52 / 148 / 172 / 75 /
# 51 with a tree verify's rows and positions one compiled piece (`kv_cache.tree_rows`), the budget cut and
# live rows one (`step.tree_sizes`), and target-only's and the plain step's root-only trees made once;
# 51 / 148 / 172 / 71 / 51 with no relocation launched for a root-only path and the ingesting plain
# step's path made once; 51 / 143 / 166 / 70 / 51 with the draft rows' embedding looked up inside the
# depth's and the ingest's compiled input pieces (one launch fewer per draft forward). Then RoPE is counted
# fused into the K/V write as CUDA runs it (one kernel per layer where the proxy counted the rotary piece
# and the write): 46 / 139 / 162 / 65 / 46, and 46 / 134 / 156 / 64 / 46 with the draft head's forwards
# storing their K/V through the same fused write (`attend.with_rope`). Then attention's key splits are
# counted as a captured step on the H200 makes them (the split-KV combine kernel, one per attention call):
# 50 / 143 / 166 / 69 / 50, and a chain's next frontier is views, not a compiled piece: chain-5 139
BOUNDS = {"target-only": 53, "chain-5": 142, "tree-60": 169, "chain-5-plain": 72, "chain-5-deferred": 53,
          "chain-5-bare": 53}  # bare: 50 at its first count (as target-only; deferred 50 with one more in verify)


def test_launches_per_step_stay_within_their_bounds():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "count_launches.py", "--json", *BOUNDS], cwd=EXAMPLES, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {r["setup"]: r for r in map(json.loads, run.stdout.strip().splitlines())}
    assert set(counts) == set(BOUNDS)
    for setup, bound in BOUNDS.items():
        assert counts[setup]["total"] <= bound, f"{setup}: {counts[setup]} launches per step, bound {bound}"
    # a deferred plain step costs no more launches than a target-only step
    assert counts["chain-5-deferred"]["total"] <= counts["target-only"]["total"]
    # and a bare one (no request of the batch drafts) is a target-only step's work: no more in its verify
    assert counts["chain-5-bare"]["total"] <= counts["target-only"]["total"]
    assert counts["chain-5-bare"]["phases"]["verify"] <= counts["target-only"]["phases"]["verify"]
    # the speculative steps' draft glue is compiled: the head's own forwards dominate the draft
    chain = counts["chain-5"]["phases"]
    assert chain["draft.model"] > chain.get("draft.policy", 0) + chain.get("draft", 0) + chain.get("draft.ingest", 0)


# GPU kernels per step (`count_launches.py --kernels`: each compiled piece as the kernels Inductor generates
# for it on a GPU). chain-5 on the tiny target: 264 at 4678937, 234 with the head's RoPE fused into its K/V
# write (the rotary piece was 6 kernels), 202 once
# a chain's glue skipped the generic gathers and assembly and `cat_columns` replaced torch.cat in the
# pieces, 187 with top_logprobs' reductions-only k = 1 (2 kernels a depth where 6 ran), 171 with the pieces'
# score_fusion_memory_threshold at 1 (`compile_scope.PIECE_OPTIONS`: batch-1 kernels sharing an input fuse).
# tree-48: 263 at bb5fda3, 233 with top_logprobs' k > 1 as two Triton kernels (7 a depth before), 222 with a
# ranked policy's call and close one piece each and its scores flattened (not reshaped by tokens' symbols),
# 212 with a depth's lengths and positions written [B, F] (one kernel with write_index: 6 -> 4 a depth), 198
# with a ranked policy's call as one Triton kernel (`kernels.ranked_call`: 3-4 kernels and a sort before)
KERNEL_BOUNDS = {"chain-5": 172, "tree-48": 200}


def test_gpu_kernels_per_chain_and_tree_step_stay_within_their_bound():
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "count_launches.py", "--kernels", "--json", *KERNEL_BOUNDS], cwd=EXAMPLES,
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {r["setup"]: r for r in map(json.loads, run.stdout.strip().splitlines())}
    for setup, bound in KERNEL_BOUNDS.items():
        assert counts[setup]["total"] <= bound, f"{setup}: {counts[setup]} GPU kernels per step, bound {bound}"
    # the draft glue's kernels: what the chain's own glue, cat_columns, the k = 1 top-1 and the fusion threshold
    # cut (101 before; 41 after)
    assert counts["chain-5"]["phases"]["draft.compiled"] <= 44
    # a tree's glue: 119 at bb5fda3, 89 with the top-k kernels, 79 with the ranked policy's pieces, 69 with a
    # depth's inputs in 4 kernels, 55 with the ranked call one kernel
    assert counts["tree-48"]["phases"]["draft.compiled"] <= 56
