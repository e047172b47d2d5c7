"""Benchmark: tree-verify forward vs a plain decode step of a Llama-3.1-8B-shaped target.

Builds the model with random bf16 weights directly on the GPU (nothing is read or saved),
fills a paged KV cache with `--context` committed tokens per request, then times
  * decode: one token per request (T = 1, causal),
  * verify: a random tree of N nodes per request (T = N, packed ancestor mask),
for each batch size, and the attention calls alone (the 32 layers' `attention(...)` on the
same batch metadata), which gives the attention share of each forward.

    python examples/bench_target.py                 # H200: bs 1 and 8, N 64, context 2048
    python examples/bench_target.py --quick         # tiny model on CPU, a smoke run

Each timed callable is optionally `torch.compile`d (fullgraph, static shapes) and then
captured in a CUDA graph, so launch overhead is not measured; the table says what ran.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec import SpecConfig
from specdec.models import DecoderLM, ModelConfig, RopeConfig
from specdec.ops import build_tree
from specdec.runtime.attention import attention
from specdec.runtime.batch import decode_batch, tree_batch

LLAMA31_8B = ModelConfig(
    model_type="llama",
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-5,
    rope=RopeConfig("llama3", 500000.0, 8.0, 1.0, 4.0, 8192),
    max_position_embeddings=131072,
)
TINY = ModelConfig(
    model_type="llama",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope=RopeConfig(),
    max_position_embeddings=4096,
)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny model on CPU (bs 1 2, N 8, context 64)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    p.add_argument("--nodes", type=int, default=None, help="tree nodes N (default 64)")
    p.add_argument("--context", type=int, default=None, help="committed tokens per request (default 2048)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto", help="auto = on for CUDA")
    p.add_argument("--cuda-graph", choices=["auto", "on", "off"], default="auto", help="auto = on for CUDA")
    p.add_argument("--attn-impl", default="auto", help="runtime.attention impl: auto (triton on CUDA), ref, flex")
    return p.parse_args()


def random_parents(B: int, N: int, gen: torch.Generator) -> torch.Tensor:
    """[B, N] int64 random topological trees: node i hangs under a node among the previous 8."""
    i = torch.arange(N)
    lo = (i - 8).clamp(min=0)
    par = lo + (torch.rand(B, N, generator=gen) * (i - lo)).long()  # in [lo, i)
    par[:, 0] = -1
    return par


class Timed:
    """A zero-argument callable made fast: optionally compiled, optionally CUDA-graph captured."""

    def __init__(self, fn, *, compile_: bool, graph: bool, device: torch.device):
        self.how = []
        self.compile_seconds = 0.0
        if compile_:
            compiled = torch.compile(fn, fullgraph=True, dynamic=False)
            t0 = time.perf_counter()
            try:
                compiled()
                self._sync(device)
                fn = compiled
                self.how.append("compiled")
            except Exception as err:  # report, fall back to eager
                self.how.append(f"eager (compile failed: {type(err).__name__}: {str(err).splitlines()[0][:80]})")
            self.compile_seconds = time.perf_counter() - t0
        else:
            self.how.append("eager")
        self.fn = fn
        if graph and device.type == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            self.fn = g.replay
            self.how.append("cuda-graph")

    @staticmethod
    def _sync(device):
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def time_ms(self, iters: int, device: torch.device) -> float:
        """Median milliseconds per call."""
        for _ in range(3):
            self.fn()
        self._sync(device)
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                self.fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    cfg = TINY if args.quick else LLAMA31_8B
    dtype = torch.bfloat16 if cuda else torch.float32
    batch_sizes = args.batch_sizes or ([1, 2] if args.quick else [1, 8])
    N = args.nodes or (8 if args.quick else 64)
    context = args.context or (64 if args.quick else 2048)
    iters = args.iters or (10 if args.quick else 20)
    use_compile = args.compile == "on" or (args.compile == "auto" and cuda)
    use_graph = cuda and (args.cuda_graph in ("on", "auto"))
    gen = torch.Generator().manual_seed(0)

    t0 = time.perf_counter()
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = DecoderLM(cfg, attn_impl=args.attn_impl).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(default)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {cfg.num_layers} layers, d {cfg.hidden_size}, {cfg.num_heads}/{cfg.num_kv_heads} heads, "
          f"ffn {cfg.intermediate_size}, vocab {cfg.vocab_size}: {params / 1e9:.2f} B params {dtype} on {device} "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"torch {torch.__version__}; attention impl {args.attn_impl}; block size {args.block_size}; "
          f"context {context}; N {N}", flush=True)

    rows = []
    for B in batch_sizes:
        spec = SpecConfig(max_batch_size=B, max_seq_len=context + N, kv_block_size=args.block_size)
        cache = model.make_cache(spec)
        cache.storage.normal_(0, 1)  # realistic (non-zero) committed K/V
        for s in range(B):
            cache.reserve(s, context + N)
        cache_len = torch.full((B,), context, dtype=torch.int64, device=device)
        parents = random_parents(B, N, gen).to(device)
        num_nodes = torch.full((B,), N, dtype=torch.int64, device=device)
        tree = build_tree(parents, num_nodes)
        forwards = {
            "decode": (decode_batch(cache, cache_len, torch.ones(B, dtype=torch.bool, device=device)), 1),
            "verify": (tree_batch(cache, cache_len, tree, num_nodes), N),
        }
        for kind, (batch, T) in forwards.items():
            tokens = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(device)
            q = torch.randn(B, T, cfg.num_heads, cfg.head_dim, generator=gen).to(device, dtype)
            scale = cfg.head_dim**-0.5

            def full(tokens=tokens, batch=batch):
                with torch.no_grad():
                    return model(tokens, batch.positions, cache, batch).logits

            def attn_only(q=q, batch=batch):
                with torch.no_grad():
                    out = q
                    for layer in range(cfg.num_layers):
                        window = model.sliding_window_per_layer[layer]
                        out = attention(q, cache, layer, batch, scale=scale, sliding_window=window, impl=args.attn_impl)
                    return out

            timed_full = Timed(full, compile_=use_compile, graph=use_graph, device=device)
            timed_attn = Timed(attn_only, compile_=use_compile, graph=use_graph, device=device)
            ms = timed_full.time_ms(iters, device)
            attn_ms = timed_attn.time_ms(iters, device)
            rows.append(dict(B=B, kind=kind, T=T, ms=ms, attn_ms=attn_ms, how="+".join(timed_full.how),
                             compile_s=timed_full.compile_seconds + timed_attn.compile_seconds))
            print(f"  bs {B} {kind}: {ms:.3f} ms (attention {attn_ms:.3f} ms) [{rows[-1]['how']}, "
                  f"compile {rows[-1]['compile_s']:.0f} s]", flush=True)
        del cache

    print()
    print(f"{'bs':>3} {'forward':>8} {'T':>4} {'ms':>9} {'attn ms':>9} {'attn %':>7} {'vs decode':>10}  how")
    for r in rows:
        dec = next(x for x in rows if x["B"] == r["B"] and x["kind"] == "decode")
        print(f"{r['B']:>3} {r['kind']:>8} {r['T']:>4} {r['ms']:>9.3f} {r['attn_ms']:>9.3f} "
              f"{100 * r['attn_ms'] / r['ms']:>6.1f}% {r['ms'] / dec['ms']:>9.2f}x  {r['how']}")
    print("\nattn ms: the layers' attention calls alone (same metadata), timed separately; "
          "vs decode: forward time / decode-step time at the same bs.")


if __name__ == "__main__":
    main()
