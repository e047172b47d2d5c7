#!/usr/bin/env bash
# Where does the MTP tree's illegal memory access (calls.sh eval-gpu, float32, batch 16) come from? Five runs at
# once on one GPU, each its own process (an illegal access ends the process's CUDA context), logs in $OUT:
#   a: the shipped MTP head, tree only, float32, batch 16, compiled + graphs (the failing run, shipped head)
#   b: a in bfloat16           c: a with the EAGLE-3 head       d: a at batch 1 (12 prompts)
#   e: a eager under compute-sanitizer, 6 prompts (names the kernel and the address)
#   bash notes/gpu/issue21/crash/calls.sh   (after scripts/gpu_setup.sh with the GGUF)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_crash.log" 2>&1
tail -1 "$OUT/setup_crash.log"
ev() {  # TAG FLAGS...
  local tag=$1; shift
  timeout 280 python notes/gpu/issue21/crash/tree_eval.py "$@" --target smollm2 --eval-source categories \
    --eval-setups tree --device cuda --eval-max-new-tokens 128 > "$OUT/crash_$tag.log" 2>&1
  echo "$tag rc=$?"
}
mtp=(--drafter mtp --head src/specdec/assets/heads/smollm2-mtp)
ev a "${mtp[@]}" --eval-prompts 16 --dtype float32 --eval-batch-size 16 &
ev b "${mtp[@]}" --eval-prompts 16 --dtype bfloat16 --eval-batch-size 16 &
ev c --drafter eagle3 --head src/specdec/assets/heads/smollm2-eagle3 --eval-prompts 16 --dtype float32 --eval-batch-size 16 &
ev d "${mtp[@]}" --eval-prompts 2 --dtype float32 --eval-batch-size 1 &
CUDA_LAUNCH_BLOCKING=1 timeout 290 compute-sanitizer --print-limit 5 python notes/gpu/issue21/crash/tree_eval.py --eager \
  "${mtp[@]}" --target smollm2 --eval-source categories --eval-setups tree --device cuda --eval-max-new-tokens 128 \
  --eval-prompts 1 --dtype float32 --eval-batch-size 16 > "$OUT/crash_e.log" 2>&1; echo "e rc=$?"
wait
for f in "$OUT"/crash_?.log; do echo "== $f"; grep -v "^frame\|Converting" "$f" | grep -iE "error|illegal|invalid|rc=|tau|Traceback|File \"/work|at 0x|by thread|kernel" | head -14; done
