#!/usr/bin/env bash
# Train specdec's EAGLE-3 head for SmolLM2-135M-Instruct on ONE GPU (sized for an H200 and a
# 10-minute limit), then evaluate it on the frozen held-out prompts. One command:
#
#   scripts/train_smollm2.sh OUT_DIR [extra `python -m specdec.train eagle3` flags]
#
# Phases (each prints its wall time): load + GGUF conversion (~0.5 min on a fresh machine),
# prompts from stdlib + site-packages (~0.3 min), self-distillation: the target's greedy
# answers (written by a bfloat16 copy on CUDA: --gen-dtype auto; the labels stay the float32
# teacher's) to up to 20000 prompts in batches of 1024, decode replayed from a CUDA graph
# (checked once against eager; --gen-cuda-graph off to skip; stops starting batches after 2 min),
# TTT training (7 steps, bf16 autocast, 32k-token batches, up to 20 epochs; the cosine schedule is fitted to
# at most 5 min after timing the first steps, and again after 48 more), export, curves, then evaluation (target-only, linear
# D=5, tree D=6 K=8 N=48; 64 prompts, greedy, 128 new tokens; ~1 min).
#
# OUT_DIR receives exactly six small files (the head is ~15 MB in bf16):
#   config.json model.safetensors training_curves.png train_log.jsonl TRAINING.md eval.json
# Large intermediate files (data.pt, float32 checkpoint + optimizer) go to $WORK
# (default /tmp/specdec-train-smollm2); re-running with the same $WORK reuses the data and
# resumes the checkpoint. The head is saved before the evaluation starts.
set -euo pipefail
out="${1:?usage: scripts/train_smollm2.sh OUT_DIR [extra flags]}"
shift
work="${WORK:-/tmp/specdec-train-smollm2}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! python -c "import specdec.kernels, specdec.train" 2>/dev/null; then
  echo "specdec is not installed here; first: pip install --no-deps --no-build-isolation -e $root" >&2
  exit 1
fi
exec python -m specdec.train eagle3 \
  --target smollm2 --out "$out" --work "$work" \
  --num-prompts 20000 --max-new-tokens 192 --max-prompt-tokens 384 \
  --gen-batch-size 1024 --gen-minutes 2.0 \
  --draft-vocab-size 4096 --ttt-steps 7 --batch-tokens 32768 --epochs 20 \
  --lr 8e-4 --warmup 50 --max-minutes 5.0 --log-every 10 --val-every 100 \
  --eval --eval-prompts 64 --eval-batch-size 16 --eval-max-new-tokens 128 \
  "$@"
