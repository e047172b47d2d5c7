#!/usr/bin/env bash
# Issue 21, sixteenth session: the MTP head m5 trained on (m6) on new prompts (seed 3), in calls
# of under 10 minutes on one warm GPU machine, after the GGUF parts (scripts/gpu_setup.sh).
# RUN / SEED / STEPS / BASELINE name another run (defaults: m6's): the seventeenth session's plan is
#   RUN=m7 SEED=4 STEPS=1300 GEN_MINUTES=2.5 TRAIN_MINUTES=8.8 bash notes/gpu/issue21/m6/calls.sh data|train
#   BASELINE=/root/carried/m5 bash notes/gpu/issue21/m6/calls.sh e2e   # the shipped head beside another
#   bash notes/gpu/issue21/m6/calls.sh data    # prompts (resumable: exit 3 -> run again) + answers,
#                                              # then the prompts packed for later sessions
#   bash notes/gpu/issue21/m6/calls.sh more    # answers the data call left (if any)
#   bash notes/gpu/issue21/m6/calls.sh train   # TRAIN_MINUTES of a STEPS-step schedule (1200), then the head packed
#   bash notes/gpu/issue21/m6/calls.sh e2e     # the shipped head beside BASELINE end to end, bf16, batch 1
# Logs and packs go to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_$1.log" 2>&1
tail -2 "$OUT/setup_$1.log"
run="${RUN:-m6}"
export HEAD=mtp STEPS="${STEPS:-1200}"
FLM=(--init-head src/specdec/assets/heads/smollm2-mtp --seed "${SEED:-3}" --num-prompts ${NUM_PROMPTS:-80000} --lr 4e-4 --mtp-loss-vocab draft
     --mix-shares source=0.2,instruct=0.15,math=0.1,header=0.1,self_instruct=0.25,multi_turn=0.2)
case "$1" in
  data)
    PROMPT_MINUTES=${PROMPT_MINUTES:-6.3} GEN_MINUTES=${GEN_MINUTES:-2.2} \
      scripts/train_smollm2_parts.sh data /root/$run "${FLM[@]}" > "$OUT/${run}_data.log" 2>&1
    rc=$?; echo "data rc=$rc"; tail -25 "$OUT/${run}_data.log"
    [ "$rc" = 0 ] && OUT=$OUT scripts/train_smollm2_parts.sh pack-prompts /root/$run ;;
  more)
    GEN_MINUTES=${GEN_MINUTES:-3} scripts/train_smollm2_parts.sh more /root/$run "${FLM[@]}" > "$OUT/${run}_more.log" 2>&1
    echo "more rc=$?"; tail -15 "$OUT/${run}_more.log" ;;
  train)
    TRAIN_MINUTES=${TRAIN_MINUTES:-8.3} scripts/train_smollm2_parts.sh train /root/$run "${FLM[@]}" > "$OUT/${run}_train.log" 2>&1
    echo "train rc=$?"; tail -25 "$OUT/${run}_train.log"
    OUT=$OUT scripts/train_smollm2_parts.sh pack /root/$run ;;
  e2e)
    cd examples && python bench_e2e.py --setups target-only mtp-chain mtp-tree mtp-chain-baseline mtp-tree-baseline \
      --baseline-mtp "${BASELINE:-/root/$run}" --batch-sizes 1 --num-prompts 20 --kernel-steps 0 --out "$OUT/e2e_$run.jsonl" \
      2>&1 | tee "$OUT/e2e_$run.log" | tail -30 ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
