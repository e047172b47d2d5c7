"""Issue 20: two cheaper split-KV combines, timed against today's before any lands. The 8B tree
verify's combine took 0.25 ms a step (38 calls, ~6.6 us each) at 929c921 on the H100, and the
tree's R needs ~0.12 ms off (ANALYSIS.md, fifteenth session). Variants of the paged attention,
each a copy of `specdec.kernels.tree_attention` with one launch detail changed (the source is
patched here, under its own op namespace; the library is untouched):
  - "bf16 partials": the splits write their partial outputs in the query's dtype (bf16) instead
    of float32, so the combine reads (and the attention writes) half the bytes;
  - "combine warps W": the combine kernel launched with W warps (default 4) per program: one
    row per program is only SPLITS_PAD x HD_PAD elements, so fewer threads may schedule faster.
Times all layers of one forward (CUDA graph, bf16, batch 1, the engine's 4224-key bound) for the
tree (N=61) and decode at each context, and the largest output difference from today's.
    python notes/gpu/issue20/partial_sweep.py --context 1024 4096
On the CPU (TRITON_INTERPRET=1) it checks the variants' outputs only (--layout tiny)."""
import importlib.util
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
from bench_attention import SWEEP_LAYOUTS, bs1_cache, bs1_cases, bs1_parser, graph_timed
from specdec.kernels import tree_attention

PART = "part = torch.empty((num_splits, B, T, H, hd), device=q.device, dtype=torch.float32)"
ROWS = "ROWS=rows_per_program, num_warps=1,\n"
OP = '@triton_op("specdec::paged_attention"'


def variant(name: str, bf16_partials: bool, combine_warps: int | None):
    """A copy of tree_attention with the changes applied, registered as its own op."""
    src = open(tree_attention.__file__).read()
    for needle in (PART, ROWS, OP):
        assert src.count(needle) == 1, f"{needle!r} is not once in tree_attention.py: update this script"
    src = src.replace(OP, f'@triton_op("specdec_{name}::paged_attention"')
    if bf16_partials:
        src = src.replace(PART, PART.replace("dtype=torch.float32", "dtype=q.dtype"))
    if combine_warps is not None:
        src = src.replace(ROWS, f"ROWS=rows_per_program, num_warps={combine_warps},\n")
    # a real file: Triton's JIT reads a kernel's source from it (an exec'd string stopped the 22nd session's
    # call on the GPU; the interpreter never asks); named under specdec.kernels so `from .launch` resolves
    path = pathlib.Path(tempfile.mkdtemp(prefix="partial_sweep_")) / f"tree_attention_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"specdec.kernels.tree_attention_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.paged_attention


p = bs1_parser(__doc__)
p.add_argument("--warps", type=int, nargs="+", default=[1, 2])
p.add_argument("--splits", type=int, default=None, help="key splits (default: the engine's choice)")
p.add_argument("--dtype", default=None, choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA, else float32")
args = p.parse_args()
L, H, Hkv, hd = SWEEP_LAYOUTS[args.layout]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dtype = getattr(torch, args.dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
variants = {"today": tree_attention.paged_attention, "bf16 partials": variant("bf16p", True, None)}
for w in args.warps:
    variants[f"combine warps {w}"] = variant(f"w{w}", False, w)
    variants[f"bf16 partials, warps {w}"] = variant(f"bf16p_w{w}", True, w)
gen = torch.Generator().manual_seed(0)
cache = bs1_cache(L, Hkv, hd, args.bound, max(args.context), args.nodes, dev, dtype)
name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter: outputs only)"
print(f"{name}, layout {args.layout} {str(dtype).removeprefix('torch.')} bs1; graph ms per forward over {L} layers;"
      f" max |out - today's|")
print("| case | context | " + " | ".join(variants) + " |")
print("|---|---|" + "---|" * len(variants))
for ctx in args.context:
    for case, (batch, T) in bs1_cases(cache, ctx, args.nodes, args.bound, gen, dev).items():
        q = torch.randn(1, T, H, hd, generator=gen).to(dev, dtype)
        kw = dict(scale=hd**-0.5, num_splits=args.splits)
        ref = tree_attention.paged_attention(q, cache, 0, batch, **kw).float()
        cells = []
        for attend in variants.values():
            diff = (attend(q, cache, 0, batch, **kw).float() - ref).abs().max().item()
            ms = graph_timed(lambda: [attend(q, cache, layer, batch, **kw) for layer in range(L)], 30, dev)
            cells.append(("-" if ms is None else f"{ms:.3f}") + f" ({diff:.1e})")
        print(f"| {case} | {ctx} | " + " | ".join(cells) + " |", flush=True)
