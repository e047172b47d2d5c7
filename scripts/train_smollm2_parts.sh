#!/usr/bin/env bash
# Train a SmolLM2 head (EAGLE-3, or MTP with HEAD=mtp) on the diverse mix in PARTS, each one
# call of at most ~9 minutes on the GPU machine, back to back (the machine keeps $WORK while
# warm: 30 s between calls). One command per part:
#
#   scripts/train_smollm2_parts.sh data   OUT_DIR   # prompts (PROMPT_MINUTES, 6; exit 3 when that ends them: run
#                                                    # `data` again, it goes on) + bf16 self-distillation, GEN_MINUTES (6)
#   scripts/train_smollm2_parts.sh more   OUT_DIR   # optional: answer what `data` left, GEN_MINUTES more
#   scripts/train_smollm2_parts.sh train  OUT_DIR   # TRAIN_MINUTES (8.5) of a fixed STEPS schedule, checkpointed
#                                                    # (run it again for a longer schedule)
#   scripts/train_smollm2_parts.sh finish OUT_DIR   # resume to the schedule's end (at most FINISH_MINUTES, 6.5,
#                                                    # so that the evaluation fits in the call), export, evaluate
#                                                    # on the per-category held-out set (EVAL_PROMPTS each)
#   scripts/train_smollm2_parts.sh eval   OUT_DIR   # the finished head on the frozen held-out set (the old one)
#   scripts/train_smollm2_parts.sh pack-prompts OUT_DIR  # the finished prompts as $OUT/prompts.tgz.NN (the self-written
#                                                    # ones take an H100 ~7 minutes), for a later session's `data`
#                                                    # with PROMPTS_FROM=<those pieces, or the folder they unpack to,
#                                                    # carried with scripts/carry_folder.sh>
#   scripts/train_smollm2_parts.sh pack-data OUT_DIR  # the finished data (<work>/data.pt, val_data.pt, the prompts) as
#                                                    # $OUT/data.tgz.NN: a later session's `data` with DATA_FROM=<those
#                                                    # pieces, or the folder they unpack to, carried with
#                                                    # scripts/carry_folder.sh> reuses it instead of answering the prompts
#                                                    # again (~160 s on an H100 for 60k prompts; carrying ~2 calls of ~11 s)
#   scripts/train_smollm2_parts.sh pack   OUT_DIR   # OUT_DIR as $OUT/<name>.tgz.00, .01, ...: at most 15 MiB a
#                                                    # piece (a file over 16 MiB does not come back from the GPU
#                                                    # machine, and a 16384-row head is ~29 MB); here, unpack with
#                                                    # `cat <files_at>/<name>.tgz.* | tar -xzf - -C DEST`
#
# Across sessions (a machine is lost after 30 minutes held): pack the finished head, bring it back,
# and start the next session's run from it on new prompts (EXTRA flags: --init-head FOLDER --seed N,
# the folder carried into the working tree; the draft vocabulary is the head's).
#
# A killed `data` call resumes where it stopped (<work>/responses.pt); `train` and `finish` resume
# <work>/checkpoint and never generate (--reuse-data): called with other data flags than `data`'s,
# they exit naming the settings that differ instead of making the data again inside the training's
# time. STEPS is the whole schedule (default 4000: train + finish at ~210 ms/step on the
# H200 with 32k-token batches and a 4096-token draft vocabulary; the 16384 default is slower, the
# record says whether the schedule ended); extra flags go to `python -m specdec.train` after the defaults.
set -euo pipefail
usage="usage: scripts/train_smollm2_parts.sh data|more|train|finish|eval|pack|pack-prompts|pack-data OUT_DIR [extra flags]"
stage="${1:?$usage}"
out="${2:?$usage}"
shift 2
head="${HEAD:-eagle3}"
work="${WORK:-/tmp/specdec-train-smollm2-$head}"
steps="${STEPS:-4000}"
gen_minutes="${GEN_MINUTES:-6}"
prompt_minutes="${PROMPT_MINUTES:-6}"
train_minutes="${TRAIN_MINUTES:-8.5}"
finish_minutes="${FINISH_MINUTES:-6.5}"
eval_prompts="${EVAL_PROMPTS:-16}"
if ! python -c "import specdec.kernels, specdec.train" 2>/dev/null; then
  echo "specdec is not importable here (on the GPU machine: source scripts/gpu_setup.sh)" >&2
  exit 1
fi
data=(--data-mix diverse --num-prompts 60000 --max-new-tokens 192 --max-prompt-tokens 384
      --gen-batch-size 1024 --gen-dtype auto --max-variants 8 --val-prompts 384)
train=(--ttt-steps 7 --batch-tokens 32768 --steps "$steps" --lr 8e-4 --warmup 100
       --log-every 20 --val-every 200 --no-fit-schedule)
