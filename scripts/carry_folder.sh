#!/usr/bin/env bash
# Put a folder (a head, cached prompts, ...) into .carry/ in pieces that each fit one device call
# beside the working tree, for scripts/gpu_setup.sh to join on the GPU machine into
# /root/carried/NAME (scripts/join_carried.sh). A call carries at most 64 MiB with the tree,
# which leaves ~20 MiB (the tree is ~43 MiB with the shipped 29 MB head), so a 29 MB head
# travels as two pieces in two back-to-back calls (the machine keeps /root while warm).
#   bash scripts/carry_folder.sh NAME DIR     # -> .carry/NAME-0, .carry/NAME-1, ...; prints each call's carry list
# PIECE_BYTES overrides the piece size (default: the room a call leaves beside the tree and the wheels);
# CARRY_DIR the destination (default: .carry of this checkout).
set -euo pipefail
name="${1:?usage: scripts/carry_folder.sh NAME DIR}"
dir="${2:?usage: scripts/carry_folder.sh NAME DIR}"
[ -d "$dir" ] || { echo "carry_folder: $dir is not a folder" >&2; exit 1; }
[[ "$name" =~ ^[A-Za-z0-9_]+$ ]] || { echo "carry_folder: NAME $name must be letters, digits and _ (no - or .)" >&2; exit 1; }
dir="$(cd "$dir" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
carry="${CARRY_DIR:-$root/.carry}"
cd "$root"
source scripts/carry_room.sh
PIECE_BYTES="${PIECE_BYTES:-$(carry_room)}"
[ "$PIECE_BYTES" -gt 0 ] || { echo "carry_folder: no room beside the tree for a piece" >&2; exit 1; }
rm -rf "$carry/$name"-[0-9]*
tmp=$(mktemp -d)
tar -C "$(dirname "$dir")" -czf "$tmp/all.tgz" --transform "s,^$(basename "$dir"),$name," "$(basename "$dir")"
size=$(stat -c %s "$tmp/all.tgz")
split -b "$PIECE_BYTES" -d "$tmp/all.tgz" "$tmp/$name.tgz."
i=0
for f in "$tmp/$name".tgz.*; do
  mkdir -p "$carry/$name-$i"
  mv "$f" "$carry/$name-$i/"
  echo "$size" > "$carry/$name-$i/$name.size"  # in every piece's folder: the join needs it whichever comes first
  i=$((i + 1))
done
rm -rf "$tmp"
echo "$dir -> $i piece(s) of at most $(( PIECE_BYTES / 1048576 )) MiB ($size bytes in all), one call each, back to back:"
for ((k = 0; k < i; k++)); do
  echo "  carry [\".carry/wheels\", \"$(realpath --relative-to="$root" "$carry")/$name-$k\"]   then: source scripts/gpu_setup.sh  (joined: /root/carried/$name)"
done
