#!/usr/bin/env bash
# Issue 21, seventeenth session: e6, a two-layer EAGLE-3 head (the shipped one-layer e5 deepened,
# `--init-head ... --draft-layers 2`, the new layer an identity at the start) trained on prompts
# e5 never saw (m6's 60k, seed 3, carried back in: .carry/c7 = pm6/prompts.tgz.00 + m5/ the MTP head
# m6 replaced); and the end-to-end speed of both retrained heads beside the ones they replace.
# One stage per device call, after the GGUF parts (scripts/gpu_setup.sh):
#   bash notes/gpu/issue21/e6/calls.sh data      # m6's prompts restored, answered (bf16)
#   bash notes/gpu/issue21/e6/calls.sh mtp-e2e   # MTP m6 (shipped) beside m5, bf16, batch 1
#   bash notes/gpu/issue21/e6/calls.sh train     # TRAIN_MINUTES of a STEPS-step schedule, then the head packed
#   bash notes/gpu/issue21/e6/calls.sh e2e       # EAGLE-3 e5 (shipped) beside e6, bf16, batch 1
#   bash notes/gpu/issue21/e6/calls.sh all-e2e   # both comparisons in one run (one target load, one baseline)
# Logs and packs go to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_$1.log" 2>&1
tail -2 "$OUT/setup_$1.log"
run="${RUN:-e6}"
carried="${CARRIED_C7:-/root/carried/c7}"
export HEAD=eagle3 STEPS="${STEPS:-1300}"
FL=(--init-head src/specdec/assets/heads/smollm2-eagle3 --draft-layers 2 --seed 3 --num-prompts 60000 --lr 4e-4
    --mix-shares source=0.2,instruct=0.15,math=0.1,header=0.1,self_instruct=0.25,multi_turn=0.2)
bench() {  # NAME SETUPS... [FLAGS]: bench_e2e at bf16, batch 1, the 20 shipped held-out prompts -> $OUT/NAME.{jsonl,log}
  local name=$1; shift
  (cd examples && python bench_e2e.py --setups "$@" --batch-sizes 1 --num-prompts 20 --kernel-steps 0 \
     --out "$OUT/$name.jsonl" 2>&1 | tee "$OUT/$name.log" | tail -30)
}
case "$1" in
  data)
    PROMPTS_FROM="$carried/pm6" PROMPT_MINUTES=${PROMPT_MINUTES:-4} GEN_MINUTES=${GEN_MINUTES:-2.2} \
      scripts/train_smollm2_parts.sh data /root/$run "${FL[@]}" > "$OUT/${run}_data.log" 2>&1
    echo "data rc=$?"; tail -20 "$OUT/${run}_data.log" ;;
  train)
    TRAIN_MINUTES=${TRAIN_MINUTES:-8.6} scripts/train_smollm2_parts.sh train /root/$run "${FL[@]}" > "$OUT/${run}_train.log" 2>&1
    echo "train rc=$?"; tail -25 "$OUT/${run}_train.log"
    OUT=$OUT scripts/train_smollm2_parts.sh pack /root/$run ;;
  mtp-e2e) bench e2e_m6_m5 target-only mtp-chain mtp-tree mtp-chain-baseline mtp-tree-baseline --baseline-mtp "$carried/m5" ;;
  e2e) bench "e2e_$run" target-only eagle3-chain eagle3-tree eagle3-chain-baseline eagle3-tree-baseline --baseline-eagle3 "/root/$run" ;;
  all-e2e)  # both in one run: EAGLE-3 e5 beside e6 and MTP m6 beside m5
    bench "e2e_all_$run" target-only eagle3-chain eagle3-tree eagle3-chain-baseline eagle3-tree-baseline \
      mtp-chain mtp-tree mtp-chain-baseline mtp-tree-baseline --baseline-eagle3 "/root/$run" --baseline-mtp "$carried/m5" ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
