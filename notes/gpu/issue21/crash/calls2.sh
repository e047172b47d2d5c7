#!/usr/bin/env bash
# Second call: which of batch size, torch.compile and CUDA graphs the tree's illegal access needs (MTP, float32).
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"; cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_crash2.log" 2>&1
ev() { local tag=$1; shift
  timeout 200 python notes/gpu/issue21/crash/tree_eval.py "$@" --drafter mtp --head src/specdec/assets/heads/smollm2-mtp \
    --target smollm2 --eval-source categories --eval-setups tree --device cuda --eval-max-new-tokens 128 --dtype float32 \
    > "$OUT/crash2_$tag.log" 2>&1; echo "$tag rc=$?"; }
ev f --eager --eval-prompts 16 --eval-batch-size 16 &
ev g --no-graphs --eval-prompts 16 --eval-batch-size 16 &
ev h --eval-prompts 1 --eval-batch-size 16 &
ev i --eval-prompts 4 --eval-batch-size 2 &
ev j --eval-prompts 8 --eval-batch-size 8 &
wait
for f in "$OUT"/crash2_?.log; do echo "== $f"; grep -E "illegal|^\| mtp|prompts$" "$f" | head -4; done
