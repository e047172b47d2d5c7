#!/usr/bin/env bash
# Fifth call, at the fix (a519f2a + e53c999 + a074170): the runs that crashed must now pass. a, b, c as in calls.sh
# (batch 16, compiled + graphs: MTP float32, MTP bfloat16, EAGLE-3 float32), and calls4's sanitizer run (caching
# allocator off, eager, batch 16) must report no invalid access (a time-out with no report counts as clean so far).
#   bash notes/gpu/issue21/crash/calls5.sh   (after the GGUF parts: scripts/gpu_setup.sh)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"; cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_crash5.log" 2>&1
tail -1 "$OUT/setup_crash5.log"
export PYTHONUNBUFFERED=1
ev() {  # TAG FLAGS...
  local tag=$1; shift
  timeout 250 python notes/gpu/issue21/crash/tree_eval.py "$@" --target smollm2 --eval-source categories \
    --eval-setups tree --device cuda --eval-max-new-tokens 128 > "$OUT/crash5_$tag.log" 2>&1
  echo "$tag rc=$?"
}
mtp=(--drafter mtp --head src/specdec/assets/heads/smollm2-mtp)
ev a "${mtp[@]}" --eval-prompts 16 --dtype float32 --eval-batch-size 16 &
ev b "${mtp[@]}" --eval-prompts 16 --dtype bfloat16 --eval-batch-size 16 &
ev c --drafter eagle3 --head src/specdec/assets/heads/smollm2-eagle3 --eval-prompts 16 --dtype float32 --eval-batch-size 16 &
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 250 compute-sanitizer --print-limit 3 python notes/gpu/issue21/crash/tree_eval.py \
  --eager "${mtp[@]}" --target smollm2 --eval-source categories --eval-setups tree --device cuda \
  --eval-max-new-tokens 128 --dtype float32 --eval-prompts 1 --eval-batch-size 16 > "$OUT/crash5_n.log" 2>&1
echo "n rc=$? (124: timed out); invalid accesses reported: $(grep -c 'Invalid' "$OUT/crash5_n.log")"
wait
for f in "$OUT"/crash5_?.log; do echo "== $f"; grep -v "^frame\|Converting" "$f" | grep -iE "error|illegal|invalid|tau|Traceback|ERROR SUMMARY|^\| " | head -14; done
