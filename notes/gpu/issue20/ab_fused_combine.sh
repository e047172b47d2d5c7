#!/usr/bin/env bash
# Issue 20, fifteenth session: the split-KV combine fused into the attention launch (the last
# split of a tile combines), A/B in one device call. ab_base/src (untracked, carried) holds the
# code before it (8de3f73 = 929c921's kernels), so the step rows of both builds run on one machine.
#   bash notes/gpu/issue20/ab_fused_combine.sh      # logs to $OUT
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > /dev/null 2>&1
out=${OUT:-/tmp}
cd examples
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
run() { local log=$1; shift; echo "== $*"; "$@" > "$out/$log" 2>&1; tail -n 40 "$out/$log" | grep -v "^ *$"; }
# the kernel alone: both combines side by side (graph ms per forward over all layers)
run attn_8b_1k.log python bench_attention.py --impls triton --context 1024 --nodes 61 --max-kv-len 4224 --combine fused kernel
run attn_8b_4k.log python bench_attention.py --impls triton --context 4096 --nodes 61 --max-kv-len 4224 --combine fused kernel
run attn_smollm2.log python bench_attention.py --layout smollm2 --impls triton --context 320 --nodes 49 --max-kv-len 640 --combine fused kernel
# the step: the 8B rows of both builds, base first
cycle="bench_cycle.py --setups target-only chain-5 tree-60 --contexts 1024 4096 --steps 32 --kernel-steps 2"
PYTHONPATH="$root/ab_base/src:$PYTHONPATH" run base_path.log python -c "import specdec; print(specdec.__file__)"
PYTHONPATH="$root/ab_base/src:$PYTHONPATH" run cycle_base.log python $cycle
run cycle_new.log python $cycle
