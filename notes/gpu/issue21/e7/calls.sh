#!/usr/bin/env bash
# Issue 21, eighteenth session: the one lever of the issue's list never measured, a longer TTT
# unroll, with its control. Both runs start from the shipped one-layer EAGLE-3 head e5, train the
# same 550-step schedule (lr 4e-4) on the same data (m6's 60k prompts, seed 3, answered in bf16:
# what e6 trained on), and differ only in --ttt-steps: u10 unrolls 10 steps, u7 the 7 of every
# head so far (so u7 - e5 is what the data does, u10 - u7 what the unroll does).
# And (nineteenth session on) a sharper teacher (--teacher-temperature 0.5 / 0: the loss's target
# moved toward the argmax, the one token greedy verification accepts), same data, unroll 7, from e5.
# Also: MTP m5 beside m6 end to end in the other order (m5 first), with m5's tree row.
# One stage per device call, after the GGUF parts (scripts/gpu_setup.sh); c7 (m6's prompts, m5)
# carried with the data call:
#   bash notes/gpu/issue21/e7/calls.sh data      # m6's prompts restored, answered (bf16), packed to $OUT (data.tgz.NN)
#   bash notes/gpu/issue21/e7/calls.sh train-u10 # 10-step unroll, then the head packed
#   bash notes/gpu/issue21/e7/calls.sh train-u7  # 7-step unroll (the control), then the head packed
#   bash notes/gpu/issue21/e7/calls.sh train-t05 # 7-step unroll, teacher temperature 0.5
#   bash notes/gpu/issue21/e7/calls.sh train-t0  # 7-step unroll, the target's argmax alone as the target
#   bash notes/gpu/issue21/e7/calls.sh train-u10t0  # from e8 (shipped; = e7t0): 10-step unroll at temperature 0
#   bash notes/gpu/issue21/e7/calls.sh train-mt0 # the MTP head m6, the same data, the argmax alone as the target
#   bash notes/gpu/issue21/e7/calls.sh train-mt1 # its control: the same at teacher temperature 1
# The trains need the data stage's files on the machine: a machine taken back (it happened to the
# eighteenth session's train-u10) loses them, so `data` packs them to $OUT (data.tgz.NN) and, carried
# back as /root/carried/e7data (scripts/carry_folder.sh e7data DIR), reuses them on a new machine.
#   bash notes/gpu/issue21/e7/calls.sh mtp-e2e   # m5 (rows first) beside m6 (shipped), bf16, batch 1
#   bash notes/gpu/issue21/e7/calls.sh eval-gpu NAME DIR  # an MTP head on the per-category set, float32, on the GPU
#   DRAFTER=eagle3 bash notes/gpu/issue21/e7/calls.sh eval-gpu NAME DIR   # the same for an EAGLE-3 head
#   bash notes/gpu/issue21/e7/calls.sh e2e-mtp BASE_DIR   # the shipped MTP head beside BASE_DIR, bf16, batch 1
# Logs and packs go to $OUT.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
cd "$root"
source scripts/gpu_setup.sh > "$OUT/setup_$1.log" 2>&1
tail -2 "$OUT/setup_$1.log"
carried="${CARRIED_C7:-/root/carried/c7}"
data_work=/tmp/specdec-train-smollm2-eagle3  # train_smollm2_parts.sh's default WORK: the data stage's
export HEAD=eagle3 STEPS="${STEPS:-550}"
FL=(--init-head src/specdec/assets/heads/smollm2-eagle3 --seed 3 --num-prompts 60000 --lr 4e-4
    --mix-shares source=0.2,instruct=0.15,math=0.1,header=0.1,self_instruct=0.25,multi_turn=0.2)
