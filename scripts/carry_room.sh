# Sourced by scripts/make_carry.sh and scripts/carry_folder.sh (from the checkout's root):
# carry_room prints the bytes a device call has left beside the working tree and .carry/wheels.
# A call carries at most 64 MiB: the tracked and untracked-not-ignored files plus what `carry`
# names; 2 MiB stay free for files edited between now and the call.
carry_room() {
  local limit=$(( 64 * 1024 * 1024 )) margin=$(( 2 * 1024 * 1024 )) tree wheels
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
  wheels=$( (du -sb .carry/wheels 2>/dev/null || echo 0) | cut -f1)
  echo $(( limit - tree - wheels - margin ))
}
