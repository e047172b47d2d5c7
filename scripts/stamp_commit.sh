#!/usr/bin/env bash
# Stamp the commit the GPU machine's copy will be, into .carry/wheels/ (carried with every
# device call): `commit` (git rev-parse HEAD), `manifest` (the tracked files under src, tests,
# scripts, examples) and `digest` (scripts/tree_digest.sh over them). scripts/gpu_check.sh then
# names that commit in CHECK.md without a hash typed by hand, and only when the tree it ran has
# that digest (a check once ran with a mistyped SPECDEC_COMMIT; a tree changed after the stamp
# shows as not verified). Refuses a tree with uncommitted or untracked changes there.
#   bash scripts/stamp_commit.sh      # right before the device calls (scripts/make_carry.sh runs it too)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dirs=(src tests scripts examples)
dirty=$(git status --porcelain -- "${dirs[@]}")
if [ -n "$dirty" ]; then
  echo "stamp_commit: commit first; changes under ${dirs[*]}:" >&2
  echo "$dirty" | head -10 >&2
  exit 1
fi
mkdir -p .carry/wheels
git rev-parse HEAD > .carry/wheels/commit
git ls-files -- "${dirs[@]}" > .carry/wheels/manifest
bash scripts/tree_digest.sh .carry/wheels/manifest > .carry/wheels/digest
echo "stamped $(cat .carry/wheels/commit) ($(wc -l < .carry/wheels/manifest) files, digest $(cut -c1-12 .carry/wheels/digest))"
