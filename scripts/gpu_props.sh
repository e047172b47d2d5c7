#!/usr/bin/env bash
# The GPU property suites (hypothesis `gpu` profile: 500 examples per property, kernels
# compiled for the GPU) in five named parts, each bounded by 8 minutes (tests not started by 7
# are skipped and counted) so one part fits one 10-minute command on the GPU machine (issue 19).
# Only `tools` needs the SmolLM2 GGUF assembled (tests/models/test_smollm2.py loads it): the other
# parts can run in the calls that carry its three parts (scripts/gpu_setup.sh).
#
#   bash scripts/gpu_props.sh attention  # the attention kernels vs their references (test_attention.py:
#                                        # its four slowest properties alone held 832 s of calls at 3659094)
#   bash scripts/gpu_props.sh kernels    # the other Triton kernels and sampling vs their references
#   bash scripts/gpu_props.sh drafters   # draft heads, checkpoints, tree policies, capture, TTT, the kit
#   bash scripts/gpu_props.sh tools      # CLI, server, benches' smoke runs, training, SmolLM2, packaging
#   bash scripts/gpu_props.sh engine     # every other test file (engine, step, scheduling, models, ...)
#   bash scripts/gpu_props.sh tools engine   # several parts side by side in one call (as first timed)
#
# First timing on the H200 (2026-12-03, three parts then): kernels 474 s with one property at
# 347 s (capped since), drafters 126 s, engine over 480 s (701 tests passed by then): hence
# four parts. Writes $OUT/props_<part>.log (with the 25 slowest tests, to rebalance the parts)
# and prints one summary line with the part's time.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
list="${GPU_PROPS_LIST:-}"  # 1: print the part's test files and exit (tests/test_gpu_parts.py checks the parts)
if [ -z "$list" ] && [ -z "${GPU_PROPS_SETUP:-}" ]; then  # once: parts run side by side inherit the environment
  source "$root/scripts/gpu_setup.sh" > /tmp/gpu_props_setup.txt
  export GPU_PROPS_SETUP="$(cat /tmp/gpu_props_setup.txt)"
fi
setup="${GPU_PROPS_SETUP:-}"
if [ $# -gt 1 ]; then  # several parts side by side on the one GPU (8 workers each): two parts per call
  pids=()
  export GPU_PARTS_SIDE_BY_SIDE=$#  # each part's workers get their share of the CPU cores (gpu_sched.sh)
  for p in "$@"; do bash "$root/scripts/gpu_props.sh" "$p" & pids+=($!); done
  rc=0
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  exit $rc
fi
part="${1:?usage: gpu_props.sh attention|kernels|drafters|tools|engine}"  # after the setup: it must not see this name
cd "$root"
attention=(tests/runtime/test_attention.py)
kernels=(tests/runtime/test_kv_cache.py tests/kernels/test_kv_relocate.py tests/kernels/test_kv_write.py
         tests/kernels/test_tree_build.py tests/kernels/test_verify_greedy.py tests/kernels/test_verify_sampling.py
         tests/kernels/test_sample_rule.py tests/kernels/test_sampling_distribution.py tests/kernels/test_sampling_probs.py
         tests/plugins/test_typical_verifier.py tests/kernels/test_kernel_shapes.py tests/kernels/test_kernel_launch.py
         tests/kernels/test_rope_kv_write.py)
drafters=(tests/drafters/test_eagle3_conventions.py tests/drafters/test_eagle3_dense_after_acceptance.py
          tests/drafters/test_eagle3_drafter.py tests/drafters/test_eagle3_tree.py tests/drafters/test_mtp_drafter.py
          tests/policies/test_tree_policies.py tests/models/test_capture.py tests/train/test_train_ttt.py
          tests/test_fuzz_inputs.py tests/entrypoints/test_stop_strings.py tests/models/test_tensor_parallel.py
          tests/drafters/test_eagle3_checkpoint.py tests/plugins/test_eagle3_plugin.py tests/drafters/test_eagle3_sampling.py
          tests/drafters/test_mtp_checkpoint.py tests/drafters/test_mtp_model.py tests/drafters/test_mtp_decoding.py
          tests/drafters/test_ngram_drafter.py tests/drafters/test_ngram_decoding.py tests/drafters/test_draft_layers.py
          tests/engine/test_drafter_inputs.py tests/testing/test_conformance_kit.py tests/testing/test_conformance_kit_planted.py)
tools=(tests/entrypoints/test_cli.py tests/entrypoints/test_cli_startup.py tests/test_bench_smoke.py
       tests/test_bench_instrumentation.py tests/entrypoints/test_first_contact.py tests/entrypoints/test_server.py
       tests/models/test_smollm2.py tests/test_launch_counts.py tests/test_packaging.py tests/test_many_decoders.py
       tests/kernels/test_kernels_compile_sm90.py tests/models/test_loader.py tests/models/test_corrupt_checkpoints.py)
for f in tests/train/test_train_*.py; do  # the training suites, but TTT's, which drafters runs
  [[ " ${drafters[*]} " == *" $f "* ]] || tools+=("$f")
done
shopt -s globstar  # tests/**/: the test files sit in folders named after the source package they test
case "$part" in
  attention) files=("${attention[@]}") ;;
  kernels) files=("${kernels[@]}") ;;
  drafters) files=("${drafters[@]}") ;;
  tools) files=("${tools[@]}") ;;
  engine)
    files=()
    for f in tests/**/test_*.py; do  # every folder, tests/ itself included
      [[ " ${attention[*]} ${kernels[*]} ${drafters[*]} ${tools[*]} " == *" $f "* ]] || files+=("$f")
    done ;;
  *) echo "unknown part '$part'; allowed: attention, kernels, drafters, tools, engine" >&2; exit 2 ;;
