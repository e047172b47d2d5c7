"""Benchmark: attention over the paged KV cache (tree verify vs decode) and KV relocation.

A Llama-3.1-8B-shaped attention stack (32 layers, 32 query heads, 8 KV heads, head_dim 128,
bf16; random K/V, no weights; `--layout smollm2`: 30 layers, 9 / 3 heads, head_dim 64): per forward, every layer's attention for
  - tree verify: bs 1 and 8, N = 64 tree nodes, 2k committed tokens,
  - decode: bs 1 and 8, one token, 2k committed tokens,
  - prefill: bs 1, 2k tokens (causal),
for each implementation (triton: the paged kernel; flex: FlexAttention on gathered K/V;
ref: dense masked SDPA), then the relocation kernel vs its torch reference over all layers.
Times are per forward (all layers), median of CUDA-event timings, eager and CUDA-graph
replayed. FlexAttention's block mask is built once per forward (memoized on the batch) and
is not in its times. `--quick` runs tiny sizes on CPU (Triton interpreted).

    python examples/bench_attention.py            # on a CUDA machine
    python examples/bench_attention.py --quick    # anywhere, a smoke run
    python examples/bench_attention.py --impls triton --context 1024 --nodes 61 \
        --triton-configs 64x4x2 32x4x2 32x8x2 64x8x2   # the kernel's launch config, side by side
    python examples/bench_attention.py --impls triton --num-splits 0 1 2 4 8   # key splits (0: chosen)
    python examples/bench_attention.py --impls triton --context 256 --max-kv-len 4096 --min-split-keys 1 0
        # a short real context under the engine's static bound: splits of a few keys (1) vs the chosen fewest
    python examples/bench_attention.py --layout smollm2 --impls triton --context 320 --nodes 49 \
        --max-kv-len 2048 --min-split-keys 16 32 64 0   # SmolLM2's tree verify: 9 programs before splitting

`--triton-configs` times the Triton kernel under each BLOCK_N x warps x stages ("c64": 64-key
tiles for the committed keys; "m": those whole tiles read without masks; "u": its single key
loop, no committed-keys-only tiles first), as rows `triton[BNxWxS...]`; the kernel's
own per-shape choice, `kernels/tree_attention._fixed_config`, is read off such runs
(notes/gpu/issue20/ATTENTION.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import time
import warnings

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from specdec.kernels.kv_relocate import relocate_kv  # noqa: E402
from specdec.kernels.tree_attention import paged_attention  # noqa: E402
from specdec.runtime.attention import attention  # noqa: E402
from specdec.runtime.batch import decode_batch, prefill_batch, tree_batch  # noqa: E402
from specdec.runtime.kv_cache import PagedKVCache  # noqa: E402
from specdec.types import TreeMeta  # noqa: E402


# layout name -> (layers, query heads, KV heads, head_dim)
LAYOUTS = {"8b": (32, 32, 8, 128), "smollm2": (30, 9, 3, 64)}


def random_tree(batch: int, nodes: int, max_fanout_back: int, gen: torch.Generator, device) -> TreeMeta:
    """A random topological tree per row (parent within the last `max_fanout_back` nodes)."""
    meta = TreeMeta.empty(batch, nodes, device="cpu")
    anc = torch.zeros(batch, nodes, nodes, dtype=torch.bool)
    for i in range(nodes):
        anc[:, i, i] = True
        if i:
            lo = max(0, i - max_fanout_back)
            parent = torch.randint(lo, i, (batch,), generator=gen)
            anc[:, i] |= anc[torch.arange(batch), parent]
            meta.positions[:, i] = meta.positions[torch.arange(batch), parent] + 1
    words = (nodes + 31) // 32
    bits = torch.zeros(batch, nodes, words * 32, dtype=torch.int64)
    bits[..., :nodes] = anc.long()
    packed = (bits.view(batch, nodes, words, 32) << torch.arange(32)).sum(-1)
    meta.packed_mask.copy_(torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32))
    return TreeMeta(*(x.to(device) for x in vars(meta).values()))


def timed(fn, iters: int, device) -> float:
    """Median milliseconds of `fn()`."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_timed(fn, iters: int, device) -> float | None:
    """Median ms of replaying `fn` as a CUDA graph (None if it cannot be captured)."""
    if device.type != "cuda":
        return None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return timed(graph.replay, iters, device)
    except Exception as err:  # noqa: BLE001 - report and go on
        print(f"  (cuda graph capture failed: {type(err).__name__}: {str(err)[:120]})")
        return None


