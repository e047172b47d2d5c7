# Sourced by scripts/gpu_setup.sh: keep the pieces of carried folders (scripts/carry_folder.sh:
# .carry/NAME-K/NAME.tgz.NN + NAME.size) in $PIECES across calls, and unpack a folder into
# $CARRIED/NAME once all its pieces are there. Defaults: /root/specdec-site/pieces, /root/carried.
# Its variables are prefixed jc_: the scripts that source gpu_setup.sh read its own (have, want).
jc_carry_root="${CARRY_ROOT:-$root/.carry}"
jc_pieces="${PIECES:-/root/specdec-site/pieces}"
jc_carried="${CARRIED:-/root/carried}"
mkdir -p "$jc_pieces" "$jc_carried"
for jc_piece in "$jc_carry_root"/*/*.tgz.[0-9][0-9]; do
  [ -f "$jc_piece" ] || continue
  jc_piece_name="$(basename "$jc_piece")"
  jc_folder_name="${jc_piece_name%.tgz.*}"
  [ -f "$(dirname "$jc_piece")/$jc_folder_name.size" ] || continue  # not a carry_folder piece
  cp "$jc_piece" "$(dirname "$jc_piece")/$jc_folder_name.size" "$jc_pieces/"
done
for jc_size_file in "$jc_pieces"/*.size; do
  [ -f "$jc_size_file" ] || continue
  jc_folder_name="$(basename "$jc_size_file" .size)"
  [ -d "$jc_carried/$jc_folder_name" ] && { echo "carried folder ready: $jc_carried/$jc_folder_name"; continue; }
  jc_want=$(cat "$jc_size_file")
  jc_have=$(cat "$jc_pieces/$jc_folder_name".tgz.[0-9][0-9] 2>/dev/null | wc -c)
  if [ "$jc_have" -eq "$jc_want" ]; then
    cat "$jc_pieces/$jc_folder_name".tgz.[0-9][0-9] | tar -xzf - -C "$jc_carried"
    echo "carried folder ready: $jc_carried/$jc_folder_name"
  else
    echo "carried folder $jc_folder_name: $jc_have of $jc_want bytes (carry its other pieces)"
  fi
done
