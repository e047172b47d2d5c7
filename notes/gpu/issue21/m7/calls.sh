#!/usr/bin/env bash
# Issue 21, seventeenth session (planned): the MTP head m6 trained on (m7) on new prompts (seed 4), in calls
# of under 10 minutes on one warm GPU machine, after the GGUF parts (scripts/gpu_setup.sh).
#   bash notes/gpu/issue21/m7/calls.sh data    # prompts (resumable: exit 3 -> run again) + answers,
#                                              # then the prompts packed for later sessions
#   bash notes/gpu/issue21/m7/calls.sh more    # answers the data call left (if any)
#   bash notes/gpu/issue21/m7/calls.sh train   # TRAIN_MINUTES of a 1300-step schedule, then the head packed
#   bash notes/gpu/issue21/m7/calls.sh e2e     # the shipped head (m6) beside m5 (/root/carried/m5, NEXT.md), bf16, batch 1
# Logs and packs go to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_$1.log" 2>&1
tail -2 "$OUT/setup_$1.log"
export HEAD=mtp STEPS=1300
FLM=(--init-head src/specdec/assets/heads/smollm2-mtp --seed 4 --num-prompts ${NUM_PROMPTS:-80000} --lr 4e-4 --mtp-loss-vocab draft
     --mix-shares source=0.2,instruct=0.15,math=0.1,header=0.1,self_instruct=0.25,multi_turn=0.2)
case "$1" in
  data)
    PROMPT_MINUTES=${PROMPT_MINUTES:-7} GEN_MINUTES=${GEN_MINUTES:-2.5} \
      scripts/train_smollm2_parts.sh data /root/m7 "${FLM[@]}" > "$OUT/m7_data.log" 2>&1
    rc=$?; echo "data rc=$rc"; tail -25 "$OUT/m7_data.log"
    [ "$rc" = 0 ] && OUT=$OUT scripts/train_smollm2_parts.sh pack-prompts /root/m7 ;;
  more)
    GEN_MINUTES=${GEN_MINUTES:-3} scripts/train_smollm2_parts.sh more /root/m7 "${FLM[@]}" > "$OUT/m7_more.log" 2>&1
    echo "more rc=$?"; tail -15 "$OUT/m7_more.log" ;;
  train)
    TRAIN_MINUTES=${TRAIN_MINUTES:-8.8} scripts/train_smollm2_parts.sh train /root/m7 "${FLM[@]}" > "$OUT/m7_train.log" 2>&1
    echo "train rc=$?"; tail -25 "$OUT/m7_train.log"
    OUT=$OUT scripts/train_smollm2_parts.sh pack /root/m7 ;;
  e2e)
    cd examples && python bench_e2e.py --setups target-only mtp-chain mtp-tree mtp-chain-baseline mtp-tree-baseline \
      --baseline-mtp /root/carried/m5 --batch-sizes 1 --num-prompts 20 --kernel-steps 0 --out "$OUT/e2e_m6.jsonl" \
      2>&1 | tee "$OUT/e2e_m6.log" | tail -30 ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
