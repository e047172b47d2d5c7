"""Every Triton kernel compiles for an H100/H200 (sm_90), on any machine, GPU or not.

The CPU suite runs the kernels in Triton's interpreter, which accepts code the GPU compiler
rejects, and never sees the JIT's specializations (an int argument equal to 1 becomes a
constant: a one-node tree, N = 1, once crashed Triton 3.6's coalescing pass on the H200 while
every CPU test passed). `_sm90_compile.py` drives the real launchers at the tree sizes
N in {1, 2, 33, 64, 257}, the vocabularies 49152 / 128256 / 151936 / 1001 and the attention
launches the engine makes, and compiles each to a cubin with Triton's bundled ptxas. CI
installs the Triton the H200 runs (`scripts/env.sh`), so this is the GPU's compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from triton.backends.nvidia.compiler import get_ptxas

    HAS_PTXAS = os.path.exists(get_ptxas(90).path)
except Exception:  # noqa: BLE001 - a Triton build without the CUDA backend
    HAS_PTXAS = False

SCRIPT = Path(__file__).resolve().parents[1] / "_sm90_compile.py"  # the helper stays at tests/


@pytest.mark.skipif(not HAS_PTXAS, reason="this Triton build has no NVIDIA backend (ptxas) to compile with")
@pytest.mark.parametrize("family", ["verify", "tree", "kv", "attention", "linear"])
def test_kernels_compile_for_sm90_at_every_launch_shape(family, tmp_path):
    # A subprocess: under TRITON_INTERPRET=1 (set by conftest on CPU) `triton.jit` yields
    # interpreter objects that cannot be compiled. A fresh cache: compile, do not reuse.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    run = subprocess.run([sys.executable, str(SCRIPT), family], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.split("\n")
    assert f"compiled:{family}" in lines and sum(line.startswith("ok ") for line in lines) >= 4
