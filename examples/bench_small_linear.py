"""Few-row projections: cuBLAS (`F.linear`) against the Triton kernel (`kernels.small_linear`),
side by side, per projection and per step.

A batch-1 step of SmolLM2-135M runs 30 x 4 projections of 1-8 rows plus the vocabulary head;
cuBLAS takes ~3.6-4.0 us for each (notes/gpu/issue20, the KTIME tables), ~15% of the copy
bandwidth. This times, for every projection of a layout and every row count, one CUDA graph of
the projection over all the layout's layers (each layer its own weight, as in a step, so the
weights stream from HBM and not from L2), replayed: us per call. "step" adds every projection
of one forward (the layers' four and the head) for the target, and one forward's for a draft head.
Each Triton row also prints its largest difference from cuBLAS, relative to the output's scale.

A second table per layout times the fused kernels (`kernels.fused_linear`) against the pair they
replace: the residual add + RMSNorm before qkv and gate/up, SwiGLU's activation before down, each
as the compiled piece (`models.fused.compiled`, as the decoder runs it) then cuBLAS or the
small-linear kernel, against one fused launch; us per layer, and per forward (x layers).

    python examples/bench_small_linear.py                          # H100/H200: smollm2 + its EAGLE-3 head, rows 1 2 4 6 8
    python examples/bench_small_linear.py --layouts llama8b --rows 1 6
    python examples/bench_small_linear.py --configs 8x256x4 4x512x2 16x128x4   # BLOCK_N x BLOCK_K x warps, beside the chosen
    python examples/bench_small_linear.py --quick                  # CPU: the interpreter, a tiny layout (runs; times nothing)

bf16 unless --dtype float32. Nothing here changes the library: a config is tried by replacing
`small_linear.launch_config` for the call.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from _bench_common import header, log, markdown_table
from bench_attention import graph_timed

import specdec.kernels.fused_linear as fused_linear
import specdec.kernels.small_linear as small_linear
from specdec.models import fused as pieces

# name -> (layers, [(projection, N, K)], the per-forward head (N, K) or None)
LAYOUTS = {
    "smollm2": (30, [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)], (49152, 576)),
    # its EAGLE-3 head (one layer, 2d-wide qkv, fc over three captured states, 16384-token draft head)
    "smollm2-eagle3": (1, [("fc", 576, 1728), ("qkv", 960, 1152), ("o", 576, 576), ("gate_up", 3072, 576),
                           ("down", 576, 1536)], (16384, 576)),
    "llama8b": (32, [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
                (128256, 4096)),
    "tiny": (2, [("qkv", 96, 64), ("down", 64, 96)], (100, 64)),
}
# name -> [(what is fused, "norm" or "swiglu", N, K)]: the projections whose input a piece makes
FUSED = {
    "smollm2": [("add+norm, qkv", "norm", 960, 576), ("add+norm, gate_up", "norm", 3072, 576),
                ("silu*up, down", "swiglu", 576, 1536)],
    "smollm2-eagle3": [("add+norm, gate_up", "norm", 3072, 576), ("silu*up, down", "swiglu", 576, 1536)],
    "llama8b": [("add+norm, qkv", "norm", 6144, 4096), ("add+norm, gate_up", "norm", 28672, 4096),
                ("silu*up, down", "swiglu", 4096, 14336)],
    "tiny": [("add+norm, qkv", "norm", 96, 64), ("silu*up, down", "swiglu", 64, 96)],
}
COPIES = 8  # a one-layer layout's projection is timed over this many weights (L2 stays cold)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=None, help="default: smollm2 smollm2-eagle3")
    p.add_argument("--rows", type=int, nargs="+", default=None, help="rows per call (default 1 2 4 6 8; quick 1 3)")
    p.add_argument("--configs", nargs="*", default=[], metavar="NxKxW",
                   help="launch configs BLOCK_N x BLOCK_K x warps, timed beside the chosen one")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--iters", type=int, default=50, help="graph replays timed per case (median)")
    p.add_argument("--quick", action="store_true", help="CPU smoke run: the interpreter, the tiny layout")
    return p.parse_args()


def parse_config(text: str) -> dict:
    """'8x256x4' -> dict(BLOCK_N=8, BLOCK_K=256, num_warps=4), each a power of two."""
    try:
        block_n, block_k, warps = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--configs {text!r}: expected BLOCK_NxBLOCK_KxWARPS, e.g. 8x256x4") from None
    for name, v in (("BLOCK_N", block_n), ("BLOCK_K", block_k), ("warps", warps)):
        if v < 1 or v & (v - 1):
            raise SystemExit(f"--configs {text!r}: {name}={v} must be a power of two >= 1")
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)


def graph_us(fn, calls: int, iters: int, device) -> float | None:
    """Median us per call of `fn` (which makes `calls` calls) replayed as one CUDA graph; None off CUDA."""
    ms = graph_timed(fn, iters, device)  # bench_attention's: warm on a side stream, capture, median replay
    return None if ms is None else ms * 1e3 / calls


def run_projection(weights, x, impl: str, config: dict | None):
    """Every weight's projection of x, through cuBLAS or the kernel (with `config` forced)."""
    chosen = small_linear.launch_config
    if config is not None:
        small_linear.launch_config = lambda m, n, k, sms: dict(chosen(m, n, k, sms), **config)
    try:
        if impl == "cublas":
            return [F.linear(x, w) for w in weights]
        return [small_linear.small_linear_triton(x, w, None) for w in weights]
    finally:
        small_linear.launch_config = chosen