train() {  # RUN TTT_STEPS [TEACHER_TEMPERATURE [FLAGS...]]: the schedule in its own WORK (own checkpoint), the
  # data stage's files linked in; FLAGS override FL's (the last of a flag wins)
  local run=$1 ttt=$2 temp=${3:-1.0} work="/tmp/work-$1"
  shift $(( $# < 3 ? $# : 3 ))
  mkdir -p "$work"
  for f in "$data_work"/*; do
    case "$(basename "$f")" in checkpoint*) ;; *) ln -sf "$f" "$work/" ;; esac
  done
  WORK="$work" TRAIN_MINUTES=${TRAIN_MINUTES:-6} scripts/train_smollm2_parts.sh train "/root/$run" "${FL[@]}" \
    --ttt-steps "$ttt" --teacher-temperature "$temp" "$@" > "$OUT/${run}_train.log" 2>&1
  echo "$run train rc=$?"; tail -c 1500 "$OUT/${run}_train.log"
  OUT=$OUT scripts/train_smollm2_parts.sh pack "/root/$run"
}
bench_mtp() {  # BASELINE_DIR TAG [SETUPS...]: bench_e2e at batch 1 (20 held-out prompts): target-only, SETUPS, and the
  # MTP chain and tree with the shipped head and with BASELINE_DIR's; $OUT/TAG.jsonl and .log
  local base tag=$2
  base="$(cd "$1" && pwd)"  # absolute: the bench runs in examples/
  shift 2
  (cd examples && python bench_e2e.py --setups target-only "$@" mtp-chain-baseline mtp-tree-baseline mtp-chain mtp-tree \
     --baseline-mtp "$base" --batch-sizes 1 --num-prompts 20 --kernel-steps 0 --out "$OUT/$tag.jsonl" \
     > "$OUT/$tag.log" 2>&1; echo "e2e rc=$?"; tail -30 "$OUT/$tag.log")
}
case "$1" in
  data)  # with the answered data carried (/root/carried/e7data: an earlier call's data.tgz.NN unpacked and
    # carried with scripts/carry_folder.sh e7data DIR, two calls) it is reused; else made and packed to $OUT
    [ -f /root/carried/e7data/data.pt ] && export DATA_FROM=/root/carried/e7data
    # m6's prompts from the carried c7 when it came along; else written again here (60k in ~170 s on an H100)
    [ -d "$carried/pm6" ] && export PROMPTS_FROM="$carried/pm6"
    PROMPT_MINUTES=${PROMPT_MINUTES:-4} GEN_MINUTES=${GEN_MINUTES:-2.2} \
      WORK="$data_work" scripts/train_smollm2_parts.sh data /root/e7_data "${FL[@]}" > "$OUT/e7_data.log" 2>&1
    echo "data rc=$?"; tail -20 "$OUT/e7_data.log"
    [ -n "${DATA_FROM:-}" ] || OUT=$OUT WORK="$data_work" scripts/train_smollm2_parts.sh pack-data /root/e7_data ;;
  train-u10) train e7u10 10 ;;
  train-u7) train e7u7 7 ;;
  train-t05) train e7t05 7 0.5 ;;
  train-t0) train e7t0 7 0 ;;
  train-u10t0) train e7u10t0 10 0 ;;  # twenty-fourth session on: the 10-step unroll from the shipped head (e8 =
    # e7t0) at its temperature 0, so that e7u10t0 - e8 is what the unroll does
  train-mt0)  # the shipped MTP head m6 on the same data, the argmax alone as its target (m6, trained at T = 1 on
    # 74k answers of the same mix and seed, is its approximate control; MTP ~2.4 steps/s: ~260 s)
    HEAD=mtp train e7mt0 7 0 --init-head src/specdec/assets/heads/smollm2-mtp --mtp-loss-vocab draft ;;
  train-mt1)  # mt0's control (twentieth session on): the same init, data and schedule at teacher temperature 1, so that
    # mt1 - m6 is what more steps on this data do and mt0 - mt1 what the argmax target does
    HEAD=mtp train e7mt1 7 1.0 --init-head src/specdec/assets/heads/smollm2-mtp --mtp-loss-vocab draft ;;
  eval-gpu)  # eval-gpu NAME HEAD_DIR: the per-category held-out set (16 prompts each, 128 greedy tokens, batch 16) in
    # float32 on the GPU, every output checked against target-only's (twenty-first session on: the CPU takes ~24 minutes)
    python -m specdec.train eval --target smollm2 --drafter "${DRAFTER:-mtp}" --head "$3" --eval-source categories --eval-prompts 16 \
      --device cuda --dtype float32 --eval-batch-size 16 --eval-max-new-tokens 128 --json "$OUT/eval_$2_gpu.json" \
      > "$OUT/eval_$2_gpu.log" 2>&1
    echo "eval $2 rc=$?"; tail -22 "$OUT/eval_$2_gpu.log" ;;
  e2e-mtp)  # e2e-mtp BASELINE_DIR: the shipped MTP head beside BASELINE_DIR (the head it replaced), bf16, batch 1
    bench_mtp "${2:?e2e-mtp BASELINE_DIR}" e2e_mtp hf-compiled ;;
  mtp-e2e) bench_mtp "$carried/m5" e2e_m5_m6 ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
