"""Registers and spills of `_paged_attention_kernel` per launch shape and config, from ptxas on
the CPU (the compile-only driver of tests/_sm90_compile.py). Run without TRITON_INTERPRET."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import _sm90_compile as S
import torch
from specdec.kernels import tree_attention as ta
I64 = torch.int64
block_size, blocks = 16, 72
for (dtype, (H, hkv, hd), B, T, tree, splits) in [
    (torch.bfloat16, (32, 8, 128), 1, 1, True, 9),
    (torch.bfloat16, (32, 8, 128), 1, 61, True, 9),
    (torch.bfloat16, (32, 8, 128), 1, 6, True, 9),
    (torch.bfloat16, (9, 3, 64), 1, 49, True, 9),
]:
    k_rows = torch.empty(blocks * block_size + 1, hkv, hd, dtype=dtype)
    q = torch.empty(B, T, H, hd, dtype=dtype)
    q_len = torch.full((B,), T, dtype=I64)
    mask = torch.zeros(B, T, -(-T // 32), dtype=torch.int32) if tree else None
    ta.paged_attention_triton(q, k_rows, k_rows, torch.zeros(B, blocks, dtype=I64), torch.arange(B, dtype=I64),
                              torch.zeros(B, dtype=I64), q_len, q_len if tree else None, mask, None, block_size, 0.088,
                              0, splits, False)
    k = S.LAST["_paged_attention_kernel"]
    md = k.metadata
    import subprocess, tempfile, os
    from triton.backends.nvidia.compiler import get_ptxas
    ptx = k.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.ptx"), "w").write(ptx)
        r = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.o")], capture_output=True, text=True)
        info = " | ".join(l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
    print(f"H={H}/{hkv} hd={hd} T={T} rows={T*H//hkv} BLOCK_M={ta._block_m(T*H//hkv)}: "
          f"shared {md.shared} warps {md.num_warps} stages {md.num_stages} :: {info}")
print("--- variants")
VARIANTS = [dict(BLOCK_N=bn, num_warps=w, num_stages=st, COMMITTED_FIRST=cf) for bn, w, st, cf in
            ((64, 4, 2, True), (16, 4, 2, True), (16, 4, 2, False), (32, 4, 2, True), (16, 4, 3, True))]
for cfg in VARIANTS:
    ta._fixed_config = lambda *_, cfg=cfg: cfg
    for T in (1, 61):
        H, hkv, hd, B = 32, 8, 128, 1
        dtype = torch.bfloat16
        k_rows = torch.empty(blocks * block_size + 1, hkv, hd, dtype=dtype)
        q = torch.empty(B, T, H, hd, dtype=dtype)
        q_len = torch.full((B,), T, dtype=I64)
        mask = torch.zeros(B, T, -(-T // 32), dtype=torch.int32)
        ta.paged_attention_triton(q, k_rows, k_rows, torch.zeros(B, blocks, dtype=I64), torch.arange(B, dtype=I64),
                                  torch.zeros(B, dtype=I64), q_len, q_len, mask, None, block_size, 0.088, 0, 9, False)
        k = S.LAST["_paged_attention_kernel"]
        import subprocess, tempfile, os
        from triton.backends.nvidia.compiler import get_ptxas
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "k.ptx"), "w").write(k.asm["ptx"])
            r = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k.o")], capture_output=True, text=True)
            info = " | ".join(l.strip() for l in r.stderr.splitlines() if "registers" in l or "spill" in l)
        print(cfg, "T", T, "shared", k.metadata.shared, "::", info)