def run_fused(kind: str, weights, inputs, impl: str, fns):
    """Every weight's projection of the piece's output: the piece then cuBLAS or the small-linear
    kernel (impl "cublas" / "triton"), or one fused launch ("fused")."""
    res, delta, nw = inputs
    out = []
    for w in weights:
        if impl == "fused":
            if kind == "norm":
                out.append(fused_linear.norm_linear_triton(res, delta, nw, 1e-5, w, None)[1])
            else:
                out.append(fused_linear.swiglu_linear_triton(res, w, None))
            continue
        x = fns.add_rms_norm(res, delta, nw, 1e-5)[1] if kind == "norm" else fns.silu_mul(res)
        out.append(F.linear(x, w) if impl == "cublas" else small_linear.small_linear_triton(x, w, None))
    return out


def fused_table(name: str, layers: int, rows_list, dtype, device, iters: int, gen, fns) -> None:
    """The fused kernels against the piece + projection they replace, per layer and per forward."""
    table = []
    per_forward = {}
    copies = layers if layers > 1 else COPIES
    for what, kind, N, K in FUSED.get(name, []):
        weights = None
        weights = [torch.randn(N, K, device=device, dtype=dtype, generator=gen) / K**0.5 for _ in range(copies)]
        for m in rows_list:
            width = K if kind == "norm" else 2 * K
            inputs = (torch.randn(m, width, device=device, dtype=dtype, generator=gen),
                      torch.randn(m, width, device=device, dtype=dtype, generator=gen),
                      1 + 0.1 * torch.randn(width, device=device, dtype=dtype, generator=gen))
            ref = run_fused(kind, weights[:1], inputs, "cublas", fns)[0].float()
            scale = ref.abs().max().item() or 1.0
            cells, base = [what, f"{N}x{K}", str(m)], None
            for impl in ("cublas", "triton", "fused"):
                t0 = time.perf_counter()
                diff = (run_fused(kind, weights[:1], inputs, impl, fns)[0].float() - ref).abs().max().item() / scale
                us = graph_us(lambda: run_fused(kind, weights, inputs, impl, fns), copies, iters, device)
                if us is None:
                    us = (time.perf_counter() - t0) * 1e6
                base = us if impl == "cublas" else base
                cells.append(f"{us:.2f}" + ("" if impl == "cublas" else f" ({base / us:.2f}x, d {diff:.1e})"))
                per_forward[(m, impl)] = per_forward.get((m, impl), 0.0) + us * layers
            table.append(cells)
    if not table:
        return
    log(f"\n{name}: the fused kernels against piece + projection, us per layer; (x) = piece+cuBLAS / this")
    print(markdown_table(["fused", "N x K", "rows", "piece + cuBLAS", "piece + small_linear", "fused kernel"], table))
    log(f"{name}: every fused pair of one forward (x {layers} layers), us")
    print(markdown_table(["rows", "piece + cuBLAS", "piece + small_linear", "fused kernel"],
                         [[str(m)] + [f"{per_forward[(m, impl)]:.1f}" for impl in ("cublas", "triton", "fused")]
                          for m in rows_list]))


