"""Benchmark: the tree ops, Triton kernel vs PyTorch reference, measured in one run.

For bs in {1, 8, 64} and N in {8, 64, 256} tree slots, with a Llama-3 vocabulary
(V = 128256), times
  - build_tree          parents [bs, N] -> TreeMeta
  - verify_greedy       bf16 logits [bs, N, V]
  - verify_target_only  float32 target probs [bs, N, V]
  - verify_speculative  float32 target and draft probs [bs, N, V]
and prints kernel ms, reference ms, their ratio (reference / kernel; > 1 = kernel faster),
whether both gave identical integer outputs from the same uniforms, and the mean number of
accepted draft tokens. Trees are layered like EAGLE-2 trees: a chain for N = 8, width 8 for
N = 64, width 16 for N = 256. The target puts ~2/3 of its mass on each node's first child,
the draft likewise, so walks go deep (the realistic, expensive case for the kernels).

Times are medians: `triton.testing.do_bench` on CUDA, wall-clock on CPU. The references are
vectorized over the batch and loop over tested children (with one host sync per tested
level), the kernels run one program per request reading vocabulary rows only on its path.
`--quick` runs small sizes, and runs on CPU (Triton interpreted; kernel times are then
meaningless, the run only shows that everything works).

    python examples/bench_ops.py            # on a CUDA machine
    python examples/bench_ops.py --quick    # anywhere
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from specdec.ops import build_tree, verify_greedy, verify_speculative, verify_target_only  # noqa: E402
from specdec.types import Acceptance, TreeMeta  # noqa: E402


def layered_parents(slots: int, width: int) -> list[int]:
    """Layers of `width` nodes, each under a node of the layer above (spread evenly)."""
    parents = [-1]
    for i in range(1, slots):
        layer = (i - 1) // width
        if layer == 0:
            parents.append(0)
        else:
            above = 1 + (layer - 1) * width
            parents.append(above + (i * 7) % width)
    return parents


def depth_of(parents: list[int]) -> int:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return max(depth)


def peaked(batch: int, slots: int, vocab: int, child_tok: torch.Tensor, has_child: torch.Tensor, g, boost: float):
    """softmax(randn + boost at each node's first-child token) in float32, [B, N, V]."""
    logits = torch.randn(batch, slots, vocab, generator=g, device=child_tok.device)
    logits.scatter_add_(2, child_tok[..., None], (has_child * boost).float()[..., None])
    return logits


def timer(device: torch.device, quick: bool):
    if device.type == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")

    def wall(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(3 if quick else 10):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return wall


def same(a, b) -> bool:
    if isinstance(a, Acceptance):
        return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("accept_length", "accept_nodes", "accept_tokens"))
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("packed_mask", "positions", "next_token", "next_sibling", "retrieve_index"))


def run_case(batch: int, slots: int, vocab: int, device: torch.device, bench, rows: list) -> None:
    width = 1 if slots <= 8 else (8 if slots <= 64 else 16)
    plist = layered_parents(slots, width)
    g = torch.Generator(device).manual_seed(batch * 1000 + slots)
    parents = torch.tensor(plist, device=device).expand(batch, slots).contiguous()
    num_nodes = torch.full((batch,), slots, device=device)
    tree = build_tree(parents, num_nodes, impl="torch")
    tokens = torch.randint(0, vocab, (batch, slots), generator=g, device=device)
    first = tree.next_token  # [B, N]
    child_tok = tokens.gather(1, first.clamp(min=0))  # [B, N]
    has_child = first >= 0
    uniforms = torch.rand(batch, slots, 2, generator=g, device=device, dtype=torch.float64)

    logits = peaked(batch, slots, vocab, child_tok, has_child, g, boost=13.0)
    logits_bf16 = logits.to(torch.bfloat16)
    target = logits.softmax(-1)
    del logits
    draft = peaked(batch, slots, vocab, child_tok, has_child, g, boost=13.0).softmax(-1)
    tree_shape = f"w{width} d{depth_of(plist)}"

    cases = {
        "build_tree": lambda impl: build_tree(parents, num_nodes, impl=impl),
        "verify_greedy": lambda impl: verify_greedy(tokens, tree, logits_bf16, impl=impl),
        "verify_target_only": lambda impl: verify_target_only(tokens, tree, target, uniforms=uniforms, impl=impl),
        "verify_speculative": lambda impl: verify_speculative(tokens, tree, target, draft, uniforms=uniforms, impl=impl),
    }
    for name, fn in cases.items():
        ker_out, ref_out = fn("triton"), fn("torch")
        accepted = f"{ref_out.accept_length.float().mean().item():.2f}" if isinstance(ref_out, Acceptance) else "-"
        t_ker = bench(lambda: fn("triton"))
        t_ref = bench(lambda: fn("torch"))
        rows.append((name, batch, slots, vocab if name != "build_tree" else "-", tree_shape, accepted, t_ker, t_ref, same(ker_out, ref_out)))
        print_row(rows[-1])
    del target, draft, logits_bf16
    if device.type == "cuda":
        torch.cuda.empty_cache()


HEADER = f"{'op':<20}{'bs':>4}{'N':>5}{'V':>8}  {'tree':<8}{'accepted':>9}{'kernel ms':>11}{'ref ms':>10}{'ratio':>8}  match"


def print_row(row) -> None:
    name, batch, slots, vocab, shape, accepted, t_ker, t_ref, match = row
    print(f"{name:<20}{batch:>4}{slots:>5}{vocab!s:>8}  {shape:<8}{accepted:>9}{t_ker:>11.3f}{t_ref:>10.3f}{t_ref / t_ker:>8.1f}  {'yes' if match else 'NO'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; runs on CPU (interpreted kernels)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.quick:
        batches, slot_counts, vocab = (1, 4), (8, 40), 1000
    else:
        if device.type != "cuda":
            raise SystemExit("the full benchmark needs a CUDA device; use --quick on CPU")
        batches, slot_counts, vocab = (1, 8, 64), (8, 64, 256), 128256
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (Triton interpreter)"
    print(f"# tree ops on {name}, torch {torch.__version__}")
    print(HEADER)
    rows: list = []
    bench = timer(device, args.quick)
    for slots in slot_counts:
        for batch in batches:
            run_case(batch, slots, vocab, device, bench, rows)
    slower = [r for r in rows if r[6] > r[7]]
    mismatched = [r for r in rows if not r[8]]
    print(f"# {len(rows)} cases; kernel slower than reference in {len(slower)}; outputs differ in {len(mismatched)}")


if __name__ == "__main__":
    main()
