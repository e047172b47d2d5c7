#!/usr/bin/env bash
# Issue 21, twenty-fourth session: e7t0 (EAGLE-3 e5 + 550 steps on e7's data at teacher temperature 0,
# `calls.sh train-t0`, packed to /root/e7t0) on the old frozen set (float32, GPU), then end to end
# beside e5 (the shipped head), bf16, batch 1, 20 held-out prompts; e7t0 stands in the device's copy of
# the shipped head's folder for the run (nothing is committed from the device).
#   bash notes/gpu/issue21/e7/calls_t0.sh      # after calls.sh data / train-t0 on the same warm machine
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_t0.log" 2>&1
tail -1 "$OUT/setup_t0.log"
python -m specdec.train eval --target smollm2 --drafter eagle3 --head /root/e7t0 --eval-source frozen \
  --device cuda --dtype float32 --eval-batch-size 16 --eval-max-new-tokens 128 \
  --json "$OUT/eval_e7t0_frozen_gpu.json" > "$OUT/eval_e7t0_frozen_gpu.log" 2>&1
echo "frozen rc=$?"; grep -A5 "tau (all)" "$OUT/eval_e7t0_frozen_gpu.log"
shipped=src/specdec/assets/heads/smollm2-eagle3
rm -rf /root/e5 && cp -r "$shipped" /root/e5
cp /root/e7t0/config.json /root/e7t0/model.safetensors "$shipped/"
(cd examples && python bench_e2e.py --setups target-only hf-compiled eagle3-chain eagle3-tree eagle3-chain-baseline \
   eagle3-tree-baseline --baseline-eagle3 /root/e5 --batch-sizes 1 --num-prompts 20 --kernel-steps 0 \
   --out "$OUT/e2e_e7t0.jsonl" > "$OUT/e2e_e7t0.log" 2>&1; echo "e2e rc=$?"; tail -25 "$OUT/e2e_e7t0.log")
