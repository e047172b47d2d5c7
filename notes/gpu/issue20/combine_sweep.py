"""Issue 20: where the split-KV combine's time goes at the 8B tree verify (H100 measured 0.25 ms a
step for its 38 calls at 929c921). Times the paged attention (all 32 layers, CUDA graph, bf16,
batch 1, tree N=61, the engine's 4224-key bound) at each key-split count and each combine
rows-per-program, side by side (1 split: no combine; the combine's own time is not separable
from the forward, so the totals are compared).
    cd examples && python ../notes/gpu/issue20/combine_sweep.py --context 1024 4096"""
import argparse

import torch

from bench_attention import LAYOUTS, bs1_cache, bs1_cases, graph_timed
from specdec.kernels import tree_attention
from specdec.kernels.tree_attention import paged_attention

p = argparse.ArgumentParser()
p.add_argument("--context", type=int, nargs="+", default=[1024, 4096])
p.add_argument("--layout", default="8b")
p.add_argument("--nodes", type=int, default=61)
p.add_argument("--bound", type=int, default=4224)
p.add_argument("--splits", type=int, nargs="+", default=[0, 1, 2, 4, 6, 8])
p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
args = p.parse_args()
L, H, Hkv, hd = LAYOUTS[args.layout]
dev = torch.device("cuda")
gen = torch.Generator().manual_seed(0)
cache = bs1_cache(L, Hkv, hd, args.bound, max(args.context), args.nodes, dev, torch.bfloat16)
before = tree_attention._combine_rows
print(f"{torch.cuda.get_device_name()} layout {args.layout} bf16 bs1; graph ms per forward over {L} layers")
print(f"{'case':7} {'ctx':>5} {'splits':>6} " + " ".join(f"{'rows ' + str(r):>8}" for r in args.rows))
for ctx in args.context:
    for name, (batch, T) in bs1_cases(cache, ctx, args.nodes, args.bound, gen, dev).items():
        q = torch.randn(1, T, H, hd, generator=gen).to(dev, torch.bfloat16)
        for sp in args.splits:
            cells = []
            for r in args.rows:
                tree_attention._combine_rows = lambda r=r: r
                try:
                    ms = graph_timed(lambda: [paged_attention(q, cache, layer, batch, scale=hd**-0.5,
                                                              num_splits=sp or None) for layer in range(L)], 30, dev)
                finally:
                    tree_attention._combine_rows = before
                cells.append(f"{ms:8.3f}" if ms is not None else f"{'-':>8}")
            label = "chosen" if sp == 0 else str(sp)
            print(f"{name:7} {ctx:5d} {label:>6} " + " ".join(cells), flush=True)
