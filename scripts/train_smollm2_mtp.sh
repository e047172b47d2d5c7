#!/usr/bin/env bash
# Train specdec's MTP head for SmolLM2-135M-Instruct on ONE GPU (sized for an H200 and a
# 10-minute limit), then evaluate it with the mtp drafter on the frozen held-out prompts. One command:
#
#   scripts/train_smollm2_mtp.sh OUT_DIR [extra `python -m specdec.train mtp` flags]
#
# Same pipeline and budget as scripts/train_smollm2.sh (EAGLE-3): load (~0.5 min), prompts
# (~0.3 min), self-distillation (a bfloat16 copy of the target writes the responses on CUDA,
# --gen-dtype auto; stops starting batches after 2 min; the data of an earlier
# EAGLE-3 run in /tmp/specdec-train-smollm2 is reused when present and made with the same
# settings), training (MTP-Eagle recursion 7 steps deep on the target's last hidden state,
# 0.8**k step weights, full-vocabulary soft cross-entropy through the target's frozen lm_head,
# bf16 autocast, 32k-token batches; cosine fitted to at most 5.8 min), export, curves, then
# evaluation (target-only, mtp chain D=5, mtp tree D=6 K=8 N=48; 64 prompts, greedy, 128 new
# tokens; ~1 min). About 9 minutes in all on an H200 (the shipped head: TRAINING.md beside it).
#
# OUT_DIR receives six small files (the head is ~8.5 MB in bf16, standalone specdec MTP layout):
#   config.json model.safetensors training_curves.png train_log.jsonl TRAINING.md eval.json
# Use it with SpecDecoder.from_pretrained(target, OUT_DIR, SpecConfig(drafter="mtp", ...)).
# Large files (data.pt, float32 checkpoint + optimizer) go to $WORK (default
# /tmp/specdec-train-smollm2-mtp); re-running with the same $WORK reuses data and resumes.
set -euo pipefail
out="${1:?usage: scripts/train_smollm2_mtp.sh OUT_DIR [extra flags]}"
shift
work="${WORK:-/tmp/specdec-train-smollm2-mtp}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! python -c "import specdec.kernels, specdec.train" 2>/dev/null; then
  echo "specdec is not installed here; first: pip install --no-deps --no-build-isolation -e $root" >&2
  exit 1
fi
mkdir -p "$work"
if [ ! -e "$work/data.pt" ] && [ -f /tmp/specdec-train-smollm2/data.pt ]; then
  cp /tmp/specdec-train-smollm2/data.pt "$work/data.pt"  # reused only if its settings match (checked)
fi
exec python -m specdec.train mtp \
  --target smollm2 --out "$out" --work "$work" \
  --num-prompts 20000 --max-new-tokens 192 --max-prompt-tokens 384 \
  --gen-batch-size 1024 --gen-minutes 2.0 \
  --ttt-steps 7 --batch-tokens 32768 --epochs 20 \
  --lr 8e-4 --warmup 50 --max-minutes 5.8 --log-every 10 --val-every 100 \
  --eval --eval-prompts 64 --eval-batch-size 16 --eval-max-new-tokens 128 \
  "$@"
