#!/usr/bin/env bash
# One H200 call for the compiled step: its CUDA tests (graphs = eager token for token, no
# host sync inside a step, no re-capture / recompile over 1,000 tokens), the attention
# kernel's GPU tests, then (when asked) the benchmarks. Logs go to $OUT, a summary prints last.
#   bash scripts/gpu_compiled.sh tests more       # CUDA tests only (~5 min)
#   bash scripts/gpu_compiled.sh cycle            # + examples/bench_cycle.py (8B shape, random weights)
#   bash scripts/gpu_compiled.sh e2e              # examples/bench_e2e.py, bf16 (needs the assembled GGUF)
#   bash scripts/gpu_compiled.sh e2e32            # the specdec rows in fp32: identical outputs must be n/n
source "$(dirname "$0")/gpu_setup.sh"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
summary=()
run() {  # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee "$out/$name.log" | grep -E "^\||passed|failed|error|Error|ms/step|tok/s" | tail -40
  local rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-24s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(grep -E 'passed|failed|error' "$out/$name.log" | tail -1)")")
}
for what in "$@"; do
  case "$what" in
    tests) run tests_compiled 230 python -m pytest -q -p no:cacheprovider tests/engine/test_compiled_step.py ;;
    more)
      run tests_attention_gpu 60 python -m pytest -q -p no:cacheprovider tests/runtime/test_attention.py -k "cuda or graph or compile"
      run tests_lossless 70 python -m pytest -q -p no:cacheprovider -x tests/entrypoints/test_generate_lossless.py tests/drafters/test_ngram_decoding.py
      ;;
    cycle) run bench_cycle 240 python examples/bench_cycle.py --profile --out "$out/bench_cycle.jsonl" ;;
    e2e) run bench_e2e 470 python examples/bench_e2e.py --hf-eager-prompts 3 --out "$out/bench_e2e.jsonl" ;;
    e2e32) run bench_e2e_fp32 130 python examples/bench_e2e.py --dtype float32 --hf-eager-prompts 2 --num-prompts 8 \
             --setups target-only eagle3-chain eagle3-tree mtp-chain ngram-chain hf-eager --out "$out/bench_e2e_fp32.jsonl" ;;
  esac
done
printf '%s\n' "${summary[@]}"
