"""Registers and spills of `_paged_attention_kernel` per launch config at the tree-verify and
decode shapes, from ptxas on the CPU (the compile-only driver of tests/_sm90_compile.py; no GPU).
Run without TRITON_INTERPRET:  python notes/gpu/issue20/attention_registers.py"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import _sm90_compile as S  # noqa: E402  (patches triton to compile for sm_90 without a GPU)
import torch  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402

from specdec.kernels import tree_attention as ta  # noqa: E402

I64 = torch.int64
BLOCK_SIZE, BLOCKS = 16, 72
# label -> (BLOCK_N, warps, stages, BLOCK_N_C, MASKLESS_C)
CONFIGS = {"64x4x2": (64, 4, 2, 64, False), "16x4x2": (16, 4, 2, 16, False), "16x4x2c64": (16, 4, 2, 64, False),
           "16x4x2c64m": (16, 4, 2, 64, True), "32x4x2c64m": (32, 4, 2, 64, True), "64x4x2m": (64, 4, 2, 64, True),
           "64x8x2m": (64, 8, 2, 64, True), "16x4x2c32m": (16, 4, 2, 32, True)}
SHAPES = (((32, 8, 128), 61), ((32, 8, 128), 1), ((9, 3, 64), 49))  # (H, Hkv, hd), query rows


def ptxas_info(kernel) -> str:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(kernel.asm["ptx"])
        r = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", os.path.join(d, "k.ptx"), "-o",
                            os.path.join(d, "k.o")], capture_output=True, text=True)
    return " | ".join(line.split(":", 1)[-1].strip() for line in r.stderr.splitlines()
                      if "registers" in line or "spill" in line)


fixed = ta._fixed_config
for (H, hkv, hd), T in SHAPES:
    for label, (bn, warps, stages, bnc, maskless) in CONFIGS.items():
        ta._fixed_config = lambda *_, c=dict(BLOCK_N=bn, num_warps=warps, num_stages=stages, BLOCK_N_C=bnc,  # noqa: E731
                                             MASKLESS_C=maskless, COMMITTED_FIRST=True): dict(c)
        k_rows = torch.empty(BLOCKS * BLOCK_SIZE + 1, hkv, hd, dtype=torch.bfloat16)
        q_len = torch.full((1,), T, dtype=I64)
        ta.paged_attention_triton(
            torch.empty(1, T, H, hd, dtype=torch.bfloat16), k_rows, k_rows, torch.zeros(1, BLOCKS, dtype=I64),
            torch.zeros(1, dtype=I64), torch.zeros(1, dtype=I64), q_len, q_len,
            torch.zeros(1, T, -(-T // 32), dtype=torch.int32), None, BLOCK_SIZE, 0.088, 0, 4, 128, bn, bnc, maskless,
            False)
        kernel = S.LAST["_paged_attention_kernel"]
        print(f"H={H}/{hkv} hd={hd} T={T:3d} {label:11s} shared {kernel.metadata.shared:6d} :: {ptxas_info(kernel)}",
              flush=True)
ta._fixed_config = fixed
