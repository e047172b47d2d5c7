"""Issue 20: the 8B tree verify's attention under other query tiles (BLOCK_M), warps and key
splits, timed beside the kernel's own choice before any lands. The tree row (N=61, 1k) is
0.076 ms a step short of R 1.45 and its attention takes 0.528 ms of the step; the launch
configs (BLOCK_N x warps x stages) are within 3% of each other (attn_cfg_s24/), but the query
tile was never varied: 244 query-head rows per KV head go in 4 tiles of 64 today, each
re-reading the same K/V. Here each run swaps the module's `_block_m` (and, through
`bench_attention.launch_config`, the warps), so the library is untouched.
Times all layers of one forward (CUDA graph, bf16, batch 1, the engine's 4224-key bound), and
the largest output difference from today's.
    python notes/gpu/issue20/blockm_sweep.py --context 1024 4096
On the CPU (TRITON_INTERPRET=1) it checks the variants' outputs only (--layout tiny)."""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from bench_attention import SWEEP_LAYOUTS, bs1_cache, bs1_cases, bs1_parser, graph_timed, launch_config  # noqa: E402
from specdec.kernels import tree_attention  # noqa: E402

p = bs1_parser(__doc__)
p.add_argument("--block-m", type=int, nargs="+", default=[32, 64, 128])
p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
p.add_argument("--splits", type=int, nargs="+", default=[0, 2, 4, 6, 8, 12, 16], help="0: the kernel's choice")
p.add_argument("--min-keys", type=int, nargs="+", default=[0, 128], help="0: the kernel's choice")
p.add_argument("--iters", type=int, default=30)
args = p.parse_args()
L, H, Hkv, hd = SWEEP_LAYOUTS[args.layout]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
gen = torch.Generator().manual_seed(0)
cache = bs1_cache(L, Hkv, hd, args.bound, max(args.context), args.nodes, dev, dtype)
own_block_m = tree_attention._block_m
name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter: outputs only)"
print(f"{name}, layout {args.layout} {str(dtype).removeprefix('torch.')} bs1 tree N={args.nodes} bound {args.bound};"
      f" graph ms per forward over {L} layers; max |out - today's|", flush=True)
rows_per_head = args.nodes * (H // Hkv)
print(f"query-head rows per KV head: {rows_per_head}; today's BLOCK_M {own_block_m(rows_per_head)}, "
      f"splits {tree_attention.choose_num_splits(1, Hkv, rows_per_head, args.bound, cache.num_sms)}, "
      f"min keys {tree_attention.choose_min_split_keys(rows_per_head, hd)}", flush=True)
# today's key tiles for this tree (BLOCK_N, committed tile, maskless), as `paged_attention` picks them
tile = (tree_attention.choose_block_n(rows_per_head, hd, True, args.bound),
        *tree_attention.choose_committed_tile(rows_per_head, hd, True))
for ctx in args.context:
    batch, T = bs1_cases(cache, ctx, args.nodes, args.bound, gen, dev)["tree"]
    q = torch.randn(1, T, H, hd, generator=gen).to(dev, dtype)
    ref = tree_attention.paged_attention(q, cache, 0, batch, scale=hd**-0.5).float()
    results = []
    for bm in args.block_m:
        for warps in args.warps:
            cfg = dict(tree_attention._fixed_config(*tile), num_warps=warps)
            cfg.setdefault("num_stages", 2)
            for sp in args.splits:
                for mk in args.min_keys:
                    kw = dict(scale=hd**-0.5, num_splits=sp or None, min_split_keys=mk or None)
                    tree_attention._block_m = lambda rows, bm=bm: bm  # noqa: E731
                    try:
                        with launch_config(cfg):
                            diff = (tree_attention.paged_attention(q, cache, 0, batch, **kw).float() - ref).abs().max()

                            def forward(kw=kw):
                                for layer in range(L):
                                    tree_attention.paged_attention(q, cache, layer, batch, **kw)

                            ms = graph_timed(forward, args.iters, dev)
                    except Exception as err:  # noqa: BLE001 - report and go on
                        print(f"  ctx {ctx} M{bm} w{warps} s{sp} k{mk}: {type(err).__name__}: {str(err)[:160]}")
                        continue
                    finally:
                        tree_attention._block_m = own_block_m
                    results.append((ms if ms is not None else float("nan"), bm, warps, sp, mk, float(diff)))
                    print(f"  ctx {ctx} BLOCK_M {bm:3d} warps {warps} splits {sp or 'own':>3} min keys {mk or 'own':>3}: "
                          f"{'-' if ms is None else f'{ms:.3f}'} ms, diff {float(diff):.2e}", flush=True)
    today = [r for r in results if r[1] == own_block_m(rows_per_head) and r[2] == 4 and r[3] == 0 and r[4] == 0]
    print(f"\ncontext {ctx}, fastest ten (today's: {today[0][0]:.3f} ms)" if today else f"\ncontext {ctx}")
    print("| ms | BLOCK_M | warps | splits | min keys | max diff |\n|---|---|---|---|---|---|")
    for ms, bm, warps, sp, mk, diff in sorted(results)[:10]:
        print(f"| {ms:.3f} | {bm} | {warps} | {sp or 'own'} | {mk or 'own'} | {diff:.1e} |")
    print(flush=True)
