#!/usr/bin/env bash
# Which commit is this tree? A digest of the files a manifest lists (one path per line, relative
# to the repository root): the sha256 of their sha256 lines, in the manifest's order.
#   bash scripts/tree_digest.sh MANIFEST               # print the digest (scripts/stamp_commit.sh)
#   bash scripts/tree_digest.sh --verify STAMP COMMIT  # one line: is this tree the stamped commit,
#                                                      # and is that COMMIT? (scripts/gpu_check.sh)
# STAMP: the folder scripts/stamp_commit.sh wrote (commit, manifest, digest).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

digest() {  # digest MANIFEST (absolute path)
  (cd "$root" && tr '\n' '\0' < "$1" | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

if [ "${1:-}" = "--verify" ]; then
  stamp=$2 commit=$3
  if [ ! -f "$stamp/digest" ] || [ ! -f "$stamp/manifest" ] || [ ! -f "$stamp/commit" ]; then
    echo "tree not verified (no stamp: bash scripts/stamp_commit.sh before the device calls)"
  elif [ "$(digest "$(cd "$stamp" && pwd)/manifest" 2>/dev/null || echo unreadable)" != "$(cat "$stamp/digest")" ]; then
    echo "TREE NOT VERIFIED: its tracked source differs from the stamped commit $(cut -c1-12 "$stamp/commit") (changed after the stamp?)"
  elif [ "$commit" != "$(cat "$stamp/commit")" ]; then
    echo "TREE NOT VERIFIED: the commit named ($commit) is not the stamped one, $(cat "$stamp/commit"), whose source this tree is"
  else
    echo "tree verified: its tracked source under src, tests, scripts, examples is that commit's ($(wc -l < "$stamp/manifest") files, scripts/stamp_commit.sh)"
  fi
  exit 0
fi
digest "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
