#!/usr/bin/env bash
# One GPU call: the property suites under the `gpu` hypothesis profile, then the kernel and
# model benchmarks, each under its own time limit; logs go to $OUT, a summary prints last.
source "$(dirname "$0")/gpu_setup.sh"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
summary=()
run() {  # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$out/$name.log" 2>&1; local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(grep -E 'passed|failed|error' "$out/$name.log" | tail -1)")")
}
export HYPOTHESIS_PROFILE=gpu
run tests_ops 130 python -m pytest -q -p no:cacheprovider tests/test_tree_build.py tests/test_verify_greedy.py tests/test_sample_rule.py tests/test_sampling_probs.py tests/test_tree_kernels_compile.py tests/test_tree_ops_compile.py
run tests_sampling 110 python -m pytest -q -p no:cacheprovider tests/test_verify_sampling.py tests/test_sampling_distribution.py
run tests_runtime 120 python -m pytest -q -p no:cacheprovider tests/test_kv_cache.py tests/test_kv_relocate.py tests/test_attention.py
run tests_models 60 python -m pytest -q -p no:cacheprovider tests/test_models_parity.py tests/test_capture.py tests/test_generate_lossless.py
run bench_ops 90 python examples/bench_ops.py
run bench_attention 80 python examples/bench_attention.py --impls triton,flex
run bench_target 120 python examples/bench_target.py --batch-sizes 1 8 --compile off
for f in "$out"/bench_*.log; do echo "=== $f"; tail -n 30 "$f"; done
printf '%s\n' "${summary[@]}"
