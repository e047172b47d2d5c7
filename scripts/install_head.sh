#!/usr/bin/env bash
# Install a head trained on the GPU machine as a shipped one, from the pieces a device call brought
# back (`train_smollm2_parts.sh pack`: NAME.tgz.00, .01, ...), quickly enough to send the next call
# (its end-to-end timing, the GPU check) before the warm machine goes back (30 s after a call):
#   bash scripts/install_head.sh FILES_AT NAME ALIAS      # ALIAS: smollm2-mtp or smollm2-eagle3
# Unpacks NAME into $KEEP (default /work/keep/heads/NAME), saves the shipped head as the baseline
# of the next end-to-end run ($BASE, default .carry/base_ALIAS/ALIAS: ignored by git, carried with
# `carry` [".carry/base_ALIAS"]), then copies the new head's weights and config over the shipped
# ones: config.json, model.safetensors, draft_vocab.safetensors (when the new head has one; a head
# without one loses the shipped one). The folder's TRAINING.md and evaluations stay until they are
# rewritten for the new head. Refuses a head of another kind than the shipped one (`head_kind`, as
# the CLI reads a head folder's config.json).
set -euo pipefail
usage="usage: scripts/install_head.sh FILES_AT NAME ALIAS"
files="${1:?$usage}"; name="${2:?$usage}"; alias="${3:?$usage}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shipped="$root/src/specdec/assets/heads/$alias"
[ -f "$shipped/config.json" ] || { echo "install_head: $alias is not a shipped head (no $shipped/config.json)" >&2; exit 1; }
compgen -G "$files/$name.tgz.*" > /dev/null || { echo "install_head: no $name.tgz.* pieces in $files" >&2; exit 1; }
keep="${KEEP:-/work/keep/heads}"
base="${BASE:-$root/.carry/base_$alias}"
rm -rf "${keep:?}/$name" && mkdir -p "$keep"
cat "$files/$name".tgz.* | tar -xzf - -C "$keep"
new="$keep/$name"
[ -f "$new/config.json" ] && [ -f "$new/model.safetensors" ] || {
  echo "install_head: $new holds no config.json and model.safetensors" >&2; exit 1; }
kind() {  # the drafter a head folder is for, as the CLI reads it (no torch import)
  PYTHONPATH="$root/src:${PYTHONPATH:-}" python3 -c 'import sys, pathlib
from specdec.entrypoints.cli import head_kind
print(head_kind(pathlib.Path(sys.argv[1])))' "$1"; }
new_kind=$(kind "$new"); shipped_kind=$(kind "$shipped")
[ "$new_kind" = "$shipped_kind" ] || {
  echo "install_head: $name is a head of kind $new_kind, $alias of kind $shipped_kind" >&2; exit 1; }
rm -rf "${base:?}" && mkdir -p "$base" && cp -r "$shipped" "$base/$alias"
for f in config.json model.safetensors draft_vocab.safetensors; do
  if [ -f "$new/$f" ]; then cp "$new/$f" "$shipped/$f"; else rm -f "$shipped/$f"; fi
done
echo "installed $name as $alias (was: $base/$alias)"
