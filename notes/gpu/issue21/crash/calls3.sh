#!/usr/bin/env bash
# Third call: the kernel (compute-sanitizer, eager, 12 prompts at batch 12) and the Python line (CUDA_LAUNCH_BLOCKING=1,
# eager, batch 16) of the tree's illegal access; and eager at batch 6 without the sanitizer (it passed under it).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"; cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_crash3.log" 2>&1
ev() { local tag=$1 pre=$2; shift 2
  timeout 270 $pre python notes/gpu/issue21/crash/tree_eval.py --eager "$@" --drafter mtp --head src/specdec/assets/heads/smollm2-mtp \
    --target smollm2 --eval-source categories --eval-setups tree --device cuda --eval-max-new-tokens 128 --dtype float32 \
    > "$OUT/crash3_$tag.log" 2>&1; echo "$tag rc=$?"; }
ev k "compute-sanitizer --print-limit 4" --eval-prompts 2 --eval-batch-size 16 &
CUDA_LAUNCH_BLOCKING=1 ev l "" --eval-prompts 16 --eval-batch-size 16 &
ev m "" --eval-prompts 1 --eval-batch-size 16 &
wait
for f in "$OUT"/crash3_?.log; do echo "== $f"; grep -v "^frame\|Converting" "$f" | grep -E "illegal|Invalid|at 0x|by thread|Address|File \"/work|^\| mtp" | head -12; done