# 16384 draft tokens: the shipped 4096 hold 67% of SmolLM2's greedy general-chat tokens and 66% of its
# multi-turn ones (82% of all; scripts/draft_vocab_coverage.py), and a token outside can never be accepted
train+=(--draft-vocab-size "${DRAFT_VOCAB:-16384}")  # mtp: the draft_vocab.safetensors beside the head
run() { python -m specdec.train "$head" --target smollm2 --out "$out" --work "$work" "${data[@]}" "${train[@]}" "$@"; }
restore_prompts() {  # PROMPTS_FROM: prompts.jsonl + prompts.settings.json (a folder carried with
  # scripts/carry_folder.sh: /root/carried/NAME), or the prompts.tgz.NN pieces of `pack-prompts`; same data flags
  if [ -n "${PROMPTS_FROM:-}" ] && [ ! -f "$work/prompts.jsonl" ]; then
    mkdir -p "$work"
    if [ -f "$PROMPTS_FROM/prompts.jsonl" ]; then
      cp "$PROMPTS_FROM/prompts.jsonl" "$PROMPTS_FROM/prompts.settings.json" "$work/"
    else
      cat "$PROMPTS_FROM"/prompts.tgz.* | tar -xzf - -C "$work"
    fi
    echo "prompts restored from $PROMPTS_FROM into $work"
  fi
}
data_files=(data.pt val_data.pt prompts.jsonl prompts.settings.json)  # what pack-data packs and DATA_FROM restores
restore_data() {  # DATA_FROM: data.pt (+ val_data.pt, prompts) of an earlier `pack-data`, as its data.tgz.NN pieces or
  # the folder they unpack to (carried with scripts/carry_folder.sh: /root/carried/NAME); the `data` stage then
  # finds them made with its settings and reuses them (other flags: it says which differ and makes the data again)
  if [ -n "${DATA_FROM:-}" ] && [ ! -f "$work/data.pt" ]; then
    mkdir -p "$work"
    if [ -f "$DATA_FROM/data.pt" ]; then
      for f in "${data_files[@]}"; do
        if [ -f "$DATA_FROM/$f" ]; then cp "$DATA_FROM/$f" "$work/"; fi
      done
    elif compgen -G "$DATA_FROM/data.tgz.*" > /dev/null; then
      cat "$DATA_FROM"/data.tgz.* | tar -xzf - -C "$work"
    fi
    [ -f "$work/data.pt" ] || { echo "DATA_FROM=$DATA_FROM holds no data.pt nor the data.tgz.NN pieces of one" >&2; exit 1; }
    echo "data restored from $DATA_FROM into $work"
  fi
}
to_pieces() {  # a tgz on stdin -> $dest/$1.tgz.NN of at most 15 MiB (a file over 16 MiB does not come back
  # from the GPU machine), at most 8 of them (the files a call returns); $2 names what was packed
  split -b 15M -d - "$dest/$1.tgz."
  local pieces
  pieces=$(ls "$dest/$1".tgz.* | wc -l)
  [ "$pieces" -le 8 ] || { echo "$2 packs into $pieces pieces; at most 8 files come back from a call" >&2; exit 1; }
  echo "packed $2 into $pieces pieces of at most 15 MiB: $dest/$1.tgz.*"
}
case "$stage" in
  data)   restore_data; restore_prompts; run --prompt-minutes "$prompt_minutes" --gen-minutes "$gen_minutes" --data-only "$@" ;;
  more)   run --gen-minutes "$gen_minutes" --continue-generation --data-only "$@" ;;
  train)  run --max-minutes "$train_minutes" --reuse-data "$@" ;;
  finish) run --max-minutes "$finish_minutes" --reuse-data --eval --eval-source categories --eval-prompts "$eval_prompts" \
            --eval-batch-size 16 --eval-max-new-tokens 128 "$@" ;;
  pack)   dest="${OUT:?pack writes its pieces to \$OUT}"; name="$(basename "$out")"
          tar -C "$(dirname "$out")" -czf - "$name" | to_pieces "$name" "$out" ;;
  pack-prompts) dest="${OUT:?pack-prompts writes its pieces to \$OUT}"
          [ -f "$work/prompts.jsonl" ] || { echo "$work/prompts.jsonl is not there: run the data stage first" >&2; exit 1; }
          tar -C "$work" -czf - prompts.jsonl prompts.settings.json | to_pieces prompts "$work/prompts.jsonl" ;;
  pack-data) dest="${OUT:?pack-data writes its pieces to \$OUT}"
          [ -f "$work/data.pt" ] || { echo "$work/data.pt is not there: run the data stage first" >&2; exit 1; }
          files=()
          for f in "${data_files[@]}"; do if [ -f "$work/$f" ]; then files+=("$f"); fi; done
          tar -C "$work" -czf - "${files[@]}" | to_pieces data "$work/data.pt" ;;
  eval)   python -m specdec.train eval --target smollm2 --head "$out" --drafter "$head" --eval-source frozen \
            --eval-batch-size 16 --eval-max-new-tokens 128 --json "$out/eval_frozen.json" "$@" ;;
  *) echo "stage $stage is unknown; allowed: data, more, train, finish, eval, pack, pack-prompts, pack-data" >&2; exit 2 ;;
esac
