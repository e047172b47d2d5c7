# Sourced by scripts/gpu_setup.sh: keep the pieces of carried folders (scripts/carry_folder.sh:
# .carry/NAME-K/NAME.tgz.NN + NAME.size) in $PIECES across calls, and unpack a folder into
# $CARRIED/NAME once all its pieces are there. Defaults: /root/specdec-site/pieces, /root/carried.
carry_root="${CARRY_ROOT:-$root/.carry}"
pieces="${PIECES:-/root/specdec-site/pieces}"
carried="${CARRIED:-/root/carried}"
mkdir -p "$pieces" "$carried"
for piece in "$carry_root"/*/*.tgz.[0-9][0-9]; do
  [ -f "$piece" ] || continue
  piece_name="$(basename "$piece")"
  folder_name="${piece_name%.tgz.*}"
  [ -f "$(dirname "$piece")/$folder_name.size" ] || continue  # not a carry_folder piece
  cp "$piece" "$(dirname "$piece")/$folder_name.size" "$pieces/"
done
for size_file in "$pieces"/*.size; do
  [ -f "$size_file" ] || continue
  folder_name="$(basename "$size_file" .size)"
  [ -d "$carried/$folder_name" ] && { echo "carried folder ready: $carried/$folder_name"; continue; }
  want=$(cat "$size_file")
  have=$(cat "$pieces/$folder_name".tgz.[0-9][0-9] 2>/dev/null | wc -c)
  if [ "$have" -eq "$want" ]; then
    cat "$pieces/$folder_name".tgz.[0-9][0-9] | tar -xzf - -C "$carried"
    echo "carried folder ready: $carried/$folder_name"
  else
    echo "carried folder $folder_name: $have of $want bytes (carry its other pieces)"
  fi
done
