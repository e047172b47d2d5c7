#!/usr/bin/env bash
# The GPU property suites (hypothesis `gpu` profile: 500 examples per property, kernels
# compiled for the GPU) in three named parts, each bounded by 8 minutes so one part fits one
# 10-minute command on the GPU machine (issue 19). On the device machine, after
# scripts/gpu_setup.sh:
#
#   bash scripts/gpu_props.sh kernels    # Triton kernels and sampling vs their references
#   bash scripts/gpu_props.sh drafters   # draft heads, tree policies, capture, TTT, fuzzed inputs
#   bash scripts/gpu_props.sh engine     # every other test file (engine, step, server, ...)
#
# Writes $OUT/props_<part>.log (with the 25 slowest tests, to rebalance the parts) and prints
# one summary line with the part's time.
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/gpu_setup.sh" > /dev/null
part="${1:?usage: gpu_props.sh kernels|drafters|engine}"  # after the setup: it must not see this name
cd "$root"
kernels=(tests/test_attention.py tests/test_kv_cache.py tests/test_kv_relocate.py tests/test_kv_write.py
         tests/test_tree_build.py tests/test_verify_greedy.py tests/test_verify_sampling.py tests/test_sample_rule.py
         tests/test_sampling_distribution.py tests/test_sampling_probs.py tests/test_typical_verifier.py
         tests/test_kernel_shapes.py)
drafters=(tests/test_eagle3_conventions.py tests/test_eagle3_dense_after_acceptance.py tests/test_eagle3_drafter.py
          tests/test_eagle3_tree.py tests/test_mtp_drafter.py tests/test_tree_policies.py tests/test_capture.py
          tests/test_train_ttt.py tests/test_fuzz_inputs.py tests/test_stop_strings.py tests/test_tensor_parallel.py)
case "$part" in
  kernels) files=("${kernels[@]}") ;;
  drafters) files=("${drafters[@]}") ;;
  engine)
    files=()
    for f in tests/test_*.py; do
      [[ " ${kernels[*]} ${drafters[*]} " == *" $f "* ]] || files+=("$f")
    done ;;
  *) echo "unknown part '$part'; allowed: kernels, drafters, engine" >&2; exit 2 ;;
esac
out="${OUT:-/tmp/out}"; mkdir -p "$out"
start=$SECONDS
# SIGINT at the limit: pytest still prints its summary and the slowest tests (SIGKILL 30 s later)
HYPOTHESIS_PROFILE=gpu timeout -s INT -k 30 480 python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=25 "${files[@]}" \
  > "$out/props_$part.log" 2>&1
rc=$?
summary=$(grep -E "passed|failed|error" "$out/props_$part.log" | tail -1)
[ $((SECONDS - start)) -ge 480 ] && summary="timed out after 480 s; $summary"
echo "gpu_props $part: rc $rc, $((SECONDS - start)) s, ${#files[@]} files: $summary"
exit $rc