def bs1_cache(layers: int, kv_heads: int, head_dim: int, bound: int, max_context: int, nodes: int, device,
              dtype) -> PagedKVCache:
    """One request's paged cache (block size 16), long enough for `max_context` keys plus a tree of
    `nodes` and for the static key `bound`, filled with random K/V: the batch-1 sweeps'
    (`notes/gpu/issue20/*_sweep.py`)."""
    seq = max(bound, max_context + nodes + 64)
    cache = PagedKVCache(layers, kv_heads, head_dim, max_batch_size=1, max_seq_len=seq, block_size=16, device=device,
                         dtype=dtype)
    cache.reserve(0, seq)
    cache.storage.normal_()
    return cache


SWEEP_LAYOUTS = dict(LAYOUTS, tiny=(2, 8, 2, 64))  # tiny: the sweeps' output check in the interpreter


def bs1_parser(description: str) -> argparse.ArgumentParser:
    """The batch-1 sweeps' shared options (`notes/gpu/issue20/*_sweep.py`): contexts, layout (of
    `SWEEP_LAYOUTS`), tree nodes and the static key bound (the engine's 4224 by default)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--layout", default="8b", choices=sorted(SWEEP_LAYOUTS))
    parser.add_argument("--nodes", type=int, default=61)
    parser.add_argument("--bound", type=int, default=4224)
    return parser


def bs1_cases(cache: PagedKVCache, context: int, nodes: int, bound: int, gen: torch.Generator, device) -> dict:
    """The batch-1 attention calls the sweeps time at `context` keys under the static key `bound`:
    {"tree": (a random tree verify's batch, nodes), "decode": (a decode's batch, 1)}."""
    cache_len = torch.full((1,), context, device=device)
    return {"tree": (tree_batch(cache, cache_len, random_tree(1, nodes, 8, gen, device),
                                torch.full((1,), nodes, device=device), max_kv_len=bound), nodes),
            "decode": (decode_batch(cache, cache_len, torch.ones(1, dtype=torch.bool, device=device),
                                    max_kv_len=bound), 1)}


_CONFIG = re.compile(r"^(\d+)x(\d+)x(\d+)(?:c(\d+))?(m?)(u?)$")


def _parse_config(text: str) -> dict:
    """"32x4x2" -> dict(BLOCK_N=32, num_warps=4, num_stages=2, BLOCK_N_C=32, MASKLESS_C=False,
    COMMITTED_FIRST=True). Suffixes: "c64" gives the committed-keys-only tiles their own size
    (BLOCK_N_C), "m" reads those whole tiles without masks (MASKLESS_C), "u" runs the kernel's
    single key loop (every tile with the full visibility arithmetic) instead of committed-keys
    tiles first. E.g. 16x4x2c64m, 16x4x2u."""
    match = _CONFIG.match(text.lower())
    if match is None:
        raise SystemExit(f"--triton-configs: {text!r} is not BLOCK_NxWARPSxSTAGES[cBLOCK_N_C][m][u] "
                         "(e.g. 32x4x2, 16x4x2c64m, 16x4x2u)")
    bn, warps, stages = (int(x) for x in match.group(1, 2, 3))
    bnc = int(match.group(4) or bn)
    if bn not in (16, 32, 64, 128) or bnc not in (16, 32, 64, 128) or warps not in (1, 2, 4, 8, 16) \
            or not 1 <= stages <= 5:
        raise SystemExit(f"--triton-configs: {text!r} out of range; BLOCK_N and BLOCK_N_C in 16/32/64/128, warps in "
                         "1/2/4/8/16, stages in 1..5")
    return dict(BLOCK_N=bn, num_warps=warps, num_stages=stages, BLOCK_N_C=bnc, MASKLESS_C=bool(match.group(5)),
                COMMITTED_FIRST=not match.group(6))


def _config_label(cfg: dict) -> str:
    """The inverse of `_parse_config`, as the row label `triton[...]`."""
    committed = f"c{cfg['BLOCK_N_C']}" if cfg["BLOCK_N_C"] != cfg["BLOCK_N"] else ""
    return (f"triton[{cfg['BLOCK_N']}x{cfg['num_warps']}x{cfg['num_stages']}{committed}"
            f"{'m' if cfg['MASKLESS_C'] else ''}{'' if cfg['COMMITTED_FIRST'] else 'u'}]")


@contextlib.contextmanager
def launch_config(cfg: dict | None):
    """Launch the paged-attention kernel with `cfg` instead of its fixed config (None: as is).
    Swaps the kernel module's `_fixed_config` for the duration: a measurement tool, not an API."""
    if cfg is None:
        yield
        return
    from specdec.kernels import tree_attention

    before = tree_attention._fixed_config
    tree_attention._fixed_config = lambda *_: dict(cfg)
    try:
        yield
    finally:
        tree_attention._fixed_config = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run)")
    parser.add_argument("--impls", default="triton,flex,ref", help="comma-separated attention impls")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size (tokens)")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--context", type=int, default=None, help="committed tokens per row (default 2048)")
    parser.add_argument("--nodes", type=int, default=None, help="tree nodes N (default 64)")
    parser.add_argument("--triton-configs", nargs="+", default=None, metavar="BNxWxS",
                        help="time the Triton kernel under each BLOCK_N x num_warps x num_stages, optionally with "
                             "cBLOCK_N_C (committed-keys tile), m (those tiles maskless), u (one key loop)")
    parser.add_argument("--num-splits", nargs="+", type=int, default=None, metavar="S",
                        help="time the Triton kernel with each key-split count (0: the one it picks)")
    parser.add_argument("--max-kv-len", type=int, default=0,
                        help="the static key bound the batches carry, as the engine's max_seq_len (default: the "
                             "case's real key count); the split count follows it, the real context does not")
    parser.add_argument("--min-split-keys", nargs="+", type=int, default=None, metavar="K",
                        help="time the Triton kernel with each fewest-keys-per-split (0: the one it picks)")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="8b",
                        help="attention layout: 8b (Llama-3.1-8B: 32 layers, 32/8 heads, head_dim 128) or smollm2 "
                             "(SmolLM2-135M: 30 layers, 9/3 heads, head_dim 64); --quick runs its tiny sizes whatever the layout")
    args = parser.parse_args()
    if args.max_kv_len < 0:
        raise SystemExit(f"--max-kv-len {args.max_kv_len} must be >= 0 (0: the case's real key count)")
    if args.min_split_keys and min(args.min_split_keys) < 0:
        raise SystemExit(f"--min-split-keys: {args.min_split_keys} must all be >= 0 (0: the kernel's own choice)")
    min_keys = [k or None for k in args.min_split_keys] if args.min_split_keys else [None]
    configs = [_parse_config(c) for c in args.triton_configs] if args.triton_configs else [None]
    if args.num_splits and min(args.num_splits) < 0:
        raise SystemExit(f"--num-splits: {args.num_splits} must all be >= 0 (0: the kernel's own choice)")
    splits = [s or None for s in args.num_splits] if args.num_splits else [None]
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")

    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    if args.quick:
        L, H, Hkv, hd, ctx, N, batches, dtype = 2, 4, 2, 16, 64, 8, (1, 2), torch.float32
    else:
        L, H, Hkv, hd = LAYOUTS[args.layout]
        ctx, N, batches, dtype = 2048, 64, (1, 8), torch.bfloat16
    ctx, N = args.context or ctx, args.nodes or N
    iters = args.iters or (3 if args.quick else 20)
    impls = args.impls.split(",")
    gen = torch.Generator().manual_seed(0)
    max_b = max(batches)
    seq = max(ctx + N + 64, args.max_kv_len)
    bound = lambda keys: max(keys, args.max_kv_len)  # noqa: E731  the static max_kv_len of a batch
    cache = PagedKVCache(L, Hkv, hd, max_batch_size=max_b, max_seq_len=seq, block_size=args.block_size,
                         device=device, dtype=dtype)
    for slot in range(max_b):
        cache.reserve(slot, seq)
    cache.storage.normal_()
    scale = hd**-0.5
    print(f"device={device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), torch {torch.__version__}")
    print(f"shape: layers={L} heads={H} kv_heads={Hkv} head_dim={hd} {dtype} context={ctx} tree N={N} "
          f"block_size={args.block_size} max_kv_len={args.max_kv_len or 'real'}; times are per forward over all {L} layers (ms)\n")

    kv_bytes = lambda b, s: b * s * Hkv * hd * 2 * cache.storage.element_size() * L  # noqa: E731
    rows = []
    for B in batches:
        cache_len = torch.full((B,), ctx, device=device)
        cases = {
            "decode": (decode_batch(cache, cache_len, torch.ones(B, dtype=torch.bool, device=device),
                                    max_kv_len=bound(ctx + 1)), 1, ctx + 1),
            "tree": (tree_batch(cache, cache_len, random_tree(B, N, 8, gen, device), torch.full((B,), N, device=device),
                                max_kv_len=bound(ctx + N)), N, ctx + N),
        }
        if B == 1:
            cases["prefill"] = (prefill_batch(cache, torch.zeros(1, dtype=torch.int64, device=device),
                                              torch.zeros(1, dtype=torch.int64, device=device),
                                              torch.full((1,), ctx, device=device), ctx, max_kv_len=bound(ctx)), ctx, ctx)
        for name, (batch, T, keys) in cases.items():
            q = torch.randn(B, T, H, hd, generator=gen).to(device, dtype)
            runs = [(impl, cfg, sp, mk) for impl in impls
                    for cfg in (configs if impl == "triton" else [None])
                    for sp in (splits if impl == "triton" else [None])
                    for mk in (min_keys if impl == "triton" else [None])]
            for impl, cfg, sp, mk in runs:
                if impl == "ref" and name == "prefill" and not args.quick:
                    continue  # dense [H, 2k, 2k] float32 scores: not a fair or useful number
                label = impl if cfg is None else _config_label(cfg)
                label += ("" if sp is None else f"/s{sp}") + ("" if mk is None else f"/k{mk}")

                def forward(impl=impl, q=q, batch=batch, sp=sp, mk=mk):
                    for layer in range(L):
                        if sp is None and mk is None:
                            attention(q, cache, layer, batch, scale=scale, impl=impl)
                        else:
                            paged_attention(q, cache, layer, batch, scale=scale, num_splits=sp, min_split_keys=mk)

                try:
                    with launch_config(cfg):
                        forward()  # warm-up: compile / autotune
                        eager = timed(forward, iters, device)
                        graph = graph_timed(forward, iters, device) if impl != "ref" else None
                except Exception as err:  # noqa: BLE001
                    print(f"  {name} bs={B} impl={label} failed: {type(err).__name__}: {str(err)[:200]}")
                    continue
                best = min(x for x in (eager, graph) if x is not None)
                gbs = kv_bytes(B, keys) / (best * 1e-3) / 1e9
                rows.append((name, B, label, eager, graph, gbs))

    print(f"{'case':8} {'bs':>3} {'impl':20} {'eager ms':>9} {'graph ms':>9} {'KV GB/s':>8}")
    for name, B, impl, eager, graph, gbs in rows:
        g = f"{graph:9.3f}" if graph is not None else f"{'-':>9}"
        print(f"{name:8} {B:3d} {impl:20} {eager:9.3f} {g} {gbs:8.1f}")
    print("\ntree-verify / decode attention time (best of eager, graph):")
    best = {(n, b, i): min(x for x in (e, g) if x is not None) for n, b, i, e, g, _ in rows}
    for B in batches:
        for impl in dict.fromkeys(i for _, _, i, _, _, _ in rows):
            if ("tree", B, impl) in best and ("decode", B, impl) in best:
                ratio = best[("tree", B, impl)] / best[("decode", B, impl)]
                print(f"  bs={B} {impl:20} {ratio:6.2f}x")

    print("\nKV relocation over all layers (K and V), accept path of D+1 = 6 nodes:")
    print(f"{'bs':>3} {'impl':7} {'eager ms':>9} {'graph ms':>9}")
    for B in batches:
        committed = torch.full((B,), ctx, device=device)
        nodes = torch.stack([torch.cat([torch.zeros(1, dtype=torch.int64),
                                        torch.sort(torch.randperm(N - 1, generator=gen)[:5] + 1).values])
                             for _ in range(B)]).to(device)
        length = torch.full((B,), 5, device=device)
        for impl in ("triton", "torch"):
            def move(impl=impl):
                relocate_kv(cache, committed, nodes, length, impl=impl)

            move()
            eager = timed(move, iters, device)
            graph = graph_timed(move, iters, device)
            g = f"{graph:9.3f}" if graph is not None else f"{'-':>9}"
            print(f"{B:3d} {impl:7} {eager:9.3f} {g}")


if __name__ == "__main__":
    main()
