"""One tree-verify launch of the paged-attention kernel (8B layout: 32/8 heads, hd 128, bf16,
61 nodes over 1024 committed keys, bs 1), for a profiler:

    ncu --kernel-name regex:_paged_attention --launch-skip 3 --launch-count 1 --set full \
        python notes/gpu/issue20/ncu_tree.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from bench_attention import random_tree  # noqa: E402

from specdec.kernels.tree_attention import paged_attention  # noqa: E402
from specdec.runtime.batch import tree_batch  # noqa: E402
from specdec.runtime.kv_cache import PagedKVCache  # noqa: E402

ctx, N, H, hkv, hd = 1024, 61, 32, 8, 128
device = torch.device("cuda")
cache = PagedKVCache(1, hkv, hd, max_batch_size=1, max_seq_len=ctx + N + 64, block_size=16, device=device,
                     dtype=torch.bfloat16)
cache.reserve(0, ctx + N + 64)
cache.storage.normal_()
gen = torch.Generator().manual_seed(0)
batch = tree_batch(cache, torch.full((1,), ctx, device=device), random_tree(1, N, 8, gen, device),
                   torch.full((1,), N, device=device), max_kv_len=ctx + N)
q = torch.randn(1, N, H, hd, generator=gen).to(device, torch.bfloat16)
for _ in range(5):
    paged_attention(q, cache, 0, batch, scale=hd**-0.5)
torch.cuda.synchronize()
print("ok")