esac
if [ -n "$list" ]; then
  printf '%s\n' "${files[@]}"
  exit 0
fi
if [ "$part" = tools ] && [[ "$setup" != *"GGUF ready"* ]]; then
  echo "gpu_props tools needs the SmolLM2 GGUF (tests/models/test_smollm2.py loads it); scripts/gpu_setup.sh says: $setup" >&2
  exit 2
fi
out="${OUT:-/tmp/out}"; mkdir -p "$out"
start=$SECONDS
# Tests spread one by one (--dist load), not file by file: under loadfile one file's tests
# run in turn on one worker (test_attention.py held the kernels part past 8 minutes; the
# engine part's test_compiled_step.py holds ~6 minutes); a module fixture is then built once
# per worker that runs a test of the module, which costs time but not wall time.
# Tests that would start after 420 s (PROPS_DEADLINE_S) are skipped (tests/_timebox.py), so pytest ends on its
# own with its summary and slowest tests; every failure and duration is also written to
# props_<part>.jsonl as it happens. The timeout is the last resort (SIGINT at 510 s).
# Longest first, the first tests one per worker (scripts/gpu_sched.sh): the slowest properties
# start at once on separate workers.
source "$root/scripts/gpu_sched.sh"
rm -f "$out/props_$part.jsonl"
SPECDEC_TEST_DEADLINE=$(( $(date +%s) + ${PROPS_DEADLINE_S:-420} )) SPECDEC_TEST_REPORT="$out/props_$part.jsonl" \
HYPOTHESIS_PROFILE=gpu timeout -s INT -k 30 510 python -m pytest -q -p no:cacheprovider -n 8 "${sched[@]}" --durations=25 \
  -rfEs "${files[@]}" > "$out/props_$part.log" 2>&1
rc=$?
summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$out/props_$part.log" | tail -1)  # pytest's last line
late=$(grep -c 'session deadline' "$out/props_$part.jsonl" 2>/dev/null)
[ "${late:-0}" -gt 0 ] && summary="$late tests not started by the ${PROPS_DEADLINE_S:-420} s deadline; $summary" && rc=1
echo "gpu_props $part: rc $rc, $((SECONDS - start)) s, ${#files[@]} files, $OMP_NUM_THREADS CPU threads per worker: $summary"
grep '"outcome": "failed"' "$out/props_$part.jsonl" 2>/dev/null | cut -c1-400
exit $rc
