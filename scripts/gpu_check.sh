#!/usr/bin/env bash
# The GPU check: run it on the H200 at the commit you land, before landing any change to
# kernels/, ops, runtime, models, drafters, policies, the step or the engine (CI has no GPU,
# so nothing else checks the GPU path). One command, at most 8 minutes:
#
#   1. every CUDA test: `pytest -m gpu` (compiled kernels at every tree size, compiled step and
#      CUDA graphs = eager token for token, one host sync per step, many decoders in one
#      process, ...), 6 workers (4 took 269 s of the part's 280 at 3f95bf1), the 15 slowest
#      tests listed in the log;
#   2. the SmolLM2 smoke (scripts/gpu_smoke.py): every drafter, target-only included, in
#      float32 (greedy output must equal target-only token for token) and bfloat16, tok/s.
#
# Writes CHECK.md ($OUT/CHECK.md on the device machine; commit it as notes/gpu/CHECK.md): its
# first line `commit <full hash>`, pass/fail per part, the tok/s table, the time it took.
# On the device machine (after the GGUF parts arrived, scripts/gpu_setup.sh):
#   SPECDEC_COMMIT=<hash of HEAD> bash scripts/gpu_check.sh
source "$(dirname "$0")/gpu_setup.sh"
out="${OUT:-/tmp/out}"; mkdir -p "$out"
commit="${SPECDEC_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}"
start=$SECONDS
parts=()
failed=0
part() {  # part NAME SECONDS LOG CMD...: run one part under a time limit, record its result
  local name=$1 secs=$2 log=$3; shift 3
  local t0=$SECONDS
  # SIGINT at the limit: pytest still writes its summary and slowest tests (SIGKILL 20 s later)
  timeout -s INT -k 20 "$secs" "$@" > "$out/$log" 2>&1; local rc=$?
  local summary; summary=$(grep -E "passed|failed|error" "$out/$log" | tail -1)
  [ $rc -eq 124 ] && summary="timed out after ${secs} s; $summary"
  local result=pass; [ $rc -ne 0 ] && { result=FAIL; failed=1; }
  parts+=("| $name | $result | $((SECONDS - t0)) s | ${summary:-rc $rc} |")
  echo "== $name: $result ($((SECONDS - t0)) s) ${summary}"
}
part "CUDA tests (pytest -m gpu, 6 workers)" 280 tests_gpu.log \
  python -m pytest -q -p no:cacheprovider -m gpu -n 6 --dist load --durations=15 tests/
part "SmolLM2 smoke: every drafter, fp32 exact + bf16" 200 smoke.log \
  python scripts/gpu_smoke.py --out "$out/smoke.json"
verdict=PASS; [ $failed -ne 0 ] && verdict=FAIL
{
  echo "commit $commit"
  echo
  echo "# GPU check: $verdict"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(python -c 'import torch, triton, transformers; print(torch.cuda.get_device_name(), "· torch", torch.__version__, "· triton", triton.__version__, "· transformers", transformers.__version__)')."
  echo "Command: \`SPECDEC_COMMIT=$commit bash scripts/gpu_check.sh\`; took $((SECONDS - start)) s."
  echo
  echo "| part | result | time | summary |"
  echo "|---|---|---|---|"
  printf '%s\n' "${parts[@]}"
  echo
  python -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["table"]); print(); [print("- FAIL", f) for f in d["failures"]]' "$out/smoke.json" 2>/dev/null \
    || echo "(no smoke summary: see smoke.log)"
  echo
  echo "Failed tests (if any):"
  grep -E "^(FAILED|ERROR) " "$out/tests_gpu.log" | head -30 || true
} > "$out/CHECK.md"
cat "$out/CHECK.md"
exit $failed