def main() -> None:
    args = parse_args()
    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if args.quick else getattr(torch, args.dtype)
    layouts = args.layouts or (["tiny"] if args.quick else ["smollm2", "smollm2-eagle3"])
    rows_list = args.rows or ([1, 3] if args.quick else [1, 2, 4, 6, 8])
    for m in rows_list:
        if not 1 <= m <= small_linear.MAX_ROWS:
            raise SystemExit(f"--rows {m} is out of range; allowed: 1 to {small_linear.MAX_ROWS}")
    configs = [parse_config(c) for c in args.configs]
    variants = [("cublas", None), ("triton", None)] + [("triton", c) for c in configs]
    print(header(device, dtype, "rows " + " ".join(map(str, rows_list)), iters=args.iters))
    gen = torch.Generator(device=device).manual_seed(0)
    fns = pieces.EAGER if device.type == "cpu" else pieces.compiled()  # the pieces as the decoder runs them
    for name in layouts:
        layers, projections, head = LAYOUTS[name]
        shapes = projections + ([("head", *head)] if head else [])
        table, step = [], {}
        for proj, N, K in shapes:
            copies = layers if proj != "head" and layers > 1 else COPIES
            weights = None  # the last projection's weights go before this one's are made (the 8B layout's are GBs)
            weights = [torch.randn(N, K, device=device, dtype=dtype, generator=gen) / K**0.5 for _ in range(copies)]
            per_step = layers if proj != "head" else 1
            for m in rows_list:
                x = torch.randn(m, K, device=device, dtype=dtype, generator=gen)
                ref = F.linear(x, weights[0]).float()
                scale = ref.abs().max().item() or 1.0
                cfg = small_linear.launch_config(m, N, K, small_linear._num_sms(device))
                cells = [proj, f"{N}x{K}", str(m), f"{cfg['BLOCK_N']}x{cfg['BLOCK_K']}x{cfg['num_warps']} (rows {cfg['M_PAD']})"]
                base = None
                for impl, cfg in variants:
                    t0 = time.perf_counter()
                    out = run_projection(weights[:1], x, impl, cfg)[0]
                    diff = (out.float() - ref).abs().max().item() / scale
                    us = graph_us(lambda: run_projection(weights, x, impl, cfg), copies, args.iters, device)
                    if us is None:  # CPU: one call's wall time, to show the row ran
                        us = (time.perf_counter() - t0) * 1e6
                    base = us if impl == "cublas" else base
                    cells.append(f"{us:.2f}" + ("" if impl == "cublas" else f" ({base / us:.2f}x, d {diff:.1e})"))
                    step.setdefault((m, impl, None if cfg is None else tuple(cfg.values())), 0.0)
                    step[(m, impl, None if cfg is None else tuple(cfg.values()))] += us * per_step
                table.append(cells)
        names = ["cuBLAS us"] + ["triton us (chosen)"] + [f"triton {c}" for c in args.configs]
        log(f"\n{name} ({layers} layers), us per call; (x) = cuBLAS / triton, d = largest |diff| / max |cuBLAS|")
        print(markdown_table(["proj", "N x K", "rows", "chosen launch"] + names, table))
        log(f"{name}: every projection of one forward (each layer's and the head), us")
        rows = []
        for m in rows_list:
            cu = step[(m, "cublas", None)]
            cells = [str(m), f"{cu:.1f}"]
            for impl, cfg in variants[1:]:
                t = step[(m, impl, None if cfg is None else tuple(cfg.values()))]
                cells.append(f"{t:.1f} ({cu / t:.2f}x)")
            rows.append(cells)
        print(markdown_table(["rows", "cuBLAS"] + names[1:], rows))
        fused_table(name, layers, rows_list, dtype, device, args.iters, gen, fns)


if __name__ == "__main__":
    main()
