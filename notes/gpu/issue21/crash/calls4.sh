#!/usr/bin/env bash
# Fourth call: compute-sanitizer with PyTorch's caching allocator off (every tensor its own cudaMalloc, so a read
# outside a tensor is outside an allocation and is reported; with the cache on, e and k read inside a cached
# segment and passed), eager, 6 prompts at batch 6. It ran past its 170 s, but the first report came first.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"; cd "$root"
source scripts/gpu_setup.sh > /tmp/s.log 2>&1
export PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1
timeout 170 compute-sanitizer --print-limit 3 python notes/gpu/issue21/crash/tree_eval.py --eager --drafter mtp \
  --head src/specdec/assets/heads/smollm2-mtp --target smollm2 --eval-source categories --eval-setups tree --device cuda \
  --eval-max-new-tokens 128 --dtype float32 --eval-prompts 1 --eval-batch-size 16 > "$OUT/crash4_n.log" 2>&1
echo "rc=$?"; grep -E "Invalid|at 0x|by thread|Access|is out of bounds|^\| mtp" "$OUT/crash4_n.log" | head -30
